// GPU time slices between processes ([compute], node/compute_share.h), with stand-in processes:
// each member has a launch gate of its own and a worker thread whose "kernels" run inside it, so
// the time a worker spends inside is its GPU time. Real threads and clocks, short periods.
#include "node/compute_share.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "base/clock.h"
#include "core/core.h"
#include "base/launch_gate.h"
#include "core_fixture.h"
#include "fake_driver.h"
#include "node_budget_peer.h"
#include "policy/policy.h"

namespace allocshim {
namespace {

using namespace std::chrono_literals;

constexpr std::uint32_t kPeriodMs = 20;

// A process taking slices: its gate, its worker's time inside, and its ComputeShare.
struct Member {
  explicit Member(std::atomic<int>* inside_now) : inside_now_(inside_now) {
    ComputeShare::Process p;
    p.gate = &gate;
    p.drain = [] {};  // the worker's "kernels" end before it leaves the gate
    p.syncing = [] { return false; };
    p.device = [](node::Uuid* uuid) {
      std::memset(uuid->bytes, 7, sizeof uuid->bytes);
      return true;
    };
    share = std::make_unique<ComputeShare>(std::move(p));
  }
  ~Member() { stop_work(); }

  bool start(std::uint32_t share_permille,
             policy::Compute::Priority priority = policy::Compute::Priority::normal) {
    policy::Compute c;
    c.enabled = true;
    c.share_permille = share_permille;
    c.priority = priority;
    c.scope = policy::Budget::Share::user;
    c.period_ms = kPeriodMs;
    return share->start(c);
  }
  // Launches 200 us "kernels" back to back until stop_work.
  void work() {
    worker = std::thread([this] {
      while (!stop.load()) {
        gate.enter();
        const std::uint64_t t0 = clock::now_ns();
        if (inside_now_->fetch_add(1) != 0) overlaps.fetch_add(1);
        std::this_thread::sleep_for(200us);
        inside_now_->fetch_sub(1);
        busy_ns.fetch_add(clock::now_ns() - t0);
        gate.leave();
      }
    });
  }
  void stop_work() {
    stop.store(true);
    if (worker.joinable()) worker.join();
  }

  LaunchGate gate;
  std::unique_ptr<ComputeShare> share;
  std::atomic<int>* inside_now_;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> busy_ns{0}, overlaps{0};
  std::thread worker;
};

// A share directory of its own (NodeBudgetTest's), emptied by the members leaving.
class ComputeShareTest : public NodeBudgetTest {
 protected:
  std::string compute_region() const {
    return dir_ + "/" + node::compute_region_prefix() + "u" + std::to_string(::geteuid());
  }
  std::atomic<int> inside_now_{0};
};

std::uint32_t part_of(std::initializer_list<std::uint32_t> caps, std::size_t i) {
  std::uint32_t c[16], out[16];
  std::size_t n = 0;
  for (std::uint32_t x : caps) c[n++] = x;
  ComputeShare::parts(c, n, out);
  return out[i];
}

TEST(ComputeShareParts, CapsAreKeptAndTheRestIsSplitEvenly) {
  EXPECT_EQ(part_of({300, 1000}, 0), 300u);
  EXPECT_EQ(part_of({300, 1000}, 1), 700u);
  EXPECT_EQ(part_of({1000, 1000}, 0), 500u);
  EXPECT_EQ(part_of({700, 700}, 1), 500u);  // caps above an even split get the even split
  EXPECT_EQ(part_of({300, 300}, 0), 300u);  // capped below it: the period is not filled
  EXPECT_EQ(part_of({500, 1000, 200}, 0), 400u);
  EXPECT_EQ(part_of({500, 1000, 200}, 1), 400u);
  EXPECT_EQ(part_of({500, 1000, 200}, 2), 200u);
  EXPECT_EQ(part_of({0, 1000}, 0), 1u);  // a cap of nothing still makes progress
}

TEST(ComputePolicy, SectionIsReadCheckedAndWrittenBack) {
  policy::Policy p;
  std::vector<policy::Diagnostic> errors;
  ASSERT_TRUE(policy::load_string(
      "[compute]\nshare = \"30%\"\npriority = \"high\"\nscope = \"group\"\nperiod_ms = 50\n", "t",
      p, errors))
      << (errors.empty() ? "" : errors[0].str());
  EXPECT_TRUE(p.compute.enabled);
  EXPECT_EQ(p.compute.share_permille, 300u);
  EXPECT_EQ(p.compute.priority, policy::Compute::Priority::high);
  EXPECT_EQ(p.compute.scope, policy::Budget::Share::group);
  EXPECT_EQ(p.compute.period_ms, 50u);
  policy::Policy again;
  ASSERT_TRUE(policy::load_string(policy::to_toml(p), "t", again, errors));
  EXPECT_EQ(policy::to_toml(again), policy::to_toml(p));

  policy::Policy none;
  ASSERT_TRUE(policy::load_string("", "empty", none, errors));
  EXPECT_FALSE(none.compute.enabled);
  EXPECT_EQ(policy::to_toml(none).find("[compute]"), std::string::npos);

  for (const char* bad : {"share = \"0.5%\"", "share = 30", "share = \"130%\"",
                          "priority = \"urgent\"", "scope = \"process\"", "period_ms = 5"}) {
    policy::Policy q;
    errors.clear();
    EXPECT_FALSE(policy::load_string(std::string("[compute]\n") + bad + "\n", "bad", q, errors))
        << bad;
    ASSERT_FALSE(errors.empty()) << bad;
    EXPECT_EQ(errors[0].line, 2) << bad << ": " << errors[0].str();
  }
}

// Alone on its GPU a member never closes its gate: its work runs as without the section.
TEST_F(ComputeShareTest, AloneTheGateStaysOpen) {
  Member a(&inside_now_);
  ASSERT_TRUE(a.start(300));
  a.work();
  std::this_thread::sleep_for(300ms);
  a.stop_work();
  EXPECT_EQ(a.gate.counts().waits, 0u);
  EXPECT_EQ(a.share->report().slices, 0u);
  a.share->stop();
}

// A forked child keeps no descriptor of the region: the parent's slot would otherwise look alive
// for as long as the child lives.
TEST_F(ComputeShareTest, AForkedChildKeepsNoDescriptorOfTheRegion) {
  Member a(&inside_now_);
  ASSERT_TRUE(a.start(300));
  const std::string region = compute_region();
  ASSERT_EQ(descriptors_of(region), 1) << "the member holds the region open";
  Peer peer;
  spawn(peer, [&region](Peer&) {
    CHILD_CHECK(descriptors_of(region) == 0);
    return 0;
  });
  EXPECT_EQ(peer.join(), 0);
  EXPECT_EQ(descriptors_of(region), 1) << "the parent's descriptor stays";
  a.share->stop();
}

// Two members that both want the GPU run in exclusive slices, each getting its part: 30% and 70%.
TEST_F(ComputeShareTest, ContendedMembersGetTheirSharesInExclusiveSlices) {
  Member a(&inside_now_), b(&inside_now_);
  ASSERT_TRUE(a.start(300));
  ASSERT_TRUE(b.start(1000));
  a.work();
  b.work();
  std::this_thread::sleep_for(300ms);  // slices settle
  const std::uint64_t a0 = a.busy_ns.load(), b0 = b.busy_ns.load();
  const std::uint64_t o0 = a.overlaps.load() + b.overlaps.load();
  std::this_thread::sleep_for(1500ms);
  const double ta = static_cast<double>(a.busy_ns.load() - a0);
  const double tb = static_cast<double>(b.busy_ns.load() - b0);
  const std::uint64_t overlaps = a.overlaps.load() + b.overlaps.load() - o0;
  a.stop_work();
  b.stop_work();
  ASSERT_GT(ta + tb, 0.0);
  std::printf("the capped member's part of the time run: %.3f\n", ta / (ta + tb));
  // Wide enough for a loaded machine, where a holder whose worker is not scheduled for a tick looks
  // idle and hands its slice on early; an even split (0.5) still fails.
  EXPECT_NEAR(ta / (ta + tb), 0.30, 0.10);
  // Exclusive: a worker was almost never inside while the other was (only across a forced turn).
  EXPECT_LE(overlaps, 5u);
  EXPECT_GT(a.share->report().slices, 10u);
  EXPECT_GT(b.share->report().waited_ns, 0u);
  a.share->stop();
  b.share->stop();
}

// A higher priority runs first: the lower one's work waits while it wants the GPU, then runs.
TEST_F(ComputeShareTest, HighPriorityRunsFirst) {
  Member hi(&inside_now_), lo(&inside_now_);
  ASSERT_TRUE(hi.start(1000, policy::Compute::Priority::high));
  ASSERT_TRUE(lo.start(1000, policy::Compute::Priority::low));
  hi.work();
  lo.work();
  std::this_thread::sleep_for(300ms);
  const std::uint64_t l0 = lo.busy_ns.load(), h0 = hi.busy_ns.load();
  std::this_thread::sleep_for(700ms);
  const double th = static_cast<double>(hi.busy_ns.load() - h0);
  const double tl = static_cast<double>(lo.busy_ns.load() - l0);
  EXPECT_LT(tl, 0.05 * (th + tl));
  hi.stop_work();
  // Once the high one stopped wanting it (a period later), the low one runs.
  std::this_thread::sleep_for(std::chrono::milliseconds(3 * kPeriodMs));
  const std::uint64_t l1 = lo.busy_ns.load();
  std::this_thread::sleep_for(300ms);
  EXPECT_GT(lo.busy_ns.load() - l1, 200'000'000u);
  lo.stop_work();
  hi.share->stop();
  lo.share->stop();
}

// A member that holds the slice and never hands it on (a stopped or hostile process writing the
// region), from `start_ns` on, delays the others a few periods, never for good.
void expect_taken_over(const std::string& region, std::atomic<int>* inside_now,
                       std::int64_t start_from_now_ns) {
  Member a(inside_now);
  ASSERT_TRUE(a.start(1000));
  a.work();
  std::this_thread::sleep_for(50ms);  // a made the region and attached its GPU

  node::Region squatter;
  std::string error;
  ASSERT_TRUE(squatter.join(region, {0600, static_cast<gid_t>(-1), true}, 1000, error)) << error;
  node::Uuid uuid;
  std::memset(uuid.bytes, 7, sizeof uuid.bytes);
  int entry = -1;
  std::uint64_t limit = 0;
  ASSERT_EQ(squatter.attach(uuid, 0, 1000, &entry, &limit), node::Status::ok);
  node::Slice slice{};
  node::Demand demand[node::kSlots];
  ASSERT_TRUE(squatter.read_slices(entry, &slice, demand));
  bool handed = false;
  const std::uint64_t start = clock::now_ns() + static_cast<std::uint64_t>(start_from_now_ns);
  ASSERT_EQ(squatter.hand_slice(entry, slice.seq, squatter.slot(), start, start, 1000, &handed),
            node::Status::ok);
  ASSERT_TRUE(handed);
  // It keeps saying it wants the GPU, and never hands on.
  const std::uint64_t t_end = clock::now_ns() + 600'000'000;
  while (clock::now_ns() < t_end) {
    squatter.publish_demand(entry, node::Demand{clock::now_ns(), 1000, 1, 0, 0});
    std::this_thread::sleep_for(1ms);
  }
  const std::uint64_t before = a.busy_ns.load();
  std::this_thread::sleep_for(100ms);
  EXPECT_GT(a.busy_ns.load() - before, 50'000'000u);  // a runs again
  EXPECT_GE(a.share->report().taken_over, 1u);
  a.stop_work();
  squatter.leave();
  a.share->stop();
}

TEST_F(ComputeShareTest, ASliceNotHandedOnIsTakenOver) {
  expect_taken_over(compute_region(), &inside_now_, 0);
}

// A start further ahead than any round (written by no member that hands on) is no reason to wait.
TEST_F(ComputeShareTest, ASliceThatStartsFarAheadIsTakenOver) {
  expect_taken_over(compute_region(), &inside_now_, std::int64_t{3600} * 1'000'000'000);
}

// Demands written into slots no process holds (a dead member's, or another user's forgery in a
// shared scope) hold nobody: a member alone keeps its gate open.
TEST_F(ComputeShareTest, DemandsOfSlotsNobodyHoldsAreIgnored) {
  Member a(&inside_now_);
  ASSERT_TRUE(a.start(1000, policy::Compute::Priority::low));
  a.work();
  std::this_thread::sleep_for(50ms);  // a made the region and attached its GPU
  const int fd = ::open(compute_region().c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const std::uint64_t t_end = clock::now_ns() + 300'000'000;
  while (clock::now_ns() < t_end) {
    for (std::size_t e = 0; e < node::kEntries; ++e) {
      const node::Demand forged{clock::now_ns(), 1000, 2, 0, 0};
      const off_t off = static_cast<off_t>(offsetof(node::Layout, demand) +
                                           (e * node::kSlots + 100) * sizeof(node::Demand));
      ASSERT_EQ(::pwrite(fd, &forged, sizeof forged, off), static_cast<ssize_t>(sizeof forged));
    }
    std::this_thread::sleep_for(1ms);
  }
  ::close(fd);
  a.stop_work();
  EXPECT_EQ(a.gate.counts().waits, 0u);
  a.share->stop();
}

// The core starts slices from its policy's [compute] section, holds its submissions at its
// launch gate and drains through the driver: two cores on one fake GPU split its time 30/70.
TEST_F(ComputeShareTest, CoresTakeSlicesFromTheirPolicies) {
  fake::FakeDriver fake;
  const char* text = "[compute]\nshare = \"%s\"\nscope = \"user\"\nperiod_ms = 20\n";
  char a_text[128], b_text[128];
  std::snprintf(a_text, sizeof a_text, text, "30%");
  std::snprintf(b_text, sizeof b_text, text, "100%");
  Core a(fake.driver(), testing::parsed(a_text, "a.toml")),
      b(fake.driver(), testing::parsed(b_text, "b.toml"));
  Context ctx = nullptr;
  ASSERT_EQ(fake.driver().primary_ctx_retain(&ctx, 0), res::ok);  // the GPU both use
  ASSERT_TRUE(a.start_control());
  ASSERT_TRUE(b.start_control());
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> busy[2] = {0, 0};
  auto work = [&](Core& core, std::atomic<std::uint64_t>& ns) {
    while (!stop.load()) {
      core.submit_enter();
      const std::uint64_t t0 = clock::now_ns();
      std::this_thread::sleep_for(200us);
      ns.fetch_add(clock::now_ns() - t0);
      core.submit_leave();
    }
  };
  std::thread ta(work, std::ref(a), std::ref(busy[0])), tb(work, std::ref(b), std::ref(busy[1]));
  std::this_thread::sleep_for(300ms);
  const std::uint64_t a0 = busy[0].load(), b0 = busy[1].load();
  std::this_thread::sleep_for(1000ms);
  const double da = static_cast<double>(busy[0].load() - a0);
  const double db = static_cast<double>(busy[1].load() - b0);
  stop.store(true);
  ta.join();
  tb.join();
  EXPECT_NEAR(da / (da + db), 0.30, 0.10);  // as wide as above, for a loaded machine
  a.stop_control();
  b.stop_control();
  EXPECT_GT(a.compute().report().slices, 5u);
  EXPECT_NE(a.summary().find("compute: share 30.0%, priority normal: "), std::string::npos)
      << a.summary();
  EXPECT_NE(a.stats_json().find("\"compute\":{"), std::string::npos);
  fake.driver().primary_ctx_release(0);
}

}  // namespace
}  // namespace allocshim
