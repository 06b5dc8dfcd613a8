// The learned step (placement/step.h, placement/step_tape.h): the period of a recording, each
// allocation's profile over a step, and learning through the core from what launches name.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/core.h"
#include "core_fixture.h"
#include "fake_driver.h"
#include "fake_test_util.h"
#include "placement/step.h"

namespace allocshim {
namespace {

using fake::FakeDriver;
using fake::kMiB;

// Stand-ins for allocations: compared, never read.
const UseRecord* rec(std::uintptr_t i) { return reinterpret_cast<const UseRecord*>(i * 64); }

policy::Policy auto_budget(const std::string& size) {
  return testing::parsed(
      "[budget]\ndevice = \"" + size + "\"\nspill = \"host\"\nmigrate = \"auto\"\n", "step.toml");
}

// A kernel launch as the hook layer makes it: inside the gate, its parameters the pointers `args`.
void launch(Core& core, void* kernel, std::initializer_list<DevPtr> args) {
  std::vector<DevPtr> values(args);
  std::vector<void*> params;
  for (DevPtr& v : values) params.push_back(&v);
  core.submit_enter();
  core.launch_uses(kernel, params.data(), nullptr);
  core.submit_leave();
}

// A recording of `steps` repeats of `step` (per submission: a function and what it names), with
// a safe point before each step when `sync`.
StepTape::Recording recording(const std::vector<std::pair<int, std::vector<int>>>& step, int steps,
                              bool sync) {
  StepTape::Recording r;
  for (int s = 0; s < steps; ++s) {
    if (sync) r.safe_points.push_back(static_cast<std::uint32_t>(r.keys.size()));
    for (const auto& [f, named] : step) {
      std::vector<UseRecord*> records;
      for (int n : named) records.push_back(const_cast<UseRecord*>(rec(n)));
      const auto at = static_cast<std::uint32_t>(r.keys.size());
      r.keys.push_back(StepTape::key(reinterpret_cast<const void*>(std::uintptr_t(f) * 16),
                                     records.data(), static_cast<unsigned>(records.size())));
      r.ticks.push_back(1000 * at);
      for (const UseRecord* u : records) r.uses.push_back({at, u});
    }
  }
  return r;
}

TEST(Step, APeriodIsFoundBetweenTheProgramsSynchronizations) {
  const auto r = recording({{1, {1}}, {2, {1, 2}}, {3, {3}}, {2, {2}}, {4, {}}}, 5, true);
  std::uint32_t match = 0;
  EXPECT_EQ(find_period(r.keys, r.safe_points, match), 5u);
  EXPECT_EQ(match, 1000u);
}

TEST(Step, APeriodIsFoundWithoutSynchronizations) {
  const auto r =
      recording({{1, {1}}, {2, {1, 2}}, {3, {3}}, {2, {2}}, {4, {}}, {5, {4}}}, 4, false);
  std::uint32_t match = 0;
  EXPECT_EQ(find_period(r.keys, r.safe_points, match), 6u);
}

TEST(Step, AProgramSynchronizingEveryOtherStepRepeatsEveryStep) {
  auto r = recording({{1, {1}}, {2, {2}}, {3, {3}}}, 8, false);
  for (std::uint32_t at = 0; at < r.keys.size(); at += 6) r.safe_points.push_back(at);
  std::uint32_t match = 0;
  EXPECT_EQ(find_period(r.keys, r.safe_points, match), 3u);
}

// Identical layers launch the same kernels over other weights: a layer is not a step.
TEST(Step, IdenticalLayersOverOtherAllocationsAreNotASteps) {
  std::vector<std::pair<int, std::vector<int>>> step;
  for (int layer = 0; layer < 12; ++layer) {
    step.push_back({1, {100 + layer}});
    step.push_back({2, {100 + layer, 1}});
  }
  step.push_back({3, {1}});
  const auto r = recording(step, 3, false);
  std::uint32_t match = 0;
  EXPECT_EQ(find_period(r.keys, r.safe_points, match), 25u);
}

TEST(Step, ASequenceThatDoesNotRepeatHasNoStep) {
  std::vector<std::pair<int, std::vector<int>>> step;
  for (int i = 0; i < 400; ++i) step.push_back({(i * 7919) % 97, {i % 13}});
  const LearnedStep s = learn_step(recording(step, 1, true));
  EXPECT_FALSE(s.repeats);
  EXPECT_TRUE(s.profiles.empty());
}

// A few launches that differ between steps (a logging step) do not hide the step.
TEST(Step, AFewDifferingSubmissionsStillMakeAStep) {
  std::vector<std::pair<int, std::vector<int>>> step;
  for (int i = 0; i < 50; ++i) step.push_back({i, {i % 5}});
  auto r = recording(step, 4, true);
  r.keys[60] = 12345;  // one step launched something else once
  r.keys[130] = 0;     // and one submission was dropped
  std::uint32_t match = 0;
  EXPECT_EQ(find_period(r.keys, r.safe_points, match), 50u);
  EXPECT_LT(match, 1000u);
  EXPECT_GE(match, LearnedStep::kMatchPermille);
}

TEST(Step, EachAllocationsProfileSaysWhereInTheStepItIsUsedAndIdle) {
  // Period 10: allocation 1 at 1 and 5 (twice at 5), 2 at 9, 3 at 0 and 8.
  std::vector<std::pair<int, std::vector<int>>> step(10, {9, {}});
  for (int i = 0; i < 10; ++i) step[i].first = i + 1;
  step[1].second = {1};
  step[5].second = {1, 1};
  step[9].second = {2};
  step[0].second = {3};
  step[8].second = {3};
  const LearnedStep s = learn_step(recording(step, 3, true));
  ASSERT_TRUE(s.repeats);
  EXPECT_EQ(s.launches, 10u);
  EXPECT_EQ(s.steps, 3u);
  EXPECT_EQ(s.safe_points, 1u) << "the synchronization that begins it";
  EXPECT_EQ(s.ticks, 10000u) << "from one step's first submission to the next's";
  ASSERT_EQ(s.profiles.size(), 3u);
  const StepProfile* a = s.find(rec(1));
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->uses, 2u) << "two submissions, one naming it twice";
  EXPECT_EQ(a->first, 1u);
  EXPECT_EQ(a->last, 5u);
  EXPECT_EQ(a->idle_from, 6u) << "after its last use, round to the next step's first";
  EXPECT_EQ(a->idle_len, 5u);
  const StepProfile* c = s.find(rec(3));
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->idle_from, 1u) << "between 0 and 8, not round the end";
  EXPECT_EQ(c->idle_len, 7u);
  const StepProfile* b = s.find(rec(2));
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->idle_from, 0u) << "a stretch that begins at the next step's start";
  EXPECT_EQ(b->idle_len, 9u);
  EXPECT_EQ(b->bins, std::uint64_t{1} << (9 * StepProfile::kBins / 10));
  EXPECT_EQ(s.find(rec(77)), nullptr);
  EXPECT_EQ(Migration::place_over_step(b->bins, 4, 0).find('#'), 9 * StepProfile::kBins / 10);
  EXPECT_EQ(Migration::place_over_step(b->bins, 4, 4).find('h'), 9 * StepProfile::kBins / 10);
}

TEST(StepTape, RecordsOnlyWhileArmedFromEveryThreadAndStartsAfreshWhenArmedAgain) {
  StepTape tape;
  UseRecord* none[1] = {nullptr};
  tape.submission(nullptr, none, 0);  // before any recording: the buffers do not exist yet
  EXPECT_TRUE(tape.copy().keys.empty());
  ASSERT_TRUE(tape.arm());
  auto* r1 = const_cast<UseRecord*>(rec(1));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) tape.submission(rec(7), &r1, 1);
    });
  for (auto& t : threads) t.join();
  tape.safe_point();
  StepTape::Recording r = tape.copy();
  EXPECT_EQ(r.keys.size(), 4000u);
  EXPECT_EQ(r.uses.size(), 4000u);
  ASSERT_EQ(r.safe_points.size(), 1u);
  EXPECT_EQ(r.safe_points[0], 4000u);
  tape.disarm();
  tape.safe_point();
  EXPECT_EQ(tape.copy().safe_points.size(), 1u) << "a safe point while not armed";
  ASSERT_TRUE(tape.arm());
  tape.submission(rec(8), &r1, 1);
  r = tape.copy();
  EXPECT_EQ(r.keys.size(), 1u);
  EXPECT_EQ(r.uses.size(), 1u);
  EXPECT_TRUE(r.safe_points.empty());
}

TEST(StepTape, AFullTapeKeepsWhatItHolds) {
  StepTape tape;
  ASSERT_TRUE(tape.arm());
  auto* r1 = const_cast<UseRecord*>(rec(1));
  for (std::uint32_t i = 0; i < StepTape::kLaunches + 10; ++i) tape.submission(rec(2), &r1, 1);
  EXPECT_TRUE(tape.full());
  const StepTape::Recording r = tape.copy();
  EXPECT_EQ(r.keys.size(), StepTape::kLaunches);
  EXPECT_EQ(r.uses.size(), StepTape::kLaunches);
}

// Through the core: kernels launched in a loop that synchronizes once a step are learned as a
// step, and the stats file shows it and each allocation's place over it.
TEST(Step, TheCoreLearnsALoopsStepAndTheStatsFileShowsIt) {
  FakeDriver fake;
  Core core(fake.driver(), auto_budget("64MiB"));
  Migration& m = core.budget().migration();
  m.set_epoch_ns(0);
  const DevPtr w = testing::must_alloc(core, 24 * kMiB);
  const DevPtr x = testing::must_alloc(core, 24 * kMiB);
  const DevPtr y = testing::must_alloc(core, 24 * kMiB);  // past the budget: part on the host
  void* const k1 = reinterpret_cast<void*>(0x7000);
  void* const k2 = reinterpret_cast<void*>(0x7100);
  fake.set_param_layout(k1, {{0, 8}, {8, 8}});
  fake.set_param_layout(k2, {{0, 8}});
  std::uint64_t epoch = 0;
  for (int step = 0; step < 40 && epoch == 0; ++step) {
    launch(core, k1, {w, x});  // forward
    launch(core, k2, {y});
    launch(core, k2, {y});  // a repeat: the thread's memo counts it, and the tape must still see it
    launch(core, k1, {x, w});  // backward
    core.after_context_sync(core.before_context_sync());
    m.learned_step(&epoch);
  }
  const LearnedStep s = m.learned_step(&epoch);
  ASSERT_NE(epoch, 0u) << "no recording ended";
  ASSERT_TRUE(s.repeats);
  EXPECT_EQ(s.launches, 4u);
  EXPECT_EQ(s.safe_points, 1u);
  const nlohmann::json stats = nlohmann::json::parse(core.stats_json());
  const nlohmann::json& step = stats.at("migration").at("step");
  EXPECT_TRUE(step.at("repeats").get<bool>()) << step;
  EXPECT_EQ(step.at("submissions").get<int>(), 4);
  EXPECT_EQ(step.at("allocations_named").get<int>(), 3);
  int shown = 0;
  for (const nlohmann::json& a : stats.at("migration").at("allocations")) {
    const DevPtr base = a[1].get<DevPtr>();
    const std::string place = a[16].get<std::string>();
    ASSERT_EQ(place.size(), StepProfile::kBins);
    const std::size_t host = a[3].get<std::size_t>();
    if (base == w || base == x) {
      EXPECT_EQ(a[11].get<int>(), 2) << "named twice a step";
      EXPECT_EQ(a[12].get<int>(), 0) << "first";
      EXPECT_EQ(a[13].get<int>(), 3) << "last";
      EXPECT_NE(place.find(host ? 'h' : '#'), std::string::npos) << place;
      ++shown;
    }
    if (base == y) {
      EXPECT_EQ(a[11].get<int>(), 2) << "named twice in a row";
      EXPECT_EQ(a[12].get<int>(), 1);
      EXPECT_EQ(a[13].get<int>(), 2);
      EXPECT_EQ(place.find_first_not_of('.'), StepProfile::kBins / 4) << place;
      ++shown;
    }
  }
  EXPECT_EQ(shown, 3);
  EXPECT_NE(core.summary().find("step: 4 submissions, 1 synchronizations"), std::string::npos)
      << core.summary();
  for (DevPtr p : {w, x, y}) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
}

// A step's phases come one epoch after another: counts in epochs make what the last phase used
// look denser than what the first phase used the same number of times. Once the step is learned,
// both count as used once a step, and a demotion after the last phase takes the older.
TEST(Step, ALearnedStepWeighsUsesPerStepWhateverItsPhase) {
  FakeDriver fake;
  Core core(fake.driver(), auto_budget("128MiB"));
  Migration& m = core.budget().migration();
  m.set_epoch_ns(0);
  const DevPtr late = testing::must_alloc(core, 24 * kMiB);   // used in the last phase
  const DevPtr early = testing::must_alloc(core, 24 * kMiB);  // used in the first
  void* const k = reinterpret_cast<void*>(0x7200);
  void* const idle = reinterpret_cast<void*>(0x7300);
  fake.set_param_layout(k, {{0, 8}});
  fake.set_param_layout(idle, {{0, 8}});
  auto sync = [&] { core.after_context_sync(core.before_context_sync()); };
  std::uint64_t epoch = 0;
  for (int step = 0; step < 60 && epoch == 0; ++step) {
    launch(core, k, {early});
    sync();
    launch(core, idle, {0});
    sync();
    launch(core, k, {late});
    sync();
    m.learned_step(&epoch);
  }
  ASSERT_NE(epoch, 0u) << "no step learned";
  ASSERT_TRUE(m.learned_step().repeats);
  EXPECT_EQ(m.learned_step().safe_points, 3u);
  // Right after the last phase: room for 8 MiB more.
  ASSERT_GE(m.demote(0, 8 * kMiB), 8 * kMiB);
  std::vector<MovableAllocation> v;
  const_cast<Backend*>(testing::spill_target(core))->movable()->movable(0, v);
  for (const MovableAllocation& a : v) {
    if (a.base == late) {
      EXPECT_GE(a.host_bytes, 8 * kMiB) << "equal uses per step: the older goes";
    }
    if (a.base == early) {
      EXPECT_EQ(a.host_bytes, 0u) << "the first phase's data was not colder";
    }
  }
  for (DevPtr p : {late, early}) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
}

// A program that leaves its step (a training loop turning to evaluation) is learned again as soon
// as the policy finds something the step names unused for two steps, not a relearning period
// later.
TEST(Step, AProgramThatLeavesItsStepIsLearnedAgain) {
  FakeDriver fake;
  Core core(fake.driver(), auto_budget("32MiB"));
  Migration& m = core.budget().migration();
  m.set_epoch_ns(0);
  const DevPtr a = testing::must_alloc(core, 24 * kMiB);
  const DevPtr b = testing::must_alloc(core, 24 * kMiB);  // past the budget: some on the host
  void* const k = reinterpret_cast<void*>(0x7400);
  fake.set_param_layout(k, {{0, 8}});
  auto step = [&](std::initializer_list<DevPtr> named) {
    for (DevPtr p : named) launch(core, k, {p});
    core.after_context_sync(core.before_context_sync());
  };
  std::uint64_t first = 0;
  for (int i = 0; i < 40 && first == 0; ++i) {
    step({a, b});
    m.learned_step(&first);
  }
  ASSERT_NE(first, 0u);
  ASSERT_EQ(m.learned_step().profiles.size(), 2u);
  std::uint64_t again = first;
  for (int i = 0; i < 40 && again == first; ++i) {
    step({b});
    m.learned_step(&again);
    m.rebalance(0, 64 * kMiB, 0);  // a decision lists the allocations, and finds `a` unused
  }
  EXPECT_NE(again, first) << "not learned again within 40 steps";
  EXPECT_LT(again - first, Migration::kRelearnEpochs);
  EXPECT_EQ(m.learned_step().profiles.size(), 1u) << "the new step names only b";
  for (DevPtr p : {a, b}) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
}

}  // namespace
}  // namespace allocshim
