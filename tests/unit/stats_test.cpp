// Statistics: per-thread stripes, sampled timing and its accounting (every call either in the
// histogram, scaled from a sample, or among the calls since a thread's last sample), API counts,
// and what the summary and the JSON say about sampling.
#include "base/stats.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/core.h"
#include "base/peak.h"
#include "fake_driver.h"
#include "core_fixture.h"

namespace allocshim {
namespace {

// n alloc/free calls through begin/end, as Backend::allocate and deallocate make them.
void calls(DeviceStats& d, bool sampled, int n) {
  for (int i = 0; i < n; ++i) {
    const DeviceStats::Call c = d.begin(sampled);
    if (i % 2 == 0)
      d.end_alloc(c, 256, Api::alloc);
    else
      d.end_free(c, 256);
  }
}

TEST(Stats, EveryCallTimedUnlessSampled) {
  DeviceStats d;
  calls(d, false, 100);
  EXPECT_EQ(d.timed_calls(), 100u);
  EXPECT_EQ(d.untimed(), 0u);
  EXPECT_EQ(d.allocs(), 50u);
  EXPECT_EQ(d.frees(), 50u);
  EXPECT_EQ(d.live_bytes(), 0u);
  EXPECT_EQ(d.peak_bytes(), 256u);
}

TEST(Stats, SampledCallsAreScaledToAllCalls) {
  DeviceStats d;
  calls(d, true, 1);
  EXPECT_EQ(d.timed_calls(), 1u) << "a thread's first call is timed";
  calls(d, true, 9999);
  EXPECT_EQ(d.timed_calls() + d.untimed(), 10000u);
  EXPECT_LT(d.untimed(), 3 * kSampleMean / 2) << "only the calls since the last sample are untimed";
  EXPECT_EQ(d.allocs() + d.frees(), 10000u) << "counts stay exact";
  EXPECT_EQ(d.api_calls(Api::alloc), d.allocs());
  EXPECT_GT(d.time_ns(), 0u);
}

TEST(Stats, SamplingSavesClockReads) {
  // Not timed: no weight, no clock read. Timed calls stand for the calls of their interval.
  DeviceStats d;
  int timed = 0;
  std::uint64_t weights = 0;
  for (int i = 0; i < 1600; ++i) {
    const DeviceStats::Call c = d.begin(true);
    if (c.weight != 0) {
      ++timed;
      weights += c.weight;
      EXPECT_LE(c.weight, 3 * kSampleMean / 2);
    }
    d.end_free(c, 0);
  }
  EXPECT_GE(timed, 1600 / static_cast<int>(3 * kSampleMean / 2));
  EXPECT_LE(timed, 1600 / static_cast<int>(kSampleMean / 2) + 1);
  EXPECT_EQ(weights, d.timed_calls());
}

TEST(Stats, FailedCallsAreInTheHistogram) {
  DeviceStats d;
  const DeviceStats::Call c = d.begin(false);
  d.end_failure(c);
  EXPECT_EQ(d.failures(), 1u);
  EXPECT_EQ(d.timed_calls(), 1u);
}

TEST(Stats, ManyThreadsAreExact) {
  // More threads than one page of stripes, their ids reused as they exit.
  DeviceStats d;
  constexpr int kThreads = threads::kPageSize + 8;
  constexpr int kCalls = 2000;
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) pool.emplace_back([&] { calls(d, true, kCalls); });
  for (auto& th : pool) th.join();
  EXPECT_EQ(d.allocs() + d.frees(), static_cast<std::uint64_t>(kThreads) * kCalls);
  EXPECT_EQ(d.timed_calls() + d.untimed(), static_cast<std::uint64_t>(kThreads) * kCalls);
  EXPECT_EQ(d.live_bytes(), 0u);
  EXPECT_EQ(d.api_calls(Api::alloc), static_cast<std::uint64_t>(kThreads) * kCalls / 2);
}

// Live bytes are per stripe; a block freed by another thread is subtracted there. One thread's
// peak is exact; other threads can hide at most kPublishBytes each from it.
TEST(Stats, LiveAndPeakAcrossThreads) {
  DeviceStats d;
  d.on_alloc(100, 0, Api::alloc);
  d.on_alloc(200, 0, Api::alloc);
  d.on_free(100, 0);
  d.on_alloc(50, 0, Api::alloc);
  EXPECT_EQ(d.live_bytes(), 250u);
  EXPECT_EQ(d.peak_bytes(), 300u) << "one thread's peak is exact";
  std::thread([&] { d.on_free(250, 0); }).join();
  EXPECT_EQ(d.live_bytes(), 0u) << "freed on another thread";
  EXPECT_EQ(d.peak_bytes(), 300u);

  // Large blocks publish at once: the peak of two threads' large blocks is seen whole.
  DeviceStats big;
  const std::uint64_t kBig = 2 * static_cast<std::uint64_t>(stats_detail::kPublishBytes);
  big.on_alloc(kBig, 0, Api::alloc);
  std::thread([&] {
    big.on_alloc(kBig, 0, Api::alloc);
    big.on_free(kBig, 0);
  }).join();
  big.on_free(kBig, 0);
  EXPECT_EQ(big.live_bytes(), 0u);
  EXPECT_EQ(big.peak_bytes(), 2 * kBig);

  // Small blocks of many threads: the peak read lies between the true one minus the bound and it.
  DeviceStats many;
  constexpr int kThreads = 8;
  std::atomic<int> holding{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&] {
      many.on_alloc(1000, 0, Api::alloc);
      holding.fetch_add(1);
      while (holding.load() < kThreads) std::this_thread::yield();
      many.on_free(1000, 0);
    });
  for (auto& th : pool) th.join();
  EXPECT_EQ(many.live_bytes(), 0u);
  EXPECT_GE(many.peak_bytes(), 1000u);
  EXPECT_LE(many.peak_bytes(), 1000u * kThreads);
}

// The one high-water mark helper every peak uses (base/peak.h): threads racing to raise it leave
// the highest value any of them offered, and a lower value never lowers it.
TEST(Stats, APeakRaisedFromManyThreadsIsTheHighestOffered) {
  std::atomic<std::uint64_t> peak{0};
  constexpr int kThreads = 4, kEach = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      // Interleaved values: each thread's are distinct, the highest is the last thread's last.
      for (int i = 0; i < kEach; ++i)
        raise_peak(peak, static_cast<std::uint64_t>(i * kThreads + t));
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(peak.load(), static_cast<std::uint64_t>(kEach * kThreads - 1));
  raise_peak(peak, 5);
  EXPECT_EQ(peak.load(), static_cast<std::uint64_t>(kEach * kThreads - 1)) << "never lowered";
  std::atomic<std::int64_t> signed_peak{-10};
  raise_peak(signed_peak, -20);
  EXPECT_EQ(signed_peak.load(), -10);
  raise_peak(signed_peak, -3);
  EXPECT_EQ(signed_peak.load(), -3);
}

TEST(Stats, ApiCallsSumOverDevices) {
  BackendStats b;
  b.device(0).on_alloc(100, 10, Api::alloc);
  b.device(3).on_alloc(100, 10, Api::pitch);
  b.device(3).on_alloc(100, 10, Api::alloc);
  EXPECT_EQ(b.api_calls(Api::alloc), 2u);
  EXPECT_EQ(b.api_calls(Api::pitch), 1u);
  EXPECT_EQ(b.api_calls(Api::managed), 0u);
}

policy::Policy single(BackendKind kind) { return testing::single(kind, FreeSync::none); }

TEST(Stats, SummaryAndJsonSaySampled) {
  fake::FakeDriver fake;
  for (BackendKind kind : {BackendKind::vmm, BackendKind::native}) {
    Core core(fake.driver(), single(kind));
    ASSERT_TRUE(core.error().empty()) << core.error();
    for (int i = 0; i < 100; ++i) {
      AllocRequest req;
      req.size = 4096;
      DevPtr p = 0;
      ASSERT_EQ(core.alloc(req, &p), res::ok);
      ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
    }
    const bool sampled = kind == BackendKind::vmm;
    EXPECT_EQ(core.summary().find("1 call in") != std::string::npos, sampled) << core.summary();
    const auto j = nlohmann::json::parse(core.stats_json());
    const auto& b = j["backends"][kind == BackendKind::vmm ? 1 : 0];
    EXPECT_EQ(b["latency_sampled"], sampled);
    std::uint64_t histogram = 0;
    for (const auto& v : b["devices"][0]["latency_log2_ns"]) histogram += v.get<std::uint64_t>();
    EXPECT_EQ(histogram + b["devices"][0]["untimed"].get<std::uint64_t>(), 200u);
    EXPECT_EQ(j["api"]["alloc"], 100);
  }
}

TEST(Stats, JsonCountsWhatBarrierFreesCost) {
  fake::FakeDriver fake;
  Core core(fake.driver(), testing::single(BackendKind::vmm, FreeSync::barrier));
  Stream nb = nullptr;
  ASSERT_EQ(fake.driver().stream_create(&nb, kStreamNonBlocking), res::ok);
  core.on_stream_created(nb, kStreamNonBlocking);
  AllocRequest req;
  req.size = 1 << 20;
  DevPtr p = 0;
  ASSERT_EQ(core.alloc(req, &p), res::ok);
  ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
  core.on_stream_destroyed(nb);  // closes the epoch: an event on the legacy stream, a query of nb
  ASSERT_EQ(fake.driver().stream_destroy(nb), res::ok);
  const auto j = nlohmann::json::parse(core.stats_json());
  const auto& fs = j["backends"][1]["devices"][0]["free_sync"];
  EXPECT_EQ(fs["epochs"], 1);
  EXPECT_EQ(fs["events"], 1);
  EXPECT_EQ(fs["stream_queries"], 1);
  EXPECT_EQ(fs["shortage_closes"], 0);
  EXPECT_EQ(fs["drains"], 0);
  // Nothing of it where no free waited.
  Core none(fake.driver(), single(BackendKind::vmm));
  ASSERT_EQ(none.alloc(req, &p), res::ok);
  ASSERT_EQ(none.free(p, FreeRequest{}), res::ok);
  EXPECT_FALSE(
      nlohmann::json::parse(none.stats_json())["backends"][1]["devices"][0].contains("free_sync"));
}

TEST(Stats, SummaryAndJsonNameTheOverridesInForce) {
  fake::FakeDriver fake;
  policy::Policy p = single(BackendKind::vmm);
  std::vector<policy::Diagnostic> errors;
  ASSERT_TRUE(policy::apply_overrides(p, "native", "free_sync=device", errors));
  Core core(fake.driver(), p);
  const std::string summary = core.summary();
  EXPECT_NE(summary.find(", policy <test>, overridden by ALLOCSHIM_BACKEND=native, "
                         "ALLOCSHIM_CONF=free_sync=device\n"),
            std::string::npos)
      << summary;
  const auto j = nlohmann::json::parse(core.stats_json());
  EXPECT_EQ(j["policy"], "<test>");
  EXPECT_EQ(j["overrides"], "ALLOCSHIM_BACKEND=native, ALLOCSHIM_CONF=free_sync=device");
  // Without overrides the line is the file alone.
  Core plain(fake.driver(), single(BackendKind::vmm));
  EXPECT_TRUE(plain.summary().starts_with("allocshim: pid ")) << plain.summary();
  EXPECT_NE(plain.summary().find(", policy <test>\n"), std::string::npos) << plain.summary();
}

TEST(Stats, JsonIsValidWhateverBytesThePolicyPathHolds) {
  fake::FakeDriver fake;
  policy::Policy p = single(BackendKind::native);
  p.source = std::string("/tmp/\xff\xfe \"quoted\" back\\slash\ttab\x01.toml");
  Core core(fake.driver(), p);
  const auto j = nlohmann::json::parse(core.stats_json());  // throws on invalid JSON
  const std::string source = j["policy"];
  EXPECT_NE(source.find("\"quoted\" back\\slash\ttab\x01.toml"), std::string::npos) << source;
  EXPECT_TRUE(source.starts_with("/tmp/\xef\xbf\xbd")) << "invalid UTF-8 becomes U+FFFD";
}

}  // namespace
}  // namespace allocshim
