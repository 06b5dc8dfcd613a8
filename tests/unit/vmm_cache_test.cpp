// The VMM backend's per-thread caches of freed blocks (backends/vmm_cache.h): the cache on its own
// (take, put, eviction, flush, concurrent flushes while threads take and park), and in the backend
// (a hit takes no lock and makes no driver call; barrier frees and release thresholds park nothing;
// trim, growth and another size take parked blocks back; 24 threads of churn lose nothing).
//
// Thread ids are the statistics' stripes, given out once per process: the multi-thread backend test
// comes first in this binary so that its threads still get caches.
#include "backends/vmm_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "backends/vmm.h"
#include "core/core.h"
#include "fake_driver.h"

namespace allocshim {
namespace {

using fake::FakeDriver;
using fake::FakeOp;
using vmm::ThreadCache;
constexpr std::size_t kMiB = fake::kMiB;

class VmmCacheTest : public ::testing::Test {
 protected:
  static fake::FakeConfig config() {
    fake::FakeConfig c;
    c.capacity = 64ull * fake::kGiB;  // memfd-backed: only bytes touched cost host memory
    return c;
  }
  void make(policy::BackendSpec spec = {}) {
    spec.kind = BackendKind::vmm;
    spec.name = "vmm";
    std::string why;
    backend = make_backend(spec, d, streams, why);
    ASSERT_NE(backend, nullptr) << why;
  }
  void TearDown() override { backend.reset(); }

  DevPtr alloc(std::size_t size, FreeSync sync = FreeSync::none) {
    AllocRequest req;
    req.size = size;
    DevPtr p = 0;
    std::uint64_t cookie = 0;
    const Result r = backend->allocate(req, sync, &p, &cookie);
    EXPECT_EQ(r, res::ok) << size << " bytes";
    std::lock_guard lock(mutex);
    if (r == res::ok) {
      EXPECT_EQ(blocks.count(p), 0u) << "handed out twice: " << p;
      blocks[p] = Block{size, 0, 0, Api::alloc, sync, cookie};
    }
    return p;
  }
  void free(DevPtr p) {
    Block b;
    {
      std::lock_guard lock(mutex);
      b = blocks.at(p);
      blocks.erase(p);
    }
    EXPECT_EQ(backend->deallocate(p, b, FreeRequest{}), res::ok);
  }
  VmmInfo info() const { return vmm_info(*backend, 0); }

  FakeDriver fake{config()};
  const Driver& d = fake.driver();
  StreamTracker streams;
  std::unique_ptr<Backend> backend;
  std::mutex mutex;
  std::map<DevPtr, Block> blocks;
};

// First in the binary (see the top): 24 threads churn blocks of a few sizes, each block filled with
// its thread's tag while live and checked before it is freed; a block handed out twice, or reused
// while another thread still holds it, fails the tag check or alloc()'s uniqueness check.
TEST_F(VmmCacheTest, ThreadsChurningLoseNothingAndShareNothing) {
  make();
  constexpr int kThreads = 24, kSteps = 3000;
  const std::size_t sizes[] = {256, 4096, 100 * 1024, 3 * kMiB};
  std::vector<std::thread> pool;
  std::atomic<int> mismatches{0};
  std::atomic<int> finished{0};
  std::atomic<bool> leave{false};
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<std::pair<DevPtr, std::size_t>> live;
      const auto tag = static_cast<unsigned char>(t + 1);
      for (int i = 0; i < kSteps; ++i) {
        if (live.size() < 4 && (live.empty() || rng() % 2)) {
          const std::size_t size = sizes[rng() % 4];
          const DevPtr p = alloc(size);
          // The first and last bytes are enough to catch an overlap with another live block.
          d.memset_d8(p, tag, 1);
          d.memset_d8(p + size - 1, tag, 1);
          live.emplace_back(p, size);
        } else {
          const std::size_t k = rng() % live.size();
          const auto [p, size] = live[k];
          unsigned char first = 0, last = 0;
          d.memcpy_dtoh(&first, p, 1);
          d.memcpy_dtoh(&last, p + size - 1, 1);
          if (first != tag || last != tag) mismatches.fetch_add(1);
          free(p);
          live.erase(live.begin() + static_cast<long>(k));
        }
      }
      for (const auto& [p, size] : live) free(p);
      finished.fetch_add(1);
      while (!leave.load()) std::this_thread::yield();
    });
  }
  while (finished.load() < kThreads) std::this_thread::yield();
  EXPECT_GT(info().parked, 0u) << "the threads parked blocks (else this test covers nothing)";
  leave = true;
  for (auto& th : pool) th.join();
  EXPECT_EQ(info().parked, 0u) << "a thread that exits hands back what it parked";
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_TRUE(blocks.empty());
  const DeviceStats& s = backend->stats().device(0);
  EXPECT_EQ(s.allocs(), s.frees());
  EXPECT_EQ(s.live_bytes(), 0u);
  ASSERT_EQ(backend->trim(0), res::ok);
  EXPECT_EQ(backend->reserved(0), 0u) << "every block came back: all memory could be given back";
  EXPECT_EQ(fake.used(0), 0u);
}

TEST(ThreadCache, TakesOnlyWhatItsThreadParkedOfTheSameSize) {
  ThreadCache c;
  ThreadCache::Parked out, victim;
  EXPECT_FALSE(c.take(0, 256, &out));
  EXPECT_EQ(c.put(0, 256, {0x1000, 11}, &victim), ThreadCache::Put::parked);
  EXPECT_FALSE(c.take(1, 256, &out)) << "another thread's cache";
  EXPECT_FALSE(c.take(0, 512, &out)) << "another size";
  EXPECT_TRUE(c.holds(0x1000));
  ASSERT_TRUE(c.take(0, 256, &out));
  EXPECT_EQ(out.ptr, 0x1000u);
  EXPECT_EQ(out.cookie, 11u);
  EXPECT_FALSE(c.take(0, 256, &out)) << "taken once";
  EXPECT_FALSE(c.holds(0x1000));
}

TEST(ThreadCache, EvictsTheOldestWhenFull) {
  ThreadCache c;
  ThreadCache::Parked victim;
  for (int i = 0; i < ThreadCache::kEntries; ++i)
    EXPECT_EQ(c.put(3, 256, {0x1000u + 0x100u * static_cast<DevPtr>(i), 0}, &victim), ThreadCache::Put::parked);
  EXPECT_EQ(c.put(3, 256, {0x9000, 0}, &victim), ThreadCache::Put::evicted);
  EXPECT_EQ(victim.ptr, 0x1000u);
  EXPECT_EQ(c.parked(), static_cast<std::size_t>(ThreadCache::kEntries));
  EXPECT_TRUE(c.holds(0x9000));
  EXPECT_FALSE(c.holds(0x1000));
}

TEST(ThreadCache, FlushAndReclaimTakeParkedBlocks) {
  ThreadCache c;
  ThreadCache::Parked victim;
  c.put(0, 256, {0x1000, 0}, &victim);
  c.put(1, 256, {0x2000, 0}, &victim);
  c.put(1, 512, {0x3000, 0}, &victim);
  std::set<DevPtr> got;
  c.reclaim_own(1, [&](const ThreadCache::Parked& p) { got.insert(p.ptr); });
  EXPECT_EQ(got, (std::set<DevPtr>{0x2000, 0x3000}));
  EXPECT_EQ(c.flush([&](const ThreadCache::Parked& p) { got.insert(p.ptr); }), 1u);
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(c.parked(), 0u);
}

// Owners park and take numbered blocks while another thread flushes without pause: every block
// ends up exactly once with an owner, with the flusher, or still parked.
TEST(ThreadCache, ConcurrentFlushesNeitherLoseNorDuplicate) {
  ThreadCache c;
  constexpr int kOwners = 8, kBlocks = 20000;
  std::atomic<bool> done{false};
  std::vector<std::vector<DevPtr>> owned(kOwners);
  std::vector<DevPtr> flushed;
  std::thread flusher([&] {
    while (!done.load()) c.flush([&](const ThreadCache::Parked& p) { flushed.push_back(p.ptr); });
  });
  std::vector<std::thread> owners;
  for (int t = 0; t < kOwners; ++t) {
    owners.emplace_back([&, t] {
      ThreadCache::Parked out, victim;
      for (int i = 0; i < kBlocks; ++i) {
        const DevPtr id = (static_cast<DevPtr>(t) << 32) | static_cast<DevPtr>(i + 1);
        const std::size_t key = 256u << (i % 3);
        switch (c.put(t, key, {id, 0}, &victim)) {
          case ThreadCache::Put::parked: break;
          case ThreadCache::Put::evicted: owned[t].push_back(victim.ptr); break;
          case ThreadCache::Put::refused: owned[t].push_back(id); break;  // kept by its owner
        }
        if (i % 2 && c.take(t, key, &out)) owned[t].push_back(out.ptr);
      }
    });
  }
  for (auto& th : owners) th.join();
  done = true;
  flusher.join();
  std::multiset<DevPtr> all(flushed.begin(), flushed.end());
  for (const auto& v : owned) all.insert(v.begin(), v.end());
  c.flush([&](const ThreadCache::Parked& p) { all.insert(p.ptr); });
  std::set<DevPtr> unique(all.begin(), all.end());
  EXPECT_EQ(unique.size(), all.size()) << "a block came back twice";
  EXPECT_EQ(all.size(), static_cast<std::size_t>(kOwners) * kBlocks) << "a block was lost";
}

TEST_F(VmmCacheTest, AHitTakesTheParkedBlockWithoutTheHeap) {
  make();
  const DevPtr p = alloc(64 * kMiB);
  free(p);
  EXPECT_EQ(info().parked, 1u);
  EXPECT_EQ(info().heap_free_blocks, 1u) << "the block stays out of the heap: only the range's tail is free";
  fake.reset_calls();
  EXPECT_EQ(alloc(64 * kMiB), p);
  EXPECT_EQ(info().parked, 0u);
  EXPECT_EQ(fake.total_calls(), 0u);
  free(p);
}

TEST_F(VmmCacheTest, DeviceFreesParkAfterTheSyncBarrierFreesNever) {
  make();
  free(alloc(kMiB, FreeSync::device));
  EXPECT_EQ(fake.calls(FakeOp::ctx_synchronize), 1u);
  EXPECT_EQ(info().parked, 1u);
  const DevPtr p = alloc(2 * kMiB, FreeSync::barrier);
  EXPECT_EQ(info().parked, 0u) << "the 1 MiB block went back to the heap at the 2 MiB request";
  free(p);
  EXPECT_EQ(info().parked, 0u) << "a barrier free waits for its events, never in a cache";
  EXPECT_EQ(fake.calls(FakeOp::event_record), 1u);
}

TEST_F(VmmCacheTest, NothingParksUnderAReleaseThreshold) {
  policy::BackendSpec spec;
  spec.vmm_release_threshold = 0;
  make(spec);
  free(alloc(8 * kMiB));
  EXPECT_EQ(info().parked, 0u);
  EXPECT_EQ(fake.used(0), 0u) << "freed memory went back at once, as the threshold says";
}

TEST_F(VmmCacheTest, TrimTakesParkedBlocksBack) {
  make();
  free(alloc(8 * kMiB));
  EXPECT_EQ(info().parked, 1u);
  EXPECT_EQ(fake.used(0), 8 * kMiB);
  ASSERT_EQ(backend->trim(0), res::ok);
  EXPECT_EQ(info().parked, 0u);
  EXPECT_EQ(fake.used(0), 0u);
}

TEST_F(VmmCacheTest, AnotherSizeFindsTheHeapAsWithoutTheCache) {
  make();
  const DevPtr a = alloc(kMiB);
  free(a);
  EXPECT_EQ(alloc(2 * kMiB), a) << "the parked 1 MiB went back and merged: the heap's first choice";
  EXPECT_EQ(info().parked, 0u);
}

TEST_F(VmmCacheTest, GrowthTakesBackWhatOtherThreadsParked) {
  make();
  const DevPtr a = alloc(64 * kMiB);
  free(a);  // parked in this thread's cache
  ASSERT_EQ(info().parked, 1u);
  fake.set_capacity(0, fake.used(0));  // no memory beyond what the region holds
  fake.reset_calls();
  DevPtr b = 0;
  std::thread other([&] { b = alloc(48 * kMiB); });
  other.join();
  EXPECT_EQ(b, a) << "the parked block went back to the heap before the region would grow";
  EXPECT_EQ(fake.calls(FakeOp::mem_create), 0u);
  EXPECT_EQ(info().parked, 0u);
  free(b);
}

TEST_F(VmmCacheTest, EachThreadParksAtMostItsEntries) {
  make();
  std::vector<DevPtr> v;
  for (int i = 0; i < ThreadCache::kEntries + 3; ++i) v.push_back(alloc((static_cast<std::size_t>(i) + 1) * kMiB));
  for (DevPtr p : v) free(p);
  EXPECT_EQ(info().parked, static_cast<std::size_t>(ThreadCache::kEntries));
}

}  // namespace
}  // namespace allocshim
