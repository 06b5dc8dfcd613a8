// Trials on the fake driver (placement/migration.h, "Trials"): a swap made while the program runs
// steadily is judged by the program's submission rate after it, on a clock the test keeps. Each
// test's program takes, per step, a time that depends on where its buffers are, as a real
// program's kernels do when they read host memory over the link, in ways counts cannot see.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/core.h"
#include "base/throughput.h"
#include "core_fixture.h"
#include "fake_driver.h"

namespace allocshim {
namespace {

using fake::FakeDriver;
using fake::kMiB;
using testing::must_alloc;

// The yardstick: a rate only over a window with no placement change, kEpochs epochs and kNs
// long; a change starts the window again at the next epoch.
TEST(Throughput, ARateSpansEpochsAndTimeWithoutAPlacementChange) {
  Throughput t;
  double rate = 0;
  const std::uint64_t step = Throughput::kNs / Throughput::kEpochs;
  std::uint64_t now = 1000, subs = 0;
  t.sample(now, subs, 7);
  for (std::uint64_t e = 1; e < Throughput::kEpochs; ++e) t.sample(now += step, subs += 100, 7);
  EXPECT_FALSE(t.rate(rate)) << "too few epochs";
  t.sample(now += step, subs += 100, 7);
  ASSERT_TRUE(t.rate(rate));
  EXPECT_DOUBLE_EQ(rate, 100.0 * 1e9 / static_cast<double>(step));
  EXPECT_EQ(t.changes(), 7u);
  t.sample(now += step, subs += 900, 8);  // moved: this epoch starts a new window
  EXPECT_FALSE(t.rate(rate));
  EXPECT_EQ(t.changes(), 8u);
  for (std::uint64_t e = 0; e < Throughput::kEpochs; ++e) t.sample(now += 1, subs += 100, 8);
  EXPECT_FALSE(t.rate(rate)) << "enough epochs, too short a time";
  t.sample(now += Throughput::kNs, subs += 100, 8);
  ASSERT_TRUE(t.rate(rate));
  const double ns = static_cast<double>(Throughput::kNs + Throughput::kEpochs);
  EXPECT_NEAR(rate, 100.0 * (Throughput::kEpochs + 1) * 1e9 / ns, 1e-6 * rate);
}

std::atomic<std::uint64_t> g_now_ns{1};
std::uint64_t test_clock() { return g_now_ns.load(); }

class Trials : public ::testing::Test {
 protected:
  Trials() {
    m.set_epoch_ns(0);  // every step's synchronization starts an epoch
    m.set_clock(&test_clock);
    fake.set_param_layout(kernel2, {{0, 8}, {8, 8}});
    fake.set_param_layout(kernel4, {{0, 8}, {8, 8}, {16, 8}, {24, 8}});
  }
  ~Trials() override {
    for (DevPtr p : owned) EXPECT_EQ(core.free(p, FreeRequest{}), res::ok);
  }
  DevPtr alloc(std::size_t bytes) { return owned.emplace_back(must_alloc(core, bytes)); }
  std::size_t host_bytes(DevPtr base) {
    std::vector<MovableAllocation> v;
    const_cast<Backend*>(testing::spill_target(core))->movable()->movable(0, v);
    for (const MovableAllocation& a : v)
      if (a.base == base) return a.host_bytes;
    ADD_FAILURE() << "not movable: " << base;
    return 0;
  }
  void launch(void* kernel, std::vector<DevPtr> args) {
    std::vector<void*> params;
    for (DevPtr& p : args) params.push_back(&p);
    core.submit_enter();
    core.launch_uses(kernel, params.data(), nullptr);
    core.submit_leave();
  }
  // One step of the program: its launches, the time its kernels take where the data is now, and
  // the synchronization that ends it.
  void step(const std::function<void()>& launches, const std::function<double()>& ms) {
    launches();
    g_now_ns += static_cast<std::uint64_t>(ms() * 1e6);
    core.after_context_sync(core.before_context_sync());
  }
  std::uint64_t demoted() { return core.budget().device_report(0).demoted_bytes; }

  FakeDriver fake;
  Core core{fake.driver(),
            testing::parsed("[budget]\ndevice = \"64MiB\"\nspill = \"host\"\nmigrate = \"auto\"\n",
                            "trial.toml")};
  Migration& m = core.budget().migration();
  void* const kernel2 = reinterpret_cast<void*>(0x7200);
  void* const kernel4 = reinterpret_cast<void*>(0x7400);
  std::vector<DevPtr> owned;
};

// The training step's shape: a large buffer read whole by one two-operand kernel a step (the
// gradient of the logits), optimizer states named by a four-operand kernel six times a step. Per
// byte the large buffer is the least used, so the counts leave it on the host; but it is what
// makes the step slow there. A trial brings it back in place of the states, measures the step
// faster, and keeps that; a trial that makes room from the wrong data is undone.
TEST_F(Trials, WhatSlowsTheProgramOnTheHostComesBackThoughItsCountsAreLow) {
  const DevPtr big = alloc(32 * kMiB), act = alloc(16 * kMiB);
  auto launches = [&](const std::vector<DevPtr>& states) {
    return [&, states] {
      launch(kernel2, {big, act});
      for (int i = 0; i < 6; ++i) launch(kernel4, states);
    };
  };
  // 40 ms when all of `big` is on the host, 20 for `act`, 1 for each 8 MiB of states.
  std::vector<DevPtr> states;
  auto ms = [&] {
    double t = 10 + 40.0 * host_bytes(big) / (32 * kMiB) + 20.0 * host_bytes(act) / (16 * kMiB);
    for (DevPtr s : states) t += 1.0 * host_bytes(s) / (8 * kMiB);
    return t;
  };
  for (int i = 0; i < 3; ++i) step([&] { launch(kernel2, {big, act}); }, ms);
  for (int i = 0; i < 4; ++i) {  // 16 MiB past the budget, each used as it is made
    states.push_back(alloc(8 * kMiB));
    launch(kernel4, {states.back(), 0, 0, 0});
  }
  ASSERT_GT(host_bytes(big), 0u) << "the newcomers pushed out the least dense: the large buffer";
  const auto body = launches(states);
  for (int i = 0; i < 300; ++i) step(body, ms);
  const Migration::Counts c = m.counts();
  EXPECT_GE(c.explored, 2u);
  EXPECT_GE(c.kept, 2u) << "undone " << c.undone << ", abandoned " << c.abandoned;
  EXPECT_EQ(host_bytes(big), 0u) << "the large buffer came back";
  EXPECT_EQ(host_bytes(act), 0u) << "the first room, from `act`, was taken back from the states";
  std::size_t states_out = 0;
  for (DevPtr s : states) states_out += host_bytes(s);
  EXPECT_EQ(states_out, 16 * kMiB) << "the states made the room";
  // Later trials (a state for a state) gain nothing and are undone, less often each time; the
  // counts, which would bring the dense states back in place of `big`, are held off.
  int slow = 0;
  for (int i = 0; i < 200; ++i) {
    step(body, ms);
    slow += ms() > 13.0;
  }
  EXPECT_EQ(slow, 0);
  EXPECT_EQ(host_bytes(big), 0u);
}

// A trial waits for an idle safe point to give its verdict. A program whose synchronizations all
// find a stream busy never gives one; the trial is abandoned after kTrialMaxEpochs, so that
// promotions ahead of launches, which a running trial holds back, resume.
TEST_F(Trials, ATrialWithNoVerdictIsAbandonedInTime) {
  const DevPtr big = alloc(32 * kMiB), act = alloc(16 * kMiB);
  std::vector<DevPtr> states;
  auto ms = [&] { return 10 + 40.0 * host_bytes(big) / (32 * kMiB); };
  for (int i = 0; i < 3; ++i) step([&] { launch(kernel2, {big, act}); }, ms);
  for (int i = 0; i < 4; ++i) {
    states.push_back(alloc(8 * kMiB));
    launch(kernel4, {states.back(), 0, 0, 0});
  }
  auto body = [&] {
    launch(kernel2, {big, act});
    for (int i = 0; i < 6; ++i) launch(kernel4, states);
  };
  for (int i = 0; i < 100 && m.counts().explored == 0; ++i) step(body, ms);
  ASSERT_EQ(m.counts().explored, 1u) << "no exploration to leave without a verdict";
  Stream s = nullptr;
  ASSERT_EQ(fake.driver().stream_create(&s, kStreamNonBlocking), res::ok);
  core.on_stream_created(s, kStreamNonBlocking);
  fake.hold_stream(s);  // from now on every synchronization finds work pending
  Event e = nullptr;
  ASSERT_EQ(fake.driver().event_create(&e, kEventDisableTiming), res::ok);
  ASSERT_EQ(fake.driver().event_record(e, s), res::ok);
  for (std::uint64_t i = 0; i < Migration::kTrialMaxEpochs + 2; ++i) {
    body();
    g_now_ns += 20'000'000;
    core.after_partial_sync();
  }
  const Migration::Counts c = m.counts();
  EXPECT_EQ(c.abandoned, 1u) << m.summary();
  EXPECT_EQ(c.kept + c.undone, 0u);
  fake.release_stream(s);
  ASSERT_EQ(fake.driver().event_destroy(e), res::ok);
  core.on_stream_destroyed(s);
  ASSERT_EQ(fake.driver().stream_destroy(s), res::ok);
}

// Decisions come from every thread: promotions ahead from launching threads, trials and
// rebalances from synchronizing ones. They take turns, and every allocation stays whole (its
// device and host parts add up) however they interleave.
TEST_F(Trials, LaunchingAndSynchronizingThreadsDecideInTurn) {
  const DevPtr big = alloc(32 * kMiB), act = alloc(16 * kMiB);
  std::vector<DevPtr> states;
  for (int i = 0; i < 4; ++i) {
    states.push_back(alloc(8 * kMiB));
    launch(kernel4, {states.back(), 0, 0, 0});
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> launchers;
  for (int t = 0; t < 3; ++t)
    launchers.emplace_back([&, t] {
      while (!stop.load()) {
        launch(kernel2, {t == 0 ? big : act, 0});
        launch(kernel4, states);
        core.after_partial_sync(0);
      }
    });
  auto ms = [&] { return 10 + 40.0 * host_bytes(big) / (32 * kMiB); };
  for (int i = 0; i < 200; ++i) step([&] { launch(kernel2, {big, act}); }, ms);
  stop = true;
  for (std::thread& t : launchers) t.join();
  std::vector<MovableAllocation> v;
  const_cast<Backend*>(testing::spill_target(core))->movable()->movable(0, v);
  for (const MovableAllocation& a : v) {
    std::size_t size = 0;
    for (DevPtr p : owned)
      if (p == a.base) size = p == big ? 32 * kMiB : p == act ? 16 * kMiB : 8 * kMiB;
    EXPECT_EQ(a.device_bytes + a.host_bytes, size) << a.base;
  }
  EXPECT_GT(m.counts().gate.closes, 0u) << m.summary();
}

// A swap the counts ask for is a trial too: promoting the buffer many launches name, in place of
// one a single launch reads, makes this program slower, so it is undone; the next swap the counts
// ask for takes the room from data no longer used.
TEST_F(Trials, ASwapTheCountsAskForIsUndoneWhenTheProgramGetsSlower) {
  const DevPtr y = alloc(24 * kMiB), z = alloc(24 * kMiB);
  // 40 ms more when `y` is partly on the host; `x` and `z` cost nothing there.
  auto ms = [&] { return 10 + (host_bytes(y) > 0 ? 40.0 : 0.0); };
  auto phase = [&](DevPtr many) {
    return [&, many] {
      launch(kernel2, {y, 0});
      for (int i = 0; i < 8; ++i) launch(kernel2, {many, 0});
    };
  };
  for (int i = 0; i < 3; ++i) step(phase(z), ms);
  const DevPtr x = alloc(24 * kMiB);  // 8 MiB past the budget: spills itself
  ASSERT_EQ(host_bytes(x), 8 * kMiB);
  for (int i = 0; i < 40; ++i) step(phase(z), ms);  // steady: the rate before
  ASSERT_EQ(m.counts().trials, 0u);
  // The same launches now name `x`: the counts want it on the device.
  for (int i = 0; i < 100; ++i) step(phase(x), ms);
  EXPECT_GE(m.counts().undone, 1u) << "the swap that slowed the program stayed" << m.summary();
  EXPECT_EQ(host_bytes(y), 0u);
  EXPECT_EQ(host_bytes(x), 0u) << "the next swap, from `z`, was not made";
  EXPECT_GE(host_bytes(z), 8 * kMiB);
}

}  // namespace
}  // namespace allocshim
