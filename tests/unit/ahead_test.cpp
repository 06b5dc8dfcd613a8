// Promotion ahead of a launch on the fake driver (placement/migration.h, "Promotion ahead"): a kernel
// launch that names demoted memory the policy wants back gets it back before its driver call, with
// the data intact; nothing the launch names makes room; a launch being captured into a graph, a
// stable split, and migrate = "promote" move nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backends/host.h"
#include "host_probe.h"
#include "core/core.h"
#include "core_fixture.h"
#include "fake_driver.h"

namespace allocshim {
namespace {

using fake::FakeDriver;
using fake::FakeOp;
using fake::kMiB;
using testing::must_alloc;

constexpr std::size_t kSize = 24 * kMiB;

policy::Policy budget(const char* migrate) {
  return testing::parsed(
      std::string("[budget]\ndevice = \"64MiB\"\nspill = \"host\"\nmigrate = \"") + migrate +
          "\"\n",
      "ahead.toml");
}

Backend& spill(Core& core) {
  const Backend* b = testing::spill_target(core);
  if (b == nullptr) ADD_FAILURE() << "no spill target";
  return const_cast<Backend&>(b ? *b : core.backend(0));
}

// Where every chunk of [p, p + kSize) lives: 1 device, 0 host.
bool all_at(Core& core, DevPtr p, int where) {
  for (std::size_t off = 0; off < kSize; off += 2 * kMiB)
    if (host_placement(spill(core), p + off) != where) return false;
  return true;
}

// A kernel of two pointer parameters, launched as the hook layer launches it: inside the gate.
class Kernel {
 public:
  explicit Kernel(FakeDriver& fake) { fake.set_param_layout(function(), {{0, 8}, {8, 8}}); }
  static void* function() { return reinterpret_cast<void*>(0x7000); }
  void launch(Core& core, DevPtr x, DevPtr y = 0, Stream stream = kStreamLegacy) const {
    void* params[] = {&x, &y};
    core.submit_enter();
    core.launch_uses(function(), params, nullptr, stream);
    core.submit_leave();
  }
};

void fill(FakeDriver& fake, DevPtr p, std::uint32_t seed) {
  std::vector<std::uint32_t> words(kSize / 4);
  for (std::size_t i = 0; i < words.size(); ++i)
    words[i] = seed ^ static_cast<std::uint32_t>(i * 2654435761u);
  ASSERT_EQ(fake.driver().memcpy_htod(p, words.data(), kSize), res::ok);
}

bool intact(FakeDriver& fake, DevPtr p, std::uint32_t seed) {
  std::vector<std::uint32_t> words(kSize / 4);
  if (fake.driver().memcpy_dtoh(words.data(), p, kSize) != res::ok) return false;
  for (std::size_t i = 0; i < words.size(); ++i)
    if (words[i] != (seed ^ static_cast<std::uint32_t>(i * 2654435761u))) return false;
  return true;
}

void free_all(Core& core, std::initializer_list<DevPtr> ptrs) {
  for (DevPtr p : ptrs) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
}

// An epoch ends at a safe point (the program synchronized): the rates settle.
void settle(Core& core) {
  core.budget().migration().set_epoch_ns(0);
  core.after_context_sync(core.before_context_sync());
}

// Three allocations of 24 MiB under 64 MiB with migrate = "auto": in an epoch that has ended,
// launches read `hot` once and `cold` twice; the third's allocation then demotes `hot`, the less
// dense of the two (both less dense than the newcomer would not be).
class AheadOverThree : public ::testing::Test {
 protected:
  AheadOverThree() {
    kernel.launch(core, hot);
    kernel.launch(core, cold);
    kernel.launch(core, cold);
    settle(core);
  }
  void demote_hot() {
    third = must_alloc(core, kSize);
    EXPECT_TRUE(all_at(core, hot, 0));
  }
  FakeDriver fake;
  Kernel kernel{fake};
  Core core{fake.driver(), budget("auto")};
  const DevPtr hot = must_alloc(core, kSize), cold = must_alloc(core, kSize);
  DevPtr third = 0;
};

TEST_F(AheadOverThree, ALaunchThatNamesDemotedMemoryGetsItBackBeforeItsDriverCall) {
  fill(fake, hot, 0x407);
  demote_hot();
  // A launch reads `hot` again, with no synchronization since: no safe point.
  kernel.launch(core, hot + 64);
  EXPECT_TRUE(all_at(core, hot, 1)) << "the launch would read host memory";
  EXPECT_TRUE(intact(fake, hot, 0x407));
  EXPECT_TRUE(all_at(core, third, 0)) << "what no launch used made room";
  EXPECT_TRUE(all_at(core, cold, 1));
  const Migration::Counts c = core.budget().migration().counts();
  EXPECT_EQ(c.ahead, 1u);
  EXPECT_EQ(c.ahead_bytes, kSize);
  EXPECT_EQ(c.rebalances, 0u) << "no safe point was reached";
  free_all(core, {hot, cold, third});
}

// A kernel launched again with the same parameters skips the scan it made before in the same
// epoch; memory that moved since must still be seen, or the launch would read it over the link.
TEST_F(AheadOverThree, ALaunchRepeatedAfterItsMemoryMovedStillGetsItBack) {
  kernel.launch(core, hot + 64);
  kernel.launch(core, hot + 64);  // a repeat of the launch before
  fill(fake, hot, 0x51);
  {
    // Moved by the mechanism under the closed gate, as another process's request would: the set
    // of movable allocations stays the same. The mechanism accounts for nothing: the room goes
    // back here, as migration's ledger would give it.
    GateClosed closed(core.budget().migration().gate(), 1'000'000'000);
    ASSERT_TRUE(closed.ok());
    ASSERT_EQ(spill(core).movable()->demote(0, {hot}, kSize).bytes, kSize);
    core.budget().unclaim(0, kSize);
  }
  ASSERT_TRUE(all_at(core, hot, 0));
  kernel.launch(core, hot + 64);
  EXPECT_TRUE(all_at(core, hot, 1)) << "the repeated launch would read host memory";
  EXPECT_TRUE(intact(fake, hot, 0x51));
  EXPECT_EQ(core.budget().migration().counts().ahead, 1u);
  free_all(core, {hot, cold});
}

TEST(Ahead, NothingTheLaunchNamesMakesRoomForTheRest) {
  FakeDriver fake;
  Kernel kernel(fake);
  Core core(fake.driver(), budget("auto"));
  const DevPtr hot = must_alloc(core, kSize);
  const DevPtr read_too = must_alloc(core, kSize);
  kernel.launch(core, hot);
  settle(core);
  kernel.launch(core, read_too);  // in this epoch: as dense as the newcomer, so it stays
  const DevPtr later = must_alloc(core, kSize);  // demotes `hot`
  ASSERT_TRUE(all_at(core, hot, 0));
  kernel.launch(core, later);
  // `read_too` is now the coldest on the device (the older of two alike), but this launch reads it.
  kernel.launch(core, hot, read_too);
  EXPECT_TRUE(all_at(core, hot, 1));
  EXPECT_TRUE(all_at(core, read_too, 1)) << "demoted what the same launch reads";
  EXPECT_TRUE(all_at(core, later, 0));
  free_all(core, {hot, read_too, later});
}

TEST_F(AheadOverThree, APromotionAheadWaitsForAnotherThreadsSubmissionInsideTheGate) {
  core.budget().migration().set_close_timeout_ns(60'000'000'000);  // however slow this machine is
  demote_hot();
  const std::uint64_t copies = fake.calls(FakeOp::memcpy_dtod);
  std::atomic<bool> inside{false}, leave{false};
  std::thread other([&] {
    core.submit_enter();  // another thread's launch in flight
    inside = true;
    while (!leave.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    core.submit_leave();
  });
  while (!inside.load()) std::this_thread::yield();
  std::atomic<bool> launched{false};
  std::thread launcher([&] {
    kernel.launch(core, hot);
    launched = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(fake.calls(FakeOp::memcpy_dtod), copies)
      << "a piece moved under another thread's submission";
  EXPECT_FALSE(launched.load());
  leave = true;
  other.join();
  launcher.join();
  EXPECT_TRUE(all_at(core, hot, 1));
  free_all(core, {hot, cold, third});
}

TEST_F(AheadOverThree, ALaunchBeingCapturedIntoAGraphMovesNothing) {
  demote_hot();
  // The fake has no graphs: a failed query stands for a stream being captured.
  fake.fail_next(FakeOp::stream_is_capturing, res::invalid_value);
  const std::uint64_t syncs = fake.calls(FakeOp::ctx_synchronize);
  kernel.launch(core, hot);
  EXPECT_TRUE(all_at(core, hot, 0));
  EXPECT_EQ(fake.calls(FakeOp::ctx_synchronize), syncs)
      << "a synchronization would break the capture";
  EXPECT_EQ(core.budget().migration().counts().ahead, 0u);
  fake.clear_failures();
  free_all(core, {hot, cold, third});
}

TEST_F(AheadOverThree, AStableSplitIsAskedAboutOncePerEpochAndKept) {
  Migration& m = core.budget().migration();
  demote_hot();
  // A cycle that uses all three alike, many launches per epoch, each epoch ending at a safe point.
  // Its first epoch may swap `hot` with `third` (new: no rate yet); after that, what is on the
  // host is no denser than what it would displace, so it stays, and each epoch asks once.
  auto epoch = [&] {
    for (int i = 0; i < 10; ++i)
      for (DevPtr p : {hot, cold, third}) kernel.launch(core, p);
    settle(core);
  };
  epoch();
  const Migration::Counts before = m.counts();
  const std::uint64_t moved = core.budget().device_report(0).demoted_bytes;
  for (int i = 0; i < 4; ++i) epoch();
  const Migration::Counts c = m.counts();
  EXPECT_EQ(c.ahead, before.ahead);
  EXPECT_EQ(c.ahead_declined - before.ahead_declined, 4u) << "once per epoch, not once per launch";
  EXPECT_EQ(core.budget().device_report(0).demoted_bytes, moved)
      << "a cycle that uses everything thrashed";
  free_all(core, {hot, cold, third});
}

TEST(Ahead, ASafePointPromotesMoreTheLongerTheProgramWaitedThere) {
  EXPECT_EQ(Migration::promote_bound(0), Migration::kPromotePerPoint) << "idle";
  EXPECT_EQ(Migration::promote_bound(Migration::kBusyWaitNs), Migration::kPromotePerPoint);
  EXPECT_EQ(Migration::promote_bound(1'000'000'000),
            1'000'000'000 * Migration::kPromoteBytesPerWaitNs);
  EXPECT_FALSE(Migration::busy(Migration::kBusyWaitNs - 1));
}

TEST(Ahead, MigratePromoteOnlyWaitsForSafePoints) {
  FakeDriver fake;
  Kernel kernel(fake);
  Core core(fake.driver(), budget("promote"));
  const DevPtr a = must_alloc(core, 48 * kMiB);
  const DevPtr b = must_alloc(core, 48 * kMiB);  // 32 MiB of it on the host
  kernel.launch(core, b);
  const Migration::Counts c = core.budget().migration().counts();
  EXPECT_EQ(c.ahead + c.ahead_declined, 0u);
  EXPECT_EQ(fake.calls(FakeOp::stream_is_capturing), 0u) << "a driver call for nothing";
  EXPECT_EQ(core.budget().device_report(0).promoted_bytes, 0u);
  free_all(core, {a, b});
}

}  // namespace
}  // namespace allocshim
