// Launch-aware migration on the fake driver (placement/migration.h): a move closes the launch gate so
// no thread's submission can reach memory while it moves; launches name the movable allocations
// their parameters point into, structs passed by value included; placement follows those uses,
// and a cycle that uses everything keeps a stable split.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/host.h"
#include "host_probe.h"
#include "core/core.h"
#include "fake_driver.h"
#include "fake_test_util.h"
#include "core_fixture.h"

namespace allocshim {
namespace {

using fake::FakeDriver;
using fake::FakeOp;
using fake::kMiB;

policy::Policy budget(const char* size) {
  return testing::parsed(
      std::string("[budget]\ndevice = \"") + size + "\"\nspill = \"host\"\nmigrate = \"auto\"\n",
      "launch.toml");
}

using testing::must_alloc;

Backend& spill(Core& core) {
  const Backend* b = testing::spill_target(core);
  if (b == nullptr) ADD_FAILURE() << "no spill target";
  return const_cast<Backend&>(b ? *b : core.backend(0));
}

// Where every chunk of [p, p + n) lives: 1 device, 0 host.
bool all_at(Core& core, DevPtr p, std::size_t n, int where) {
  for (std::size_t off = 0; off < n; off += 2 * kMiB)
    if (host_placement(spill(core), p + off) != where) return false;
  return true;
}

MovableAllocation info(Core& core, DevPtr base) {
  std::vector<MovableAllocation> v;
  spill(core).movable()->movable(0, v);
  for (const MovableAllocation& a : v)
    if (a.base == base) return a;
  ADD_FAILURE() << "not movable: " << base;
  return {};
}

std::uint64_t last_use(Core& core, DevPtr base) { return info(core, base).use->last_epoch.load(); }

// A submission as the hook layer makes it: inside the gate, naming what it uses.
void submit(Core& core, DevPtr used) {
  core.submit_enter();
  core.submit_uses(used);
  core.submit_leave();
}

void free_all(Core& core, std::initializer_list<DevPtr> ptrs) {
  for (DevPtr p : ptrs) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
}

TEST(Launch, ASubmissionDuringAMoveWaitsUntilTheMoveIsDone) {
  FakeDriver fake;
  Core core(fake.driver(), budget("64MiB"));
  const DevPtr a = must_alloc(core, 24 * kMiB);
  const DevPtr b = must_alloc(core, 24 * kMiB);
  // The move's copy holds the mover inside the driver until the test lets it go.
  std::atomic<bool> moving{false}, release{false};
  fake.on_call(FakeOp::memcpy_dtod, [&] {
    if (moving.exchange(true)) return;
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  DevPtr c = 0;
  std::thread mover([&] { c = must_alloc(core, 24 * kMiB); });  // 8 MiB short: demotes `a`
  while (!moving.load()) std::this_thread::yield();
  std::atomic<bool> submitted{false};
  std::thread launcher([&] {
    core.submit_enter();
    submitted = true;  // past the gate: the driver call would run here
    core.submit_leave();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(submitted.load()) << "a submission got past the gate while a piece was moving";
  release = true;
  mover.join();
  launcher.join();
  EXPECT_TRUE(submitted.load());
  const Migration::Counts counts = core.budget().migration().counts();
  EXPECT_GE(counts.gate.waits, 1u);
  EXPECT_GE(counts.gate.closes, 1u);
  EXPECT_TRUE(all_at(core, a, 24 * kMiB, 0)) << "the move completed";
  fake.clear_failures();
  free_all(core, {a, b, c});
}

TEST(Launch, AMoveWaitsForASubmissionInsideTheGate) {
  FakeDriver fake;
  Core core(fake.driver(), budget("64MiB"));
  const DevPtr a = must_alloc(core, 24 * kMiB);
  const DevPtr b = must_alloc(core, 24 * kMiB);
  core.budget().migration().set_close_timeout_ns(60'000'000'000);  // however slow this machine is
  core.submit_enter();  // a launch in flight on this thread
  std::atomic<bool> allocated{false};
  DevPtr c = 0;
  std::thread mover([&] {
    c = must_alloc(core, 24 * kMiB);
    allocated = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(fake.calls(FakeOp::memcpy_dtod), 0u) << "a piece moved under a submission in flight";
  core.submit_leave();
  mover.join();
  EXPECT_TRUE(allocated.load());
  EXPECT_TRUE(all_at(core, a, 24 * kMiB, 0));
  free_all(core, {a, b, c});
}

// The gate's two sides race for real here, with no driver to slow them: a mover closes and opens
// it as fast as it can and, while it holds it closed, flags a move; submitters on other threads
// enter and leave in a tight loop and must never find the flag raised inside. (A gate that lets
// submissions through fails at once. A missing store-then-load order on the submitter's side, the
// barrier's job, loses a race too narrow for this to catch reliably.)
TEST(LaunchGate, NoSubmissionIsInsideWhileTheGateIsClosed) {
  LaunchGate gate;
  constexpr int kSubmitters = 2;
  std::atomic<bool> moving{false}, stop{false};
  std::atomic<std::uint64_t> inside_a_move{0}, entries{0};
  std::vector<std::thread> submitters;
  for (int t = 0; t < kSubmitters; ++t)
    submitters.emplace_back([&] {
      std::uint64_t n = 0, bad = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        gate.enter();
        // The driver call: long enough to see a move that started after this entry.
        for (int i = 0; i < 64; ++i) bad += moving.load(std::memory_order_relaxed);
        gate.leave();
        ++n;
      }
      inside_a_move += bad;
      entries += n;
    });
  std::uint64_t closes = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < until || closes < 1000) {
    if (!gate.close(std::uint64_t{60'000'000'000})) continue;
    moving.store(true, std::memory_order_relaxed);
    for (int i = 0; i < 64; ++i) asm volatile("" ::: "memory");  // the move
    moving.store(false, std::memory_order_relaxed);
    gate.open();
    ++closes;
  }
  stop = true;
  for (auto& t : submitters) t.join();
  EXPECT_EQ(inside_a_move.load(), 0u)
      << "submissions ran inside a move (" << closes << " moves, " << entries.load() << " entries)";
  EXPECT_GT(entries.load(), 0u);
}

TEST(Launch, APointerInsideAStructPassedByValueMarksItsAllocation) {
  FakeDriver fake;
  Core core(fake.driver(), budget("256MiB"));
  const DevPtr a = must_alloc(core, 24 * kMiB);
  const DevPtr b = must_alloc(core, 24 * kMiB);
  const DevPtr c = must_alloc(core, 24 * kMiB);
  struct Args {
    int n;
    float scale;
    DevPtr data;  // offset 8 of a 24-byte parameter
    double bias;
  };
  void* const kernel = reinterpret_cast<void*>(0x5000);
  fake.set_param_layout(kernel, {{0, 4}, {8, sizeof(Args)}, {32, 8}});
  int n = 7;
  Args args{1, 2.0f, b + 4096, 3.0};
  DevPtr plain = c + 100;
  void* params[] = {&n, &args, &plain};
  UseTracker& uses = core.budget().migration().uses();
  uses.advance_epoch();
  const std::uint64_t now = uses.epoch();
  core.submit_enter();
  core.launch_uses(kernel, params, nullptr);
  core.submit_leave();
  EXPECT_EQ(last_use(core, b), now) << "the pointer inside the struct was not seen";
  EXPECT_EQ(last_use(core, c), now) << "the plain pointer parameter";
  EXPECT_LT(last_use(core, a), now) << "nothing pointed into a";
  EXPECT_EQ(info(core, b).use->epochs.load(), 2u) << "its allocation and this epoch";
  EXPECT_EQ(info(core, b).use->uses(), 1u) << "one launch";

  // The packed form (cuLaunchKernel's `extra`) gives the same answer.
  uses.advance_epoch();
  unsigned char buffer[40] = {};
  std::memcpy(buffer + 8, &args, sizeof args);
  const DevPtr into_a = a + 8 * kMiB;
  std::memcpy(buffer + 32, &into_a, sizeof into_a);
  std::size_t size = sizeof buffer;
  void* extra[] = {reinterpret_cast<void*>(UseTracker::kParamBufferPointer), buffer,
                   reinterpret_cast<void*>(UseTracker::kParamBufferSize), &size,
                   reinterpret_cast<void*>(UseTracker::kParamEnd)};
  core.submit_enter();
  core.launch_uses(kernel, nullptr, extra);
  core.submit_leave();
  EXPECT_EQ(last_use(core, a), uses.epoch());
  EXPECT_EQ(last_use(core, b), uses.epoch());
  EXPECT_EQ(fake.calls(FakeOp::func_get_param_info), 4u)
      << "the layout is asked once: 3 params + the end";
  EXPECT_EQ(core.budget().migration().counts().uses.launches, 2u);
  free_all(core, {a, b, c});
}

// Two movable allocations under a budget with room for both, and a kernel of two pointer
// parameters launched as the hook layer launches it: inside the gate.
class TwoBuffers : public ::testing::Test {
 protected:
  TwoBuffers() { fake.set_param_layout(kernel, {{0, 8}, {8, 8}}); }
  void launch(DevPtr x, DevPtr y, int times = 1) {
    void* params[] = {&x, &y};
    for (int i = 0; i < times; ++i) {
      core.submit_enter();
      core.launch_uses(kernel, params, nullptr);
      core.submit_leave();
    }
  }
  FakeDriver fake;
  Core core{fake.driver(), budget("256MiB")};
  const DevPtr a = must_alloc(core, 24 * kMiB);
  const DevPtr b = must_alloc(core, 24 * kMiB);
  void* const kernel = reinterpret_cast<void*>(0x7000);
  UseTracker& uses = core.budget().migration().uses();
};

// Each thread remembers, per kernel and parameter word, the allocation that word pointed into last
// time; a launch whose words point elsewhere, or after the movable set changed, must still mark
// exactly what it names.
TEST_F(TwoBuffers, TheSameKernelOverOtherBuffersMarksThoseBuffers) {
  auto next = [&](DevPtr x, DevPtr y) {  // each in an epoch of its own
    uses.advance_epoch();
    launch(x, y);
  };
  next(a + 64, 0);
  EXPECT_EQ(last_use(core, a), uses.epoch());
  EXPECT_LT(last_use(core, b), uses.epoch());
  next(b + 64, a + 128);  // each word now points where the other did
  EXPECT_EQ(last_use(core, a), uses.epoch());
  EXPECT_EQ(last_use(core, b), uses.epoch());
  next(b + 8 * kMiB, 0);
  EXPECT_LT(last_use(core, a), uses.epoch()) << "a word that left a still marked it";
  EXPECT_EQ(info(core, b).use->uses(), 2u);
  EXPECT_EQ(info(core, a).use->uses(), 2u);
  // A new movable allocation: a new snapshot, whose ranges the old hints do not point into.
  free_all(core, {a});
  const DevPtr c = must_alloc(core, 24 * kMiB);
  next(c + 4096, b);
  EXPECT_EQ(last_use(core, c), uses.epoch());
  EXPECT_EQ(last_use(core, b), uses.epoch());
  EXPECT_EQ(info(core, b).use->uses(), 3u);
  free_all(core, {b, c});
}

// A loop launching one kernel over the same buffers is counted by the thread in its own cache and
// handed to the records later; no use may be lost on the way: not when the loop ends with another
// launch, not at a safe point, not when the movable set changed in between.
TEST_F(TwoBuffers, RepeatsOfOneLaunchAreAllCounted) {
  uses.advance_epoch();
  launch(a, a + 4096, 100);
  launch(b, 0);  // another launch: the loop's count reaches its record
  EXPECT_EQ(info(core, a).use->uses(), 100u);
  EXPECT_EQ(info(core, b).use->uses(), 1u);
  launch(a + 64, b, 30);
  uses.settle();  // what a safe point of this thread does
  EXPECT_EQ(info(core, a).use->uses(), 130u);
  EXPECT_EQ(info(core, b).use->uses(), 31u);
  // The loop goes on after a new allocation changed the movable set.
  launch(a, 0, 10);
  const DevPtr c = must_alloc(core, 24 * kMiB);
  launch(a, 0);
  uses.settle();
  EXPECT_EQ(info(core, a).use->uses(), 141u);
  EXPECT_EQ(core.budget().migration().counts().uses.launches, 142u)
      << "every launch was scanned or repeated";
  free_all(core, {a, b, c});
}

// A launch shares one use among the distinct allocations it names (UseRecord::kWhole), however
// many of its parameters point into each: a multi-tensor kernel naming many tensors of one
// allocation counts once there, a kernel naming one buffer alone counts whole.
TEST_F(TwoBuffers, ALaunchSharesOneUseAmongTheDistinctAllocationsItNames) {
  void* const four = reinterpret_cast<void*>(0x7400);
  fake.set_param_layout(four, {{0, 8}, {8, 8}, {16, 8}, {24, 8}});
  DevPtr args[] = {a, b + 64, a + 8 * kMiB, a + 4096};
  void* params[] = {&args[0], &args[1], &args[2], &args[3]};
  core.submit_enter();
  core.launch_uses(four, params, nullptr);
  core.submit_leave();
  EXPECT_EQ(info(core, a).use->uses(), 1u) << "one launch, however many of its pointers";
  EXPECT_EQ(info(core, a).use->shares(), UseRecord::kWhole / 2);
  EXPECT_EQ(info(core, b).use->shares(), UseRecord::kWhole / 2);
  launch(b, 0, 3);  // alone: whole, in the repeats too
  uses.settle();
  EXPECT_EQ(info(core, b).use->shares(), UseRecord::kWhole / 2 + 3 * UseRecord::kWhole);
  free_all(core, {a, b});
}

// A thread keeps the layouts of the kernels it launches; driver handles are aligned pointers, and
// a program launching tens of kernels in a loop must find most of them there the second time,
// not in the shared table behind a lock.
TEST(Launch, ALoopOverManyKernelsFindsTheirLayoutsInTheThreadsCache) {
  FakeDriver fake;
  Core core(fake.driver(), budget("256MiB"));
  const DevPtr a = must_alloc(core, 24 * kMiB);
  constexpr int kKernels = 40;
  std::vector<void*> kernels;
  for (int i = 0; i < kKernels; ++i) {
    kernels.push_back(
        reinterpret_cast<void*>(0x7f1200000000ull + static_cast<std::uintptr_t>(i) * 0x1000));
    fake.set_param_layout(kernels.back(), {{0, 8}});
  }
  DevPtr p = a;
  void* params[] = {&p};
  auto loop = [&] {
    for (void* k : kernels) {
      core.submit_enter();
      core.launch_uses(k, params, nullptr);
      core.submit_leave();
    }
  };
  const UseTracker& uses = core.budget().migration().uses();
  loop();
  const std::uint64_t first = uses.counts().layout_misses;
  EXPECT_EQ(first, static_cast<std::uint64_t>(kKernels));
  loop();
  EXPECT_LT(uses.counts().layout_misses - first, static_cast<std::uint64_t>(kKernels / 2))
      << "second pass misses: " << uses.counts().layout_misses - first
      << "; most kernels left the thread's cache between two passes";
  EXPECT_EQ(info(core, a).use->uses(), 2u * kKernels);
  free_all(core, {a});
}

TEST(Launch, AFunctionTheDriverCannotDescribeMarksNothing) {
  FakeDriver fake;
  Core core(fake.driver(), budget("256MiB"));
  const DevPtr a = must_alloc(core, 24 * kMiB);
  UseTracker& uses = core.budget().migration().uses();
  uses.advance_epoch();
  DevPtr p = a;
  void* params[] = {&p};
  core.submit_enter();
  core.launch_uses(reinterpret_cast<void*>(0x6000), params, nullptr);  // no layout
  core.submit_leave();
  EXPECT_LT(last_use(core, a), uses.epoch());
  EXPECT_EQ(core.budget().migration().counts().uses.unknown_layout, 1u);
  free_all(core, {a});
}

TEST(Launch, DemotionPicksWhatSubmissionsUsedLeastNotTheOldest) {
  FakeDriver fake;
  Core core(fake.driver(), budget("64MiB"));
  const DevPtr weights = must_alloc(core, 24 * kMiB);  // oldest, but read by every launch
  const DevPtr once = must_alloc(core, 24 * kMiB);     // written once, at its allocation
  core.budget().migration().uses().advance_epoch();
  submit(core, weights + 64);
  const DevPtr fresh = must_alloc(core, 24 * kMiB);  // 8 MiB short
  EXPECT_TRUE(all_at(core, weights, 24 * kMiB, 1)) << "the used allocation was demoted";
  EXPECT_TRUE(all_at(core, once, 24 * kMiB, 0));
  EXPECT_TRUE(all_at(core, fresh, 24 * kMiB, 1));
  free_all(core, {weights, once, fresh});
}

// Weights first: what launches read stays, the newcomer spills (as a static split would); the
// reverse order (data written once, then a smaller set) makes room for the newcomer.
TEST(Launch, ANewcomerSpillsRatherThanDemoteDenserDataInUse) {
  FakeDriver fake;
  Core core(fake.driver(), budget("64MiB"));
  const DevPtr weights = must_alloc(core, 24 * kMiB);
  submit(core, weights);                               // written once, like the newcomer will be
  const DevPtr buffers = must_alloc(core, 48 * kMiB);  // 8 MiB short
  EXPECT_TRUE(all_at(core, weights, 24 * kMiB, 1)) << "demoted data denser than the newcomer";
  EXPECT_TRUE(all_at(core, buffers + 40 * kMiB, 8 * kMiB, 0));
  EXPECT_EQ(core.budget().device_report(0).demoted_bytes, 0u);
  free_all(core, {weights, buffers});

  const DevPtr cold = must_alloc(core, 48 * kMiB);
  submit(core, cold);
  const DevPtr hot = must_alloc(core, 24 * kMiB);  // 8 MiB short: `cold` is the less dense
  EXPECT_TRUE(all_at(core, hot, 24 * kMiB, 1));
  EXPECT_GE(core.budget().device_report(0).demoted_bytes, 8 * kMiB);
  free_all(core, {cold, hot});
}

TEST(Launch, RebalanceBringsBackWhatIsUsedAndKeepsAStableSplitWhenEverythingIs) {
  FakeDriver fake;
  Core core(fake.driver(), budget("64MiB"));
  Migration& m = core.budget().migration();
  m.set_epoch_ns(0);  // every safe point starts an epoch
  const DevPtr hot = must_alloc(core, 24 * kMiB);
  const DevPtr cold = must_alloc(core, 24 * kMiB);
  const DevPtr third = must_alloc(core, 24 * kMiB);  // demotes `hot`, the oldest
  ASSERT_TRUE(all_at(core, hot, 24 * kMiB, 0));
  // Passes read `hot` and `third`; `cold` is never used again.
  for (int pass = 0; pass < 4; ++pass) {
    submit(core, hot);
    submit(core, third);
    core.after_context_sync(core.before_context_sync());
  }
  EXPECT_TRUE(all_at(core, hot, 24 * kMiB, 1)) << "what every pass reads came back";
  EXPECT_TRUE(all_at(core, cold, 24 * kMiB, 0)) << "what nothing reads made room";
  EXPECT_TRUE(all_at(core, third, 24 * kMiB, 1));
  EXPECT_GE(m.counts().rebalances, 1u);
  // A cycle that uses all three: nothing is cold, so nothing moves again.
  const std::uint64_t moved = core.budget().device_report(0).demoted_bytes;
  for (int step = 0; step < 8; ++step) {
    for (DevPtr p : {hot, cold, third}) submit(core, p);
    core.after_context_sync(core.before_context_sync());
  }
  EXPECT_EQ(core.budget().device_report(0).demoted_bytes, moved)
      << "a cycle that uses everything thrashed";
  EXPECT_TRUE(all_at(core, cold, 24 * kMiB, 0));
  free_all(core, {hot, cold, third});
}

// The stats file says what was placed where and on what evidence: each movable allocation, in
// allocation order, with its device and host bytes and the submissions that named it.
TEST(Launch, TheStatsFileListsEachMovableAllocationWithItsPlaceAndUses) {
  FakeDriver fake;
  Core core(fake.driver(), budget("64MiB"));
  const DevPtr a = must_alloc(core, 24 * kMiB);
  const DevPtr b = must_alloc(core, 24 * kMiB);
  core.budget().migration().uses().advance_epoch();
  for (int i = 0; i < 3; ++i) submit(core, b + 4096);
  const DevPtr c = must_alloc(core, 24 * kMiB);  // 8 MiB short: demotes from `a`, unused since
  const nlohmann::json stats = nlohmann::json::parse(core.stats_json());
  const nlohmann::json& list = stats.at("migration").at("allocations");
  ASSERT_EQ(list.size(), 3u) << list;
  const DevPtr bases[] = {a, b, c};
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(list[i][0].get<int>(), 0) << "device";
    EXPECT_EQ(list[i][1].get<DevPtr>(), bases[i]) << "allocation order";
    EXPECT_EQ(list[i][2].get<std::size_t>() + list[i][3].get<std::size_t>(), 24 * kMiB);
  }
  EXPECT_GE(list[0][3].get<std::size_t>(), 8 * kMiB) << "a's demoted bytes are on the host";
  EXPECT_EQ(list[1][3].get<std::size_t>(), 0u);
  EXPECT_EQ(list[1][5].get<std::uint64_t>(), 3u) << "b's submissions";
  EXPECT_EQ(list[0][5].get<std::uint64_t>(), 0u);
  free_all(core, {a, b, c});
}

TEST(Launch, DataThatKeepsSwappingPlacesStopsBeingRebalanced) {
  FakeDriver fake;
  Core core(fake.driver(), budget("64MiB"));
  Migration& m = core.budget().migration();
  m.set_epoch_ns(0);
  const DevPtr x = must_alloc(core, 24 * kMiB);
  const DevPtr y = must_alloc(core, 24 * kMiB);
  const DevPtr z = must_alloc(core, 24 * kMiB);  // demotes x
  // x and y take turns being the busy one, two epochs each: each turn swaps them, and a swap that
  // brings back what a swap just sent away is a regret.
  auto phase = [&](DevPtr busy) {
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (int i = 0; i < 8; ++i) submit(core, busy);
      submit(core, z);
      core.after_context_sync(core.before_context_sync());
    }
  };
  for (int round = 0; round < 12; ++round) phase(round % 2 ? y : x);
  const Migration::Counts c = m.counts();
  EXPECT_GE(c.rebalances, 2u);
  EXPECT_GE(c.regrets, 1u);
  EXPECT_GT(c.factor, Migration::kFactor);
  // The raised factor asks more of a swap than these turns give: the swapping stops.
  for (int round = 0; round < 20; ++round) phase(round % 2 ? y : x);
  const std::uint64_t moved = core.budget().device_report(0).demoted_bytes;
  for (int round = 0; round < 8; ++round) phase(round % 2 ? y : x);
  EXPECT_EQ(core.budget().device_report(0).demoted_bytes, moved) << "still swapping";
  free_all(core, {x, y, z});
}

}  // namespace
}  // namespace allocshim
