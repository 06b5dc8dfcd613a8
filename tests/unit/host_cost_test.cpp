// What reading host memory costs, on the fake driver (placement/host_cost.h): a launch that names
// host-resident memory is timed between two events on its stream, the time is kept as the cost of
// what it read there, and placement weighs uses by that cost, both ways. A launch that failed or is
// being captured into a graph gives no sample, and no event outlives its sample.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "backends/host.h"
#include "core/core.h"
#include "core_fixture.h"
#include "fake_driver.h"

namespace allocshim {
namespace {

using fake::FakeDriver;
using fake::FakeOp;
using fake::kMiB;
using testing::must_alloc;

constexpr std::size_t kBig = 64 * kMiB, kSmall = 40 * kMiB;

// A kernel of one pointer parameter, launched as abi/hooks.cpp launches it: inside the gate,
// its end recorded when the core timed it, the kernel taking `ns` on the fake's clock.
class Kernel {
 public:
  explicit Kernel(FakeDriver& fake, void* function = reinterpret_cast<void*>(0x7100))
      : fake_(fake), function_(function) {
    fake.set_param_layout(function_, {{0, 8}});
  }
  void* function() const { return function_; }
  void launch(Core& core, DevPtr x, std::uint64_t ns = 0, bool launched = true,
              Stream stream = kStreamLegacy) const {
    void* params[] = {&x};
    core.submit_enter();
    const std::uint32_t timing = core.launch_uses(function(), params, nullptr, stream);
    fake_.advance_clock(ns);
    if (timing != 0) core.launch_done(timing, stream, launched);
    core.submit_leave();
  }

 private:
  FakeDriver& fake_;
  void* function_;
};

// An epoch ends at a safe point (the program synchronized).
void settle(Core& core) {
  core.budget().migration().set_epoch_ns(0);
  core.after_context_sync(core.before_context_sync());
}

// The use record the spill target keeps for `base` (what a trial's verdict and a swap mark).
UseRecord* record(Core& core, DevPtr base) {
  std::vector<MovableAllocation> v;
  const_cast<Backend*>(testing::spill_target(core))->movable()->movable(0, v);
  for (const MovableAllocation& a : v)
    if (a.base == base) return const_cast<UseRecord*>(a.use);
  ADD_FAILURE() << "not movable";
  return nullptr;
}

Migration::Listed listed(Core& core, DevPtr base) {
  for (const Migration::Listed& l : core.budget().migration().listing(0))
    if (l.base == base) return l;
  ADD_FAILURE() << "not movable";
  return {};
}

// `big` fills a 64 MiB budget and is used three times in the first epoch; `small`, made after,
// is less used than it and goes to the host whole.
class HostCostTest : public ::testing::Test {
 protected:
  HostCostTest() {
    fake.set_current_device(0);  // as in a program that launches: a context is current
    for (int i = 0; i < 3; ++i) kernel.launch(core, big);
    settle(core);
    small = must_alloc(core, kSmall);
    EXPECT_EQ(listed(core, small).host_bytes, kSmall);
  }
  ~HostCostTest() override {
    if (!reset) {
      EXPECT_EQ(core.free(small, FreeRequest{}), res::ok);
      EXPECT_EQ(core.free(big, FreeRequest{}), res::ok);
    }
    EXPECT_EQ(fake.live_events(), 0u) << "an event outlived its sample";
    EXPECT_EQ(fake.stale_uses(), 0u);
  }
  // One epoch: `big` and `small` each read once, `small`'s launch taking `ns`; then a safe point.
  void epoch(std::uint64_t ns) {
    kernel.launch(core, big);
    kernel.launch(core, small, ns);
    settle(core);
  }
  FakeDriver fake;
  Kernel kernel{fake};
  Core core{fake.driver(),
            testing::parsed("[budget]\ndevice = \"64MiB\"\nspill = \"host\"\nmigrate = \"auto\"\n",
                            "cost.toml")};
  const DevPtr big = must_alloc(core, kBig);
  DevPtr small = 0;
  bool reset = false;  // the device was reset: the allocations went with its context
};

TEST_F(HostCostTest, ALaunchReadingHostMemoryIsTimedAndItsCostKept) {
  constexpr std::uint64_t kNs = 1'000'000;
  kernel.launch(core, small, kNs);
  kernel.launch(core, small, 5 * kNs);  // `small` was timed in this epoch already
  EXPECT_EQ(core.budget().migration().counts().host_cost.timed, 1u);
  EXPECT_EQ(fake.live_events(), 2u);
  settle(core);
  const Migration::Counts c = core.budget().migration().counts();
  EXPECT_EQ(c.host_cost.measured, 1u);
  EXPECT_EQ(c.ahead, 0u) << "the launches' promotion ahead was declined";
  EXPECT_EQ(listed(core, small).cost, HostCost::cost_of(kNs, kSmall));
  EXPECT_EQ(listed(core, big).cost, 0u) << "never read on the host: never timed";
  EXPECT_EQ(fake.live_events(), 0u);
  // The next epoch's first launch of the function is timed again, and the cost moves a quarter
  // of the way.
  kernel.launch(core, small, 9 * kNs);
  settle(core);
  EXPECT_EQ(listed(core, small).cost,
            HostCost::blend(HostCost::cost_of(kNs, kSmall), HostCost::cost_of(9 * kNs, kSmall)));
  EXPECT_EQ(core.budget().migration().counts().host_cost.timed, 2u);
  EXPECT_NE(core.summary().find("2 launches reading host memory timed (2 measured)"),
            std::string::npos)
      << core.summary();
}

// A kernel that writes a buffer cheaply and the kernels that then read it many times over the
// link are all timed, in one epoch: the cost is theirs together, not the first launch's.
TEST_F(HostCostTest, EveryKernelThatNamesABufferOnTheHostIsTimed) {
  Kernel reader(fake, reinterpret_cast<void*>(0x7200));
  kernel.launch(core, small, 1'000'000);
  reader.launch(core, small, 20'000'000);
  reader.launch(core, small, 20'000'000);  // the reader was timed in this epoch already
  settle(core);
  EXPECT_EQ(core.budget().migration().counts().host_cost.timed, 2u);
  EXPECT_EQ(listed(core, small).cost, HostCost::blend(HostCost::cost_of(1'000'000, kSmall),
                                                      HostCost::cost_of(20'000'000, kSmall)));
}

// One kernel reading several host-resident buffers in turn in one epoch: each gets a cost, as
// each allocation's timing is due once per kRetimeEpochs.
TEST_F(HostCostTest, EveryBufferOneKernelReadsInTurnIsTimed) {
  const DevPtr other = must_alloc(core, kSmall);
  ASSERT_EQ(listed(core, other).host_bytes, kSmall);
  kernel.launch(core, small, 1'000'000);
  kernel.launch(core, other, 2'000'000);
  kernel.launch(core, small, 4'000'000);  // both timed in this epoch already
  settle(core);
  EXPECT_EQ(listed(core, small).cost, HostCost::cost_of(1'000'000, kSmall));
  EXPECT_EQ(listed(core, other).cost, HostCost::cost_of(2'000'000, kSmall));
  EXPECT_EQ(core.budget().migration().counts().host_cost.timed, 2u);
  EXPECT_EQ(core.free(other, FreeRequest{}), res::ok);
}

// With the same uses, `small` is denser per byte than `big` but not by the swap factor: the
// counts alone leave it on the host. Timed launches that read it slowly bring it back in place of
// `big`; timed launches that read it quickly leave it there.
TEST_F(HostCostTest, DataTheKernelsReadSlowlyOverTheLinkComesBackInPlaceOfDataReadLess) {
  epoch(20'000'000);
  EXPECT_GT(listed(core, small).cost, 8 * HostCost::kPrior);
  EXPECT_EQ(listed(core, small).host_bytes, 0u) << "the counts alone would keep it on the host";
  EXPECT_EQ(listed(core, big).host_bytes, kBig);
  EXPECT_EQ(core.budget().migration().counts().rebalances, 1u);
}

// A trial's verdict holds what it placed against the counts, and bringing back what a swap just
// demoted raises the swap factor; a kernel timed reading the data costly on the host is neither
// a guess to hold against nor a change of mind.
TEST_F(HostCostTest, DataMeasuredCostlyComesBackPastATrialsHoldAndCountsNoRegret) {
  UseRecord* u = record(core, small);
  ASSERT_NE(u, nullptr);
  u->held_on_host.store(true);
  u->held_until.store(core.budget().migration().uses().epoch() + Migration::kHoldEpochs);
  u->demoted_epoch.store(core.budget().migration().uses().epoch());
  epoch(20'000'000);
  EXPECT_EQ(listed(core, small).host_bytes, 0u) << "held on the host though measured costly";
  const Migration::Counts c = core.budget().migration().counts();
  EXPECT_EQ(c.regrets, 0u);
  EXPECT_EQ(c.factor, Migration::kFactor);
}

TEST_F(HostCostTest, DataTheKernelsReadQuicklyOverTheLinkStaysThere) {
  for (int i = 0; i < 3; ++i) epoch(200'000);
  EXPECT_LT(listed(core, small).cost, HostCost::kPrior);
  EXPECT_EQ(listed(core, small).host_bytes, kSmall);
  EXPECT_EQ(listed(core, big).host_bytes, 0u);
  EXPECT_EQ(core.budget().migration().counts().rebalances, 0u);
}

TEST_F(HostCostTest, AFailedLaunchGivesNoSample) {
  kernel.launch(core, small, 20'000'000, false);
  EXPECT_EQ(fake.live_events(), 0u);
  settle(core);
  EXPECT_EQ(core.budget().migration().counts().host_cost.measured, 0u);
  EXPECT_EQ(listed(core, small).cost, 0u);
}

TEST_F(HostCostTest, ALaunchBeingCapturedIntoAGraphIsNotTimed) {
  // The fake has no graphs: a failed query stands for a stream being captured.
  fake.fail_next(FakeOp::stream_is_capturing, res::invalid_value);
  kernel.launch(core, small, 20'000'000);
  EXPECT_EQ(fake.calls(FakeOp::event_create), 0u);
  EXPECT_EQ(core.budget().migration().counts().host_cost.timed, 0u);
}

// Threads launching over host memory, each timing its own launches, while another thread's safe
// points harvest the samples (run under ThreadSanitizer too): every sample is measured or
// dropped, and none outlives the run.
TEST_F(HostCostTest, ThreadsTimingLaunchesWhileSafePointsHarvestLoseNoSample) {
  constexpr int kThreads = 4, kLaunches = 200;
  std::atomic<int> running{kThreads}, launched{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      fake.set_current_device(0);
      Kernel own(fake, reinterpret_cast<void*>(0x8000 + 0x100 * t));
      for (int i = 0; i < kLaunches; ++i) {
        own.launch(core, small, 1000);
        ++launched;
      }
      --running;
    });
  // The harvesting starts after a first launch: a safe point before any (the threads may start
  // late on a loaded machine) could bring `small` back before a launch found it on the host.
  while (launched.load() == 0) std::this_thread::yield();
  while (running.load() > 0) settle(core);
  for (std::thread& t : threads) t.join();
  settle(core);
  const HostCost::Counts c = core.budget().migration().counts().host_cost;
  // The first launch finds `small` on the host (no safe point has seen it used yet); later ones
  // may find it back on the device.
  EXPECT_GE(c.timed, 1u);
  EXPECT_EQ(c.measured, c.timed);
  EXPECT_EQ(fake.live_events(), 0u);
}

TEST_F(HostCostTest, ASampleWaitsForItsStreamAndGoesWithItsContext) {
  Stream s = nullptr;
  ASSERT_EQ(fake.driver().stream_create(&s, kStreamNonBlocking), res::ok);
  fake.hold_stream(s);
  kernel.launch(core, small, 20'000'000, true, s);
  core.at_safe_point(0);  // the legacy stream's safe point: `s` still has the kernel
  core.budget().migration().on_safe_point(0);
  EXPECT_EQ(core.budget().migration().counts().host_cost.measured, 0u);
  EXPECT_EQ(fake.live_events(), 2u) << "kept until its stream finishes";
  // The program resets the device: the sample goes, its events destroyed while they are valid.
  core.on_primary_reset(0);
  reset = true;
  EXPECT_EQ(fake.live_events(), 0u);
  fake.release_stream(s);
  EXPECT_EQ(fake.driver().stream_destroy(s), res::ok);
}

}  // namespace
}  // namespace allocshim
