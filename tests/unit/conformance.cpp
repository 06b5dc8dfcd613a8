// The backend conformance suite (see conformance.h): every backend kind, under every free_sync mode,
// must pass each test here, on the fake driver and on a GPU.
#include "conformance.h"

#include <algorithm>
#include <chrono>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <ostream>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "backends/free_sync.h"
#include "core/backend.h"
#include "core/core.h"
#include "base/streams.h"
#include "fake_driver.h"
#include "policy/policy.h"

namespace allocshim::conformance {
namespace {

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Config {
  const char* name;
  BackendKind kind;
  FreeSync sync;
  std::uint64_t release_threshold = policy::kUnlimited;  // the pool's, or the vmm's
  std::uint64_t chunk = 2 * kMiB;
};

std::string config_name(const ::testing::TestParamInfo<Config>& info) { return info.param.name; }
// What test listings and CTest names show for a configuration (gtest would dump its bytes).
void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

const Config kConfigs[] = {
    {"native", BackendKind::native, FreeSync::device},
    {"async_pool_device", BackendKind::async_pool, FreeSync::device},
    {"async_pool_barrier", BackendKind::async_pool, FreeSync::barrier},
    {"async_pool_none", BackendKind::async_pool, FreeSync::none},
    {"async_pool_release_all", BackendKind::async_pool, FreeSync::none, 0},
    {"vmm_device", BackendKind::vmm, FreeSync::device},
    {"vmm_barrier", BackendKind::vmm, FreeSync::barrier},
    {"vmm_none", BackendKind::vmm, FreeSync::none},
    {"vmm_release_all_4m_chunks", BackendKind::vmm, FreeSync::none, 0, 4 * kMiB},
    {"host", BackendKind::host, FreeSync::device},
    {"managed", BackendKind::managed, FreeSync::device},
};

class Conformance : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    std::string why;
    dev_ = make_test_device(why);
    if (!dev_) GTEST_SKIP() << "no GPU/driver: " << why;
    const Config& c = GetParam();
    policy::BackendSpec spec;
    spec.name = c.name;
    spec.kind = c.kind;
    spec.release_threshold = c.release_threshold;
    spec.vmm_release_threshold = c.release_threshold;
    spec.chunk = c.chunk;
    backend_ = make_backend(spec, dev_->driver(), streams_, why);
    ASSERT_NE(backend_, nullptr) << why;
  }

  void TearDown() override {
    if (backend_) {
      for (const auto& [p, b] : live_) backend_->deallocate(p, b, FreeRequest{});
      live_.clear();
    }
    backend_.reset();
    dev_.reset();
  }

  const Driver& d() const { return dev_->driver(); }
  bool pooling() const {
    return GetParam().kind == BackendKind::async_pool || GetParam().kind == BackendKind::vmm;
  }
  // host and managed memory is not device memory the shim holds (reserved() counts none of it).
  bool device_memory() const {
    return GetParam().kind != BackendKind::host && GetParam().kind != BackendKind::managed;
  }
  bool coalesces() const { return GetParam().kind == BackendKind::vmm; }
  // `barrier` frees wait in an epoch that a shortage closes only once it holds enough frees
  // (shortage_frees) or is due: let it be due, so that the next allocation takes them back.
  void age_barrier_frees() const {
    if (GetParam().sync == FreeSync::barrier)
      std::this_thread::sleep_for(std::chrono::nanoseconds(kEpochAgeNs + 200'000));
  }
  const DeviceStats& stats() const { return backend_->stats().device(0); }

  Result alloc(std::size_t size, DevPtr* out, Api api = Api::alloc, Stream stream = kStreamLegacy) {
    AllocRequest req;
    req.size = size;
    req.api = api;
    req.stream = stream;
    std::uint64_t cookie = 0;
    const Result r = backend_->allocate(req, GetParam().sync, out, &cookie);
    if (r == res::ok) {
      std::lock_guard lock(mu_);
      live_[*out] = Block{size, 0, 0, api, GetParam().sync, cookie};
    }
    return r;
  }
  DevPtr must_alloc(std::size_t size) {
    DevPtr p = 0;
    const Result r = alloc(size, &p);
    EXPECT_EQ(r, res::ok) << "allocating " << size << " bytes";
    return p;
  }
  Result free(DevPtr p, FreeRequest req = {}) {
    Block b;
    {
      std::lock_guard lock(mu_);
      auto it = live_.find(p);
      if (it == live_.end()) return res::invalid_value;
      b = it->second;
      live_.erase(it);
    }
    return backend_->deallocate(p, b, req);
  }
  void free_all() {
    std::vector<DevPtr> ptrs;
    for (const auto& [p, b] : live_) ptrs.push_back(p);
    for (DevPtr p : ptrs) EXPECT_EQ(free(p), res::ok);
  }

  std::unique_ptr<TestDevice> dev_;
  StreamTracker streams_;
  std::unique_ptr<Backend> backend_;
  std::mutex mu_;
  std::map<DevPtr, Block> live_;
};

// Sizes around every boundary a backend may have: alignment, size classes, chunks.
const std::size_t kEdgeSizes[] = {1,
                                  255,
                                  256,
                                  257,
                                  1000,
                                  4096,
                                  4097,
                                  5000,
                                  16 * kKiB,
                                  16 * kKiB + 1,
                                  64 * kKiB + 7,
                                  1 * kMiB,
                                  2 * kMiB - 1,
                                  2 * kMiB,
                                  2 * kMiB + 256,
                                  5 * kMiB + 3,
                                  9 * kMiB};

TEST_P(Conformance, BlocksAreAlignedLikeCudaMalloc) {
  for (std::size_t size : kEdgeSizes) {
    const DevPtr p = must_alloc(size);
    EXPECT_NE(p, 0u);
    EXPECT_EQ(p % 256, 0u) << "size " << size;
  }
}

TEST_P(Conformance, ZeroBytesIsInvalidLikeCuMemAlloc) {
  DevPtr p = 0;
  EXPECT_EQ(alloc(0, &p), res::invalid_value);
}

TEST_P(Conformance, AbsurdSizesFailLikeTheDriver) {
  if (dev_->fake() == nullptr) GTEST_SKIP() << "asks the driver for everything it has";
  DevPtr p = 0;
  EXPECT_EQ(alloc(~std::size_t{0} - 100, &p), res::out_of_memory);
  if (GetParam().kind != BackendKind::host) {  // the host's memory is its limit
    EXPECT_EQ(alloc(dev_->capacity() * 2, &p), res::out_of_memory);
  }
  must_alloc(1000);
}

TEST_P(Conformance, LiveBlocksNeverOverlap) {
  std::mt19937 rng(7);
  std::vector<DevPtr> order;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 150; ++i) {
      // Log-uniform sizes from 1 byte to 4 MiB.
      const std::size_t size = std::size_t{1} << (rng() % 22);
      order.push_back(must_alloc(size + rng() % size));
    }
    std::shuffle(order.begin(), order.end(), rng);
    for (std::size_t i = 0; i < order.size() / 3; ++i) EXPECT_EQ(free(order[i]), res::ok);
    order.erase(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(order.size() / 3));
  }
  DevPtr end = 0;
  for (const auto& [p, b] : live_) {  // address order
    EXPECT_GE(p, end) << "block at " << p << " overlaps its predecessor";
    end = p + b.size;
  }
}

TEST_P(Conformance, EveryByteIsUsableAndKeepsItsValue) {
  std::vector<std::pair<DevPtr, std::size_t>> blocks;
  for (std::size_t size : kEdgeSizes) blocks.emplace_back(must_alloc(size), size);
  // All filled first, then all read back: a block overlapping another, or a gap left unmapped,
  // shows as a wrong byte (or a refused copy on the fake).
  for (std::size_t i = 0; i < blocks.size(); ++i)
    ASSERT_EQ(d().memset_d8(blocks[i].first, static_cast<unsigned char>(i + 1), blocks[i].second),
              res::ok);
  std::vector<unsigned char> host;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    host.assign(blocks[i].second, 0);
    ASSERT_EQ(d().memcpy_dtoh(host.data(), blocks[i].first, host.size()), res::ok);
    const auto bad = std::find_if(host.begin(), host.end(), [&](unsigned char c) {
      return c != static_cast<unsigned char>(i + 1);
    });
    EXPECT_EQ(bad, host.end()) << "block of " << blocks[i].second << " bytes, byte "
                               << (bad - host.begin());
  }
}

TEST_P(Conformance, FreedMemoryIsReused) {
  if (!pooling()) GTEST_SKIP() << "native memory goes back to the driver";
  auto cycle = [&] {
    std::vector<DevPtr> v;
    for (int i = 0; i < 8; ++i) v.push_back(must_alloc(1 * kMiB + 512 * i));
    for (DevPtr p : v) EXPECT_EQ(free(p), res::ok);
    age_barrier_frees();
  };
  cycle();
  const std::size_t reserved = backend_->reserved(0);
  const std::uint64_t hits = stats().hits();
  for (int i = 0; i < 20; ++i) cycle();
  if (GetParam().release_threshold == policy::kUnlimited) {
    EXPECT_EQ(backend_->reserved(0), reserved);
    EXPECT_EQ(stats().hits() - hits, 20u * 8) << "every later request is a pool hit";
  }
  EXPECT_EQ(stats().hits() + stats().misses(), stats().allocs());
}

TEST_P(Conformance, GrowsAndShrinksBackToNothing) {
  std::size_t total = 0;
  for (int i = 0; i < 40; ++i) {
    const std::size_t size = (i % 5 == 0) ? 3 * kMiB + 17 : (i % 3 == 0 ? 200 * kKiB : 3000);
    must_alloc(size);
    total += size;
  }
  if (device_memory()) {
    EXPECT_GE(backend_->reserved(0), total);
  }
  EXPECT_EQ(stats().live_bytes(), total);
  free_all();
  EXPECT_EQ(stats().live_bytes(), 0u);
  ASSERT_EQ(backend_->trim(-1), res::ok);
  EXPECT_EQ(backend_->reserved(0), 0u) << "trim gives every cached byte back";
  if (fake::FakeDriver* f = dev_->fake()) {
    EXPECT_EQ(f->used(0), 0u) << "nothing leaked in the driver";
  }
}

TEST_P(Conformance, CoalescesFreedNeighbours) {
  if (!coalesces()) GTEST_SKIP() << "blocks are whole driver allocations";
  // Blocks above the chunk size: a VMM serves smaller ones from other address ranges.
  const std::size_t size = GetParam().chunk + 1 * kMiB;
  std::vector<DevPtr> v;
  for (int i = 0; i < 4; ++i) v.push_back(must_alloc(size));
  must_alloc(size);  // a guard, so the freed run is bounded on both sides
  for (DevPtr p : v) EXPECT_EQ(free(p), res::ok);
  age_barrier_frees();
  const std::size_t reserved = backend_->reserved(0);
  const DevPtr big = must_alloc(4 * size);
  EXPECT_EQ(big, *std::min_element(v.begin(), v.end())) << "served from the merged run";
  if (GetParam().release_threshold == policy::kUnlimited) {
    EXPECT_EQ(backend_->reserved(0), reserved);
  }
}

TEST_P(Conformance, OutOfMemoryReturnsTheNativeErrorAndRecovers) {
  fake::FakeDriver* f = dev_->fake();
  if (f == nullptr) GTEST_SKIP() << "needs the fake's adjustable capacity";
  if (!device_memory())
    GTEST_SKIP() << "limited by host or free memory (host_backend_test, managed_test)";
  must_alloc(4 * kMiB);
  f->set_capacity(0, f->used(0) + 32 * kMiB);
  DevPtr p = 0;
  EXPECT_EQ(alloc(64 * kMiB, &p), res::out_of_memory);
  EXPECT_EQ(stats().failures(), 1u);
  // Nothing was left half-done: what fits still works, and fills the device.
  const DevPtr q = must_alloc(16 * kMiB);
  EXPECT_EQ(d().memset_d8(q, 0x5a, 16 * kMiB), res::ok);
  // Freed pooled memory counts as free for the next request.
  EXPECT_EQ(free(q), res::ok);
  must_alloc(30 * kMiB);
}

TEST_P(Conformance, RetriesOnceWhenTheDriverRefuses) {
  fake::FakeDriver* f = dev_->fake();
  if (f == nullptr) GTEST_SKIP() << "needs the fake's failure injection";
  const fake::FakeOp op =
      GetParam().kind == BackendKind::native       ? fake::FakeOp::mem_alloc
      : GetParam().kind == BackendKind::async_pool ? fake::FakeOp::mem_alloc_from_pool_async
      : GetParam().kind == BackendKind::managed    ? fake::FakeOp::mem_alloc_managed
                                                   : fake::FakeOp::mem_create;
  DevPtr p = 0;
  f->fail_next(op, res::out_of_memory, 1);
  const Result once = alloc(8 * kMiB, &p);
  f->clear_failures();
  if (pooling()) {
    EXPECT_EQ(once, res::ok) << "one refusal is retried after releasing the cache";
  } else {
    EXPECT_EQ(once, res::out_of_memory);
  }
  f->fail_next(op, res::out_of_memory, 2);
  EXPECT_EQ(alloc(32 * kMiB, &p), res::out_of_memory) << "retried once, not forever";
  f->clear_failures();
  f->fail_next(op, res::unknown, 1);
  EXPECT_EQ(alloc(32 * kMiB, &p), res::unknown) << "other errors pass through unchanged";
  f->clear_failures();
  must_alloc(32 * kMiB);
}

TEST_P(Conformance, KeepsStatistics) {
  std::vector<DevPtr> v;
  for (int i = 0; i < 10; ++i) v.push_back(must_alloc(100 * kKiB));
  EXPECT_EQ(stats().allocs(), 10u);
  EXPECT_EQ(stats().live_bytes(), 1000 * kKiB);
  EXPECT_EQ(stats().peak_bytes(), 1000 * kKiB);
  for (DevPtr p : v) EXPECT_EQ(free(p), res::ok);
  must_alloc(100 * kKiB);
  EXPECT_EQ(stats().frees(), 10u);
  EXPECT_EQ(stats().peak_bytes(), 1000 * kKiB);
  std::uint64_t timed = 0;
  for (int i = 0; i < kLatencyBuckets; ++i) timed += stats().latency_bucket(i);
  EXPECT_EQ(timed, stats().timed_calls());
  // Sampled or not, every call is in the histogram (a sample counts for the calls before it) or
  // among the calls since the last sample.
  EXPECT_EQ(timed + stats().untimed(), 21u)
      << "every call is accounted for in the latency histogram";
  EXPECT_GT(timed, 0u) << "the first call is always timed";
  if (pooling()) {
    EXPECT_EQ(stats().hits() + stats().misses(), 11u);
    EXPECT_GE(stats().misses(), 1u);
    EXPECT_GE(stats().peak_reserved_bytes(), stats().reserved_bytes());
    EXPECT_GE(stats().peak_reserved_bytes(), 1000 * kKiB);
  }
}

TEST_P(Conformance, PitchedRequestsGetAPitchAndAllTheirRows) {
  AllocRequest req;
  req.api = Api::pitch;
  req.pitch_width = 1000;
  req.pitch_height = 7;
  req.pitch_element = 4;
  req.size = req.pitch_width * req.pitch_height;  // what the hook layer passes
  std::size_t pitch = 0;
  req.pitch_out = &pitch;
  DevPtr p = 0;
  std::uint64_t cookie = 0;
  ASSERT_EQ(backend_->allocate(req, GetParam().sync, &p, &cookie), res::ok);
  live_[p] = Block{req.size, 0, 0, Api::pitch, GetParam().sync, cookie};
  EXPECT_GE(pitch, 1000u);
  EXPECT_EQ(pitch % 256, 0u);
  EXPECT_EQ(d().memset_d8(p, 3, pitch * 7), res::ok) << "every row, at the returned pitch";
  req.pitch_element = 3;
  EXPECT_EQ(backend_->allocate(req, GetParam().sync, &p, &cookie), res::invalid_value)
      << "element sizes other than 4, 8, 16 are refused as the driver refuses them";
}

TEST_P(Conformance, StreamOrderedRequestsWork) {
  DevPtr p = 0;
  ASSERT_EQ(alloc(3 * kMiB, &p, Api::async, kStreamLegacy), res::ok);
  EXPECT_EQ(d().memset_d8(p, 1, 3 * kMiB), res::ok);
  FreeRequest fr;
  fr.async = true;
  fr.stream = kStreamLegacy;
  EXPECT_EQ(free(p, fr), res::ok);
  ASSERT_EQ(alloc(3 * kMiB, &p, Api::async, kStreamLegacy), res::ok);
  EXPECT_EQ(d().memset_d8(p, 2, 3 * kMiB), res::ok);
}

TEST_P(Conformance, InteriorPointersFindTheirBlock) {
  const DevPtr p = must_alloc(40 * kKiB);
  const DevPtr q = must_alloc(1000);
  DevPtr base = 0;
  std::size_t size = 0;
  if (GetParam().kind != BackendKind::vmm && GetParam().kind != BackendKind::host) {
    EXPECT_FALSE(backend_->find(p + 10, &base, &size))
        << "the driver answers for whole allocations";
    return;
  }
  ASSERT_TRUE(backend_->find(p + 40 * kKiB - 1, &base, &size));
  EXPECT_EQ(base, p);
  EXPECT_GE(size, 40 * kKiB);
  ASSERT_TRUE(backend_->find(q + 999, &base, &size));
  EXPECT_EQ(base, q);
  EXPECT_GE(size, 1000u);
  EXPECT_EQ(free(q), res::ok);
  EXPECT_FALSE(backend_->find(q, &base, &size)) << "a freed block is not found";
}

TEST_P(Conformance, ThirtyTwoThreadsChurnWithoutLosingOrSharingABlock) {
  constexpr int kThreads = 32;
  const int iterations = dev_->fake() != nullptr ? 400 : 200;
  std::mutex owners_mu;
  std::map<DevPtr, DevPtr> owners;  // live block -> its end: any overlap is caught at insertion
  std::atomic<int> errors{0};
  auto worker = [&](int t) {
    dev_->bind_thread();
    std::mt19937 rng(static_cast<unsigned>(t) * 7919u + 1);
    std::vector<std::pair<DevPtr, std::uint64_t>> mine;  // block and its tag
    std::uint64_t seq = 0;
    for (int i = 0; i < iterations; ++i) {
      const bool grow = mine.empty() || (mine.size() < 8 && rng() % 2 == 0);
      if (grow) {
        std::size_t size = 8 + rng() % (rng() % 8 == 0 ? 3 * kMiB : 64 * kKiB);
        DevPtr p = 0;
        if (alloc(size, &p) != res::ok) {
          ++errors;
          continue;
        }
        {
          std::lock_guard lock(owners_mu);
          auto next = owners.lower_bound(p);
          const bool clash = (next != owners.end() && next->first < p + size) ||
                             (next != owners.begin() && std::prev(next)->second > p);
          if (clash) ++errors;
          owners[p] = p + size;
        }
        const std::uint64_t tag = (static_cast<std::uint64_t>(t) << 32) | ++seq;
        // The tag goes at both ends: a block handed to two threads loses one of them.
        if (d().memcpy_htod(p, &tag, std::min<std::size_t>(size, sizeof tag)) != res::ok) ++errors;
        if (size >= 2 * sizeof tag &&
            d().memcpy_htod(p + size - sizeof tag, &tag, sizeof tag) != res::ok)
          ++errors;
        mine.emplace_back(p, tag);
      } else {
        const std::size_t k = rng() % mine.size();
        const auto [p, tag] = mine[k];
        mine[k] = mine.back();
        mine.pop_back();
        std::size_t size = 0;
        {
          std::lock_guard lock(owners_mu);
          size = owners[p] - p;
          owners.erase(p);
        }
        std::uint64_t head = 0, tail = 0;
        const std::size_t n = std::min<std::size_t>(size, sizeof tag);
        d().memcpy_dtoh(&head, p, n);
        if (std::memcmp(&head, &tag, n) != 0) ++errors;
        if (size >= 2 * sizeof tag) {
          d().memcpy_dtoh(&tail, p + size - sizeof tag, sizeof tag);
          if (tail != tag) ++errors;
        }
        if (free(p) != res::ok) ++errors;
      }
    }
    for (const auto& [p, tag] : mine) {
      {
        std::lock_guard lock(owners_mu);
        owners.erase(p);
      }
      if (free(p) != res::ok) ++errors;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_TRUE(live_.empty());
  EXPECT_EQ(stats().allocs(), stats().frees()) << "every block freed exactly once";
  EXPECT_EQ(stats().live_bytes(), 0u);
  ASSERT_EQ(backend_->trim(-1), res::ok);
  EXPECT_EQ(backend_->reserved(0), 0u);
  if (fake::FakeDriver* f = dev_->fake()) {
    EXPECT_EQ(f->used(0), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(kConfigs), config_name);

}  // namespace
}  // namespace allocshim::conformance
