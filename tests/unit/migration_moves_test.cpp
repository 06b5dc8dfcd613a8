// Migration's moves through the mechanism, accounted with its ledger (placement/migration_moves.cpp):
// the mechanism moves into no more room than the ledger gave, what it did not take goes back, and
// every move and refusal reaches the ledger. A stand-in mechanism and ledger, so that what the
// policy does is all that is measured.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "fake_driver.h"
#include "placement/migration.h"

namespace allocshim {
namespace {

using fake::FakeDriver;
using fake::kMiB;

// Allocations of pieces, each on the device or the host; refuses the move after `fail_after`.
class PieceMover final : public Movable {
 public:
  struct Alloc {
    std::vector<std::size_t> pieces;
    std::vector<bool> on_device;
  };
  std::map<DevPtr, Alloc> allocs;
  std::size_t fail_after = SIZE_MAX;  // moves allowed before a refusal

  void add(DevPtr base, std::vector<std::size_t> pieces, bool on_device) {
    allocs[base] = Alloc{pieces, std::vector<bool>(pieces.size(), on_device)};
  }
  void movable(int, std::vector<MovableAllocation>& out) const override {
    for (const auto& [base, a] : allocs) {
      MovableAllocation m;
      m.base = base;
      for (std::size_t i = 0; i < a.pieces.size(); ++i)
        (a.on_device[i] ? m.device_bytes : m.host_bytes) += a.pieces[i];
      out.push_back(m);
    }
  }
  std::size_t bytes(bool device) const {
    std::size_t n = 0;
    for (const auto& [base, a] : allocs)
      for (std::size_t i = 0; i < a.pieces.size(); ++i)
        if (a.on_device[i] == device) n += a.pieces[i];
    return n;
  }
  std::size_t host_bytes(int) const override { return bytes(false); }
  std::size_t device_bytes(int) const override { return bytes(true); }
  Moves promote(int, const std::vector<DevPtr>& bases, std::size_t max_bytes,
                const Room& room) override {
    return move(bases, max_bytes, true, &room);
  }
  Moves demote(int, const std::vector<DevPtr>& bases, std::size_t want_bytes) override {
    return move(bases, want_bytes, false, nullptr);
  }
  void expect_demotion(int, std::size_t) override {}
  std::size_t host_spare(int) const override { return 0; }
  std::size_t host_reserve() const override { return 0; }
  std::size_t give_host(int, std::size_t, std::vector<Given>&) override { return 0; }
  bool adopt_host(int, std::size_t, int) override { return false; }

 private:
  // Promotion moves while the next piece fits `bound` and `room`; demotion until `bound` moved.
  Moves move(const std::vector<DevPtr>& bases, std::size_t bound, bool to_device,
             const Room* room) {
    Moves m;
    for (DevPtr base : bases) {
      Alloc& a = allocs.at(base);
      std::size_t offset = 0;
      for (std::size_t i = 0; i < a.pieces.size(); offset += a.pieces[i], ++i) {
        if (a.on_device[i] == to_device) continue;
        if (to_device ? m.bytes + a.pieces[i] > bound || !(*room)(a.pieces[i]) : m.bytes >= bound)
          return m;
        if (fail_after == 0) {
          m.failed = res::out_of_memory;
          return m;
        }
        --fail_after;
        a.on_device[i] = to_device;
        m.pieces.push_back({base + offset, a.pieces[i], 1});
        m.bytes += a.pieces[i];
      }
    }
    return m;
  }
};

// Gives promotions `room` bytes in all and keeps what it was told.
struct CountingLedger final : MoveLedger {
  std::size_t room = SIZE_MAX;
  std::size_t claimed = 0;  // claims not yet given back
  std::size_t promoted = 0, demoted = 0, moves = 0, failures = 0;
  std::size_t claim_promotion(int, std::size_t bytes) override {
    const std::size_t got = std::min(bytes, room);
    room -= got;
    claimed += got;
    return got;
  }
  void release_device(int, std::size_t bytes) override {
    ASSERT_LE(bytes, claimed) << "gave back more than was claimed";
    claimed -= bytes;
  }
  void on_moved(int, DevPtr, std::size_t bytes, bool to_device, std::uint64_t) override {
    (to_device ? promoted : demoted) += bytes;
    ++moves;
  }
  void on_move_failed(int, Result) override { ++failures; }
};

class MigrationMoves : public ::testing::Test {
 protected:
  FakeDriver fake;
  CountingLedger ledger;
  PieceMover mover;
  Migration migration{fake.driver(), ledger};
  void SetUp() override { migration.configure(&mover, policy::Budget::Migrate::auto_); }
};

TEST_F(MigrationMoves, APromotionTakesOnlyTheRoomTheLedgerGaveAndGivesBackTheRest) {
  mover.add(0x100000, {4 * kMiB, 4 * kMiB, 4 * kMiB}, false);
  ledger.room = 10 * kMiB;  // the third piece gets 2 MiB of the 4 it needs: it stays
  EXPECT_EQ(migration.promote(0, 64 * kMiB), 8 * kMiB);
  EXPECT_EQ(ledger.claimed, 8 * kMiB) << "the 2 MiB nothing moved into stayed claimed";
  EXPECT_EQ(ledger.promoted, 8 * kMiB);
  EXPECT_EQ(ledger.moves, 2u);
  EXPECT_EQ(ledger.failures, 0u);
  EXPECT_EQ(mover.bytes(false), 4 * kMiB);
}

TEST_F(MigrationMoves, APromotionClaimsOnlyWhatItMoves) {
  mover.add(0x100000, {2 * kMiB, 2 * kMiB, 2 * kMiB}, false);
  EXPECT_EQ(migration.promote(0, 5 * kMiB), 4 * kMiB);
  EXPECT_EQ(ledger.claimed, 4 * kMiB);
  EXPECT_EQ(ledger.room, SIZE_MAX - 4 * kMiB) << "room claimed for a piece that did not fit";
}

TEST_F(MigrationMoves, NoRoomMovesNothing) {
  mover.add(0x100000, {2 * kMiB}, false);
  ledger.room = 0;
  EXPECT_EQ(migration.promote(0, 64 * kMiB), 0u);
  EXPECT_EQ(mover.bytes(false), 2 * kMiB);
  EXPECT_EQ(ledger.moves, 0u);
}

TEST_F(MigrationMoves, ARefusalIsReportedAndItsRoomGivenBack) {
  mover.add(0x100000, {2 * kMiB, 2 * kMiB, 2 * kMiB}, false);
  mover.fail_after = 1;
  EXPECT_EQ(migration.promote(0, 64 * kMiB), 2 * kMiB);
  EXPECT_EQ(ledger.claimed, 2 * kMiB);
  EXPECT_EQ(ledger.failures, 1u);
  EXPECT_EQ(ledger.moves, 1u);
}

TEST_F(MigrationMoves, ADemotionGivesBackTheRoomOfWhatItMoved) {
  mover.add(0x100000, {2 * kMiB, 2 * kMiB, 2 * kMiB}, true);
  ledger.claimed = 6 * kMiB;  // what the core claimed when it placed them
  EXPECT_EQ(migration.demote(0, 3 * kMiB), 4 * kMiB);
  EXPECT_EQ(ledger.claimed, 2 * kMiB);
  EXPECT_EQ(ledger.demoted, 4 * kMiB);
  EXPECT_EQ(ledger.moves, 2u);
  mover.fail_after = 0;
  EXPECT_EQ(migration.demote(0, 2 * kMiB), 0u);
  EXPECT_EQ(ledger.failures, 1u);
  EXPECT_EQ(ledger.claimed, 2 * kMiB);
}

}  // namespace
}  // namespace allocshim
