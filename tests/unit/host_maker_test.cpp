// HostMaker (shim/backends/host_maker.h): pinned host pieces made on worker threads at once and
// handed out in order; a failure stops the later pieces; nothing made is leaked.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "backends/host_maker.h"
#include "fake_driver.h"

namespace allocshim::host_detail {
namespace {

using fake::FakeConfig;
using fake::FakeDriver;
using fake::kMiB;

// Host pieces of the fake driver, each taking `delay` (the driver pinning pages), counting how
// many were being made at once.
struct Maker {
  const Driver& d;
  std::chrono::milliseconds delay{0};
  std::atomic<int> now{0}, most{0};
  std::atomic<int> on_caller{0};
  std::thread::id caller = std::this_thread::get_id();

  HostMaker::Create create() {
    return [this](std::size_t bytes, MemHandle* h) {
      const int n = now.fetch_add(1) + 1;
      int m = most.load();
      while (n > m && !most.compare_exchange_weak(m, n)) {}
      if (std::this_thread::get_id() == caller) on_caller.fetch_add(1);
      std::this_thread::sleep_for(delay);
      PhysSpec spec;
      spec.location = Location{Location::Type::host_numa, 0};
      const Result r = d.mem_create(h, bytes, spec);
      now.fetch_sub(1);
      return r;
    };
  }
};

Context current(const Driver& d) {
  Context ctx = nullptr;
  EXPECT_EQ(d.ctx_get_current(&ctx), res::ok);
  return ctx;
}

TEST(HostMaker, MakesPiecesOnSeveralThreadsAtOnceAndHandsThemOutInOrder) {
  FakeDriver fake;
  fake.set_current_device(0);
  Maker m{fake.driver(), std::chrono::milliseconds(20)};
  const std::vector<std::size_t> sizes = {2 * kMiB, 4 * kMiB, 2 * kMiB, 6 * kMiB,
                                          2 * kMiB, 2 * kMiB, 4 * kMiB, 2 * kMiB};
  std::vector<MemHandle> got;
  {
    HostMaker maker(fake.driver(), current(fake.driver()), sizes, 4, m.create());
    EXPECT_EQ(maker.workers(), 4u);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      MemHandle h = 0;
      ASSERT_EQ(maker.take(i, &h), res::ok) << i;
      got.push_back(h);
    }
  }
  // Counted, not timed: at least two pieces were being made at the same moment.
  EXPECT_GE(m.most.load(), 2) << "pieces were made at once";
  EXPECT_EQ(m.on_caller.load(), 0) << "the caller only takes";
  EXPECT_EQ(fake.host_used(), 24 * kMiB);
  std::vector<MemHandle> distinct = got;
  std::sort(distinct.begin(), distinct.end());
  EXPECT_EQ(std::unique(distinct.begin(), distinct.end()), distinct.end());
  for (MemHandle h : got) ASSERT_EQ(fake.driver().mem_release(h), res::ok);
  EXPECT_EQ(fake.live_handles(), 0u);
}

TEST(HostMaker, WithoutThreadsOrForOnePieceTheCallerMakesThem) {
  FakeDriver fake;
  Maker m{fake.driver()};
  for (const auto& [sizes, threads] : {std::pair{std::vector<std::size_t>{2 * kMiB, 2 * kMiB}, 0u},
                                       std::pair{std::vector<std::size_t>{2 * kMiB}, 8u}}) {
    HostMaker maker(fake.driver(), current(fake.driver()), sizes, threads, m.create());
    EXPECT_EQ(maker.workers(), 0u);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      MemHandle h = 0;
      ASSERT_EQ(maker.take(i, &h), res::ok);
      ASSERT_EQ(fake.driver().mem_release(h), res::ok);
    }
  }
  EXPECT_EQ(m.on_caller.load(), 3);
  EXPECT_EQ(fake.live_handles(), 0u);
}

TEST(HostMaker, TheHostRunningOutStopsTheRestAndNothingLeaks) {
  for (const unsigned threads : {0u, 3u}) {
    SCOPED_TRACE(threads);
    FakeConfig c;
    c.host_capacity = 10 * kMiB;  // five pieces of eight
    FakeDriver fake(c);
    Maker m{fake.driver()};
    const std::vector<std::size_t> sizes(8, 2 * kMiB);
    std::vector<MemHandle> got;
    {
      HostMaker maker(fake.driver(), current(fake.driver()), sizes, threads, m.create());
      std::size_t i = 0;
      for (; i < sizes.size(); ++i) {
        MemHandle h = 0;
        const Result r = maker.take(i, &h);
        if (r != res::ok) {
          EXPECT_EQ(r, res::out_of_memory);
          break;
        }
        got.push_back(h);
      }
      // Five fit; with workers a later piece may have taken the room of an earlier one.
      if (threads == 0)
        EXPECT_EQ(i, 5u);
      else
        EXPECT_LE(i, 5u);
      for (; i < sizes.size(); ++i) {
        MemHandle h = 0;
        EXPECT_EQ(maker.take(i, &h), res::out_of_memory) << "every later piece says why: " << i;
      }
    }
    EXPECT_EQ(fake.live_handles(), got.size());
    for (MemHandle h : got) ASSERT_EQ(fake.driver().mem_release(h), res::ok);
    EXPECT_EQ(fake.live_handles(), 0u);
  }
}

TEST(HostMaker, PiecesNeverTakenAreReleased) {
  FakeDriver fake;
  Maker m{fake.driver()};
  {
    HostMaker maker(fake.driver(), current(fake.driver()), std::vector<std::size_t>(16, 2 * kMiB),
                    4, m.create());
    MemHandle h = 0;
    ASSERT_EQ(maker.take(0, &h), res::ok);
    ASSERT_EQ(fake.driver().mem_release(h), res::ok);
  }  // the caller stopped (a move failed): the workers stop and what they made goes back
  EXPECT_EQ(fake.live_handles(), 0u);
  EXPECT_EQ(fake.host_used(), 0u);
}

}  // namespace
}  // namespace allocshim::host_detail
