// Pinning ahead ([backends.host] pin_ahead; docs/design/oversubscription.md, "Pinning ahead") on the fake
// driver: the spill target's pinner thread makes host pieces before a demotion needs them, within
// the host reserve's bound, gives them back when the host runs short or a cuMemCreate is refused,
// and is joined (its pieces released) at a context reset and at exit; a forked child forgets it.
// Waits below poll the counters with a generous deadline: nothing asserts how long anything took.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/host.h"
#include "host_probe.h"
#include "backends/host_pinner.h"
#include "core/core.h"
#include "core_fixture.h"
#include "fake_driver.h"
#include "fake_test_util.h"
#include "fork_child.h"

namespace allocshim {
namespace {

using fake::testing::fill;
using fake::testing::verify;
using testing::must_alloc;

// The host's memory as the tests set it: plenty unless a test makes it short.
std::atomic<std::uint64_t> g_available{std::uint64_t{64} << 30};
constexpr std::uint64_t kTotal = std::uint64_t{128} << 30;
bool probe(std::uint64_t* available, std::uint64_t* total) {
  *available = g_available.load();
  *total = kTotal;
  return true;
}

policy::Policy policy(const char* device, const char* reserve, unsigned idle_ms = 30000) {
  return testing::parsed(std::string("[budget]\ndevice = \"") + device +
                             "\"\nspill = \"host\"\nmigrate = \"auto\"\n[backends.host]\n"
                             "pin_ahead = true\nhost_reserve = \"" +
                             reserve + "\"\npin_ahead_idle_ms = " + std::to_string(idle_ms) + "\n",
                         "pin_ahead.toml");
}

Backend& spill(Core& core) { return const_cast<Backend&>(*testing::spill_target(core)); }

// Waits until `done` holds, for at most 20 s (a deadline, not a measurement).
bool eventually(const std::function<bool()>& done) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Holds the pinner (any thread but the test's) inside cuMemCreate until released.
class PinnerHeld {
 public:
  explicit PinnerHeld(FakeDriver& fake) : fake_(fake) {
    fake.on_call(FakeOp::mem_create, [this, main = std::this_thread::get_id()] {
      if (std::this_thread::get_id() == main) return;
      std::unique_lock lock(m_);
      entered_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return go_; });
    });
  }
  ~PinnerHeld() { fake_.on_call(FakeOp::mem_create, nullptr); }
  PinnerHeld(const PinnerHeld&) = delete;
  PinnerHeld& operator=(const PinnerHeld&) = delete;
  // Whether the pinner got inside cuMemCreate.
  bool entered() {
    std::unique_lock lock(m_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return entered_; });
  }
  // Runs `f`, which must wait for the pinner, and lets the pinner go a moment after it started.
  void release_while(const std::function<void()>& f) {
    std::thread release([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::lock_guard lock(m_);
      go_ = true;
      cv_.notify_all();
    });
    f();
    release.join();
    fake_.on_call(FakeOp::mem_create, nullptr);
  }

 private:
  FakeDriver& fake_;
  std::mutex m_;
  std::condition_variable cv_;
  bool entered_ = false, go_ = false;
};

class PinAhead : public ::testing::Test {
 protected:
  void SetUp() override { g_available = std::uint64_t{64} << 30; }
  // A core whose spill target reads the host's memory from probe(), made on first use of the
  // spill target (the policy builds it with the core).
  std::unique_ptr<Core> make(const policy::Policy& p) {
    auto core = std::make_unique<Core>(fake.driver(), p);
    set_host_memory_probe(spill(*core), probe);
    return core;
  }
  Budget::DeviceReport report(const Core& core) const { return core.budget().device_report(0); }

  FakeDriver fake{[] {
    FakeConfig c;
    c.strict_access = true;
    return c;
  }()};
};

// 128 MiB of a 256 MiB budget, then 64 MiB: 64 MiB of room is less than the largest allocation, so
// a demotion is near. The pinner makes the host pieces of the oldest allocation's two pieces.
TEST_F(PinAhead, ADemotionAfterThePinnerRanTakesItsPiecesAndPinsNothingOnTheCaller) {
  auto core = make(policy("256MiB", "256MiB"));
  const DevPtr a = must_alloc(*core, 128 * kMiB);
  fill(fake.driver(), a, 128 * kMiB, 1);
  EXPECT_EQ(report(*core).ahead_pinned, 0u) << "room enough: nothing pinned ahead";
  const DevPtr b = must_alloc(*core, 64 * kMiB);
  ASSERT_TRUE(eventually([&] { return report(*core).ahead_bytes == 128 * kMiB; }))
      << core->summary();
  EXPECT_TRUE(host_pinner_running(spill(*core)));
  EXPECT_EQ(fake.host_used(), 128 * kMiB) << "two 64 MiB host pieces, nothing else";

  const DevPtr c = must_alloc(*core, 128 * kMiB);  // 64 MiB short: `a` is demoted
  Budget::DeviceReport r = report(*core);
  EXPECT_GE(r.demoted_bytes, 64 * kMiB);
  EXPECT_EQ(r.reserve_misses, 0u) << "no host piece was pinned on the calling thread";
  EXPECT_EQ(r.ahead_used * 64 * kMiB, r.demoted_bytes)
      << "every demoted piece came from the pinner";
  EXPECT_TRUE(verify(fake.driver(), a, 128 * kMiB, 1)) << "same address, same bytes";
  EXPECT_NE(core->summary().find("pinned ahead: "), std::string::npos) << core->summary();
  EXPECT_NE(core->stats_json().find("\"ahead_pinned\":"), std::string::npos);
  for (DevPtr p : {a, b, c}) ASSERT_EQ(core->free(p, FreeRequest{}), res::ok);
  core.reset();  // joins the pinner
  EXPECT_EQ(fake.live_handles(), 0u) << "nothing pinned ahead outlives the memory it was for";
}

TEST_F(PinAhead, NeverHoldsMoreThanTheReservesBound) {
  auto core = make(policy("256MiB", "64MiB"));
  const DevPtr a = must_alloc(*core, 128 * kMiB);
  const DevPtr b = must_alloc(*core, 64 * kMiB);  // a demotion near: 128 MiB would be wanted
  ASSERT_TRUE(eventually([&] { return report(*core).ahead_pinned == 1; }));
  DevPtr more[4];
  for (DevPtr& p : more) p = must_alloc(*core, 2 * kMiB);  // more passes, nothing more pinned
  for (DevPtr p : more) ASSERT_EQ(core->free(p, FreeRequest{}), res::ok);
  for (DevPtr p : {a, b}) ASSERT_EQ(core->free(p, FreeRequest{}), res::ok);
  const Budget::DeviceReport r = report(*core);
  core.reset();
  EXPECT_EQ(r.ahead_peak, 64 * kMiB);
  EXPECT_EQ(r.ahead_pinned, 1u);
  EXPECT_EQ(fake.live_handles(), 0u);
}

TEST_F(PinAhead, WithoutTheSettingNothingIsPinnedAheadAndNoThreadStarts) {
  auto core = make(
      testing::parsed("[budget]\ndevice = \"256MiB\"\nspill = \"host\"\nmigrate = \"auto\"\n"));
  const DevPtr a = must_alloc(*core, 128 * kMiB);
  const DevPtr b = must_alloc(*core, 64 * kMiB);
  EXPECT_FALSE(host_pinner_running(spill(*core)));
  EXPECT_EQ(fake.host_used(), 0u);
  for (DevPtr p : {a, b}) ASSERT_EQ(core->free(p, FreeRequest{}), res::ok);
}

// pin_ahead switched off by a reload while an allocation of the spill target runs, then on again:
// the pinner still pins. The allocation began counted (the pinner yields to it) and must uncount
// itself whatever the setting says when it returns: a count left behind would make the pinner
// yield for good.
TEST_F(PinAhead, AReloadDuringAnAllocationLeavesThePinnerFreeToPinLater) {
  const policy::Policy on = policy("256MiB", "256MiB");
  const policy::Policy off = testing::parsed(
      "[budget]\ndevice = \"256MiB\"\nspill = \"host\"\nmigrate = \"auto\"\n[backends.host]\n"
      "host_reserve = \"256MiB\"\n");
  auto core = make(on);
  Budget& budget = core->budget();
  Backend* target = &spill(*core);
  // What a reload does (Core::install), from inside the allocation's first cuMemCreate (its first
  // device piece).
  const auto install = [&](const policy::Policy& p) {
    budget.configure(p.budget, target);
    configure_spill(*target, p.host_side(), budget.migrate());
  };
  bool reloaded = false;
  fake.on_call(FakeOp::mem_create, [&] {
    if (!reloaded) install(off);
    reloaded = true;
  });
  const DevPtr a = must_alloc(*core, 128 * kMiB);
  fake.on_call(FakeOp::mem_create, nullptr);
  ASSERT_TRUE(reloaded);
  EXPECT_FALSE(host_pins_ahead(*target));
  install(on);
  ASSERT_TRUE(host_pins_ahead(*target));
  const DevPtr b = must_alloc(*core, 64 * kMiB);  // a demotion near: the pinner is asked for a pass
  ASSERT_TRUE(eventually([&] { return report(*core).ahead_bytes == 128 * kMiB; }))
      << core->summary();
  for (DevPtr p : {a, b}) ASSERT_EQ(core->free(p, FreeRequest{}), res::ok);
  core.reset();
  EXPECT_EQ(fake.live_handles(), 0u);
}

// Many allocations of mixed sizes: the pinner pins the device pieces of the oldest ones, one a
// pass, in allocation order, until they cover the largest allocation: what a sort of every
// allocation by age chooses, whatever their addresses.
TEST_F(PinAhead, AmongManyAllocationsItPinsTheOldestPiecesInOrder) {
  auto core = make(policy("1GiB", "1GiB"));
  // What the host held each time the pinner began a piece: the running sum of those it pinned.
  std::mutex m;
  std::vector<std::size_t> before;
  fake.on_call(FakeOp::mem_create, [&, main = std::this_thread::get_id()] {
    if (std::this_thread::get_id() == main) return;
    std::lock_guard lock(m);
    before.push_back(fake.host_used());
  });
  // 150 allocations of 2, 4 or 6 MiB (one device piece each), then one of 200 MiB (pieces of
  // 64, 64, 64 and 8 MiB) that leaves less room than a quarter of the budget: a demotion is near.
  std::vector<std::size_t> pieces;  // every device piece, oldest allocation first
  std::vector<DevPtr> ptrs;
  for (int i = 0; i < 150; ++i) {
    const std::size_t bytes = std::size_t(2 + 2 * ((i * i + 3 * i / 7) % 3)) * kMiB;
    pieces.push_back(bytes);
    ptrs.push_back(must_alloc(*core, bytes));
  }
  constexpr std::size_t kLargest = 200 * kMiB;
  for (std::size_t p : {64, 64, 64, 8}) pieces.push_back(p * kMiB);
  ptrs.push_back(must_alloc(*core, kLargest));
  ASSERT_EQ(fake.host_used(), 0u) << "everything fits on the device";
  // The oldest pieces until they cover the largest allocation (the reserve's bound is higher).
  std::vector<std::size_t> want_before;
  std::size_t want = 0;
  for (std::size_t i = 0; want < kLargest; ++i) {
    want_before.push_back(want);
    want += pieces[i];
  }
  ASSERT_TRUE(eventually([&] { return report(*core).ahead_bytes == want; })) << core->summary();
  fake.on_call(FakeOp::mem_create, nullptr);
  EXPECT_EQ(report(*core).ahead_pinned, want_before.size());
  {
    std::lock_guard lock(m);
    EXPECT_EQ(before, want_before) << "pinned in allocation order, the oldest first";
  }
  for (DevPtr p : ptrs) ASSERT_EQ(core->free(p, FreeRequest{}), res::ok);
  core.reset();
  EXPECT_EQ(fake.live_handles(), 0u);
}

// The host short of memory (MemAvailable under an eighth of MemTotal): what was pinned ahead goes
// back at the pinner's next pass, and nothing more is pinned.
TEST_F(PinAhead, GivesItsPiecesBackWhenTheHostRunsShort) {
  auto core = make(policy("256MiB", "256MiB"));
  const DevPtr a = must_alloc(*core, 128 * kMiB);
  const DevPtr b = must_alloc(*core, 64 * kMiB);
  ASSERT_TRUE(eventually([&] { return report(*core).ahead_bytes == 128 * kMiB; }));
  g_available = kTotal / 16;
  const DevPtr c = must_alloc(*core, 2 * kMiB);  // the slow path: a pass looks at the host again
  ASSERT_TRUE(eventually([&] { return report(*core).ahead_returned == 2; })) << core->summary();
  EXPECT_EQ(report(*core).ahead_bytes, 0u);
  EXPECT_EQ(fake.host_used(), 0u);
  for (DevPtr p : {a, b, c}) ASSERT_EQ(core->free(p, FreeRequest{}), res::ok);
}

// The same with no allocation after the host ran short: the pinner looks at the host's memory
// on its own while it holds pieces.
TEST_F(PinAhead, NoticesTheHostRunningShortWithoutAnAllocation) {
  auto core = make(policy("256MiB", "256MiB"));
  const DevPtr a = must_alloc(*core, 128 * kMiB);
  const DevPtr b = must_alloc(*core, 64 * kMiB);
  ASSERT_TRUE(eventually([&] { return report(*core).ahead_bytes == 128 * kMiB; }));
  g_available = kTotal / 16;
  ASSERT_TRUE(eventually([&] { return report(*core).ahead_returned == 2; })) << core->summary();
  EXPECT_EQ(fake.host_used(), 0u);
  for (DevPtr p : {a, b}) ASSERT_EQ(core->free(p, FreeRequest{}), res::ok);
}

// A cuMemCreate the driver refuses on the pinner's thread: the host is short, what it pinned goes.
TEST_F(PinAhead, GivesItsPiecesBackWhenPinningFails) {
  auto core = make(policy("256MiB", "256MiB"));
  const DevPtr a = must_alloc(*core, 128 * kMiB);
  // b's one device piece is made on this thread, the pinner's first piece next; its second fails.
  fake.fail_next(FakeOp::mem_create, res::out_of_memory, 1, 2);
  const DevPtr b = must_alloc(*core, 64 * kMiB);
  ASSERT_TRUE(eventually([&] { return report(*core).ahead_returned == 1; })) << core->summary();
  const Budget::DeviceReport r = report(*core);
  EXPECT_EQ(r.ahead_pinned, 1u);
  EXPECT_EQ(r.ahead_bytes, 0u);
  EXPECT_EQ(fake.host_used(), 0u);
  for (DevPtr p : {a, b}) ASSERT_EQ(core->free(p, FreeRequest{}), res::ok);
}

// Pieces no demotion took for pin_ahead_idle_ms go back (a program that never demotes keeps
// nothing pinned), and none are made again before a demotion.
TEST_F(PinAhead, GivesItsPiecesBackWhenNoDemotionTakesThem) {
  auto core = make(policy("256MiB", "256MiB", 1));
  const DevPtr a = must_alloc(*core, 128 * kMiB);
  const DevPtr b = must_alloc(*core, 64 * kMiB);
  ASSERT_TRUE(eventually([&] {
    const Budget::DeviceReport r = report(*core);
    return r.ahead_pinned > 0 && r.ahead_returned == r.ahead_pinned;
  })) << core->summary();
  EXPECT_EQ(fake.host_used(), 0u);
  for (DevPtr p : {a, b}) ASSERT_EQ(core->free(p, FreeRequest{}), res::ok);
}

// The pinner held inside cuMemCreate while the program resets the context: the reset joins it
// (the piece it was making is kept, then released with everything else) and nothing leaks.
TEST_F(PinAhead, AResetWithThePinnerMidWorkJoinsItAndReleasesEverything) {
  auto core = make(policy("256MiB", "256MiB"));
  PinnerHeld held(fake);
  const DevPtr a = must_alloc(*core, 128 * kMiB);
  must_alloc(*core, 64 * kMiB);
  ASSERT_TRUE(held.entered());
  // Released once the reset is under way (the reset waits for the pinner, so it must come after).
  held.release_while([&] { core->on_primary_reset(0); });
  EXPECT_FALSE(host_pinner_running(spill(*core))) << "joined by the reset";
  EXPECT_EQ(fake.live_handles(), 0u) << "the device's memory and every piece pinned ahead released";
  const Budget::DeviceReport r = report(*core);
  EXPECT_EQ(r.ahead_bytes, 0u);
  EXPECT_EQ(r.ahead_pinned, r.ahead_returned);
  (void)a;
}

// What the exit handler does, with the pinner mid-work: it is joined, its pieces released, and
// it never starts again.
TEST_F(PinAhead, ExitWithThePinnerMidWorkJoinsItAndReleasesItsPieces) {
  auto core = make(policy("256MiB", "256MiB"));
  PinnerHeld held(fake);
  const DevPtr a = must_alloc(*core, 128 * kMiB);
  const DevPtr b = must_alloc(*core, 64 * kMiB);
  const std::size_t handles = fake.live_handles();
  ASSERT_TRUE(held.entered());
  held.release_while([] { host_detail::Pinner::close_all(); });
  EXPECT_FALSE(host_pinner_running(spill(*core)));
  EXPECT_EQ(fake.live_handles(), handles) << "the program's memory only";
  EXPECT_EQ(report(*core).ahead_bytes, 0u);
  const DevPtr c = must_alloc(*core, 2 * kMiB);  // a kick after exit starts nothing
  EXPECT_FALSE(host_pinner_running(spill(*core)));
  for (DevPtr p : {a, b, c}) ASSERT_EQ(core->free(p, FreeRequest{}), res::ok);
}

// A forked child has no pinner thread, and its exit must not wait for one or touch the parent's
// pieces: it forgets every pinner of the parent.
TEST_F(PinAhead, AForkedChildForgetsTheParentsPinner) {
  auto core = make(policy("256MiB", "256MiB"));
  const DevPtr a = must_alloc(*core, 128 * kMiB);
  const DevPtr b = must_alloc(*core, 64 * kMiB);
  ASSERT_TRUE(eventually([&] { return report(*core).ahead_bytes == 128 * kMiB; }));
  ASSERT_GE(host_detail::Pinner::registered(), 1);
  const pid_t pid = testing::fork_child([] {
    if (host_detail::Pinner::registered() != 0) return 1;
    host_detail::Pinner::close_all();  // what exit runs: returns at once
    return 0;
  });
  EXPECT_EQ(testing::wait_child(pid), 0);
  EXPECT_EQ(report(*core).ahead_bytes, 128 * kMiB) << "the parent's pieces are still the parent's";
  EXPECT_TRUE(host_pinner_running(spill(*core)));
  for (DevPtr p : {a, b}) ASSERT_EQ(core->free(p, FreeRequest{}), res::ok);
}

}  // namespace
}  // namespace allocshim
