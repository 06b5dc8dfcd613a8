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
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "backends/vmm.h"
#include "core/core.h"
#include "core_fixture.h"
#include "fake_driver.h"

namespace allocshim {
namespace {

using vmm::CacheClasses;
using vmm::ThreadCache;

class VmmCacheTest : public testing::BackendFixture<> {
 protected:
  VmmCacheTest() : BackendFixture(devices(2, 64 * kGiB)) {}
  void make(policy::BackendSpec spec = {}) { BackendFixture::make(BackendKind::vmm, spec); }
  DevPtr alloc(std::size_t size, FreeSync sync = FreeSync::none, int device = 0) {
    return alloc_on(size, sync, device);
  }
  VmmInfo info(int device = 0) const { return vmm_info(*backend, device); }
  // The bounds of a cache with the default thread_cache.
  static const ThreadCache& defaults() {
    static const ThreadCache c;
    return c;
  }
  // Another thread allocates under the device lock: size classes on (vmm_cache.h).
  void share(int device = 0) {
    free(alloc(5 * kMiB, FreeSync::none, device));
    std::thread([&] { free(alloc(5 * kMiB, FreeSync::none, device)); }).join();
    ASSERT_TRUE(info(device).classed);
  }
  // The size of the block at `p`, as pointer queries see it.
  std::size_t block_bytes(DevPtr p) const {
    DevPtr base = 0;
    std::size_t size = 0;
    EXPECT_TRUE(backend->find(p, &base, &size));
    EXPECT_EQ(base, p);
    return size;
  }
  // After the threads are gone: every block was freed, and a trim gives every byte back to the
  // driver.
  void expect_everything_came_back() {
    EXPECT_TRUE(blocks.empty());
    const DeviceStats& s = backend->stats().device(0);
    EXPECT_EQ(s.allocs(), s.frees());
    EXPECT_EQ(s.live_bytes(), 0u);
    ASSERT_EQ(backend->trim(0), res::ok);
    EXPECT_EQ(backend->reserved(0), 0u) << "every block came back: all memory could be given back";
    EXPECT_EQ(fake.used(0), 0u);
  }
};

// 24 threads churn blocks of a few fixed sizes and of random ones (size classes are on from the
// second thread), each block filled with its thread's tag while live and checked before it is
// freed; a block handed out twice, or reused while another thread still holds it, fails the tag
// check or alloc()'s uniqueness check.
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
          const std::size_t size =
              rng() % 2 ? sizes[rng() % 4]
                        : static_cast<std::size_t>(std::exp2(8 + 14.0 * (rng() % 10000) / 1e4));
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
  EXPECT_TRUE(info().classed);
  leave = true;
  for (auto& th : pool) th.join();
  EXPECT_EQ(info().parked, info().central) << "a thread that exits hands back what it parked";
  EXPECT_EQ(mismatches.load(), 0);
  expect_everything_came_back();
}

TEST(ThreadCache, TakesOnlyWhatItsThreadParkedOfTheSameSize) {
  ThreadCache c;
  ThreadCache::Parked out{}, victim{};
  ThreadCache::Victims victims;
  EXPECT_FALSE(c.take(0, 256, false, &out));
  EXPECT_EQ(c.put(0, 256, false, {0x1000, 11}, &victims), ThreadCache::Put::parked);
  EXPECT_EQ(victims.count, 0);
  EXPECT_FALSE(c.take(1, 256, false, &out)) << "another thread's cache";
  EXPECT_FALSE(c.take(0, 512, false, &out)) << "another size";
  EXPECT_TRUE(c.holds(0x1000));
  ASSERT_TRUE(c.take(0, 256, false, &out));
  EXPECT_EQ(out.ptr, 0x1000u);
  EXPECT_EQ(out.cookie, 11u);
  EXPECT_FALSE(c.take(0, 256, false, &out)) << "taken once";
  EXPECT_FALSE(c.holds(0x1000));
  (void)victim;
}

TEST(ThreadCache, ExactEntriesSwapOutTheOldestWhenFull) {
  ThreadCache c;
  ThreadCache::Victims victims;
  for (int i = 0; i < ThreadCache::kExact; ++i)
    EXPECT_EQ(c.put(3, 256, false, {0x1000u + 0x100u * static_cast<DevPtr>(i), 0}, &victims),
              ThreadCache::Put::parked);
  EXPECT_EQ(victims.count, 0);
  EXPECT_EQ(c.put(3, 256, false, {0x9000, 0}, &victims), ThreadCache::Put::parked);
  ASSERT_EQ(victims.count, 1);
  EXPECT_EQ(victims.blocks[0].ptr, 0x1000u);
  EXPECT_EQ(c.parked(), static_cast<std::size_t>(ThreadCache::kExact));
  EXPECT_TRUE(c.holds(0x9000));
  EXPECT_FALSE(c.holds(0x1000));
}

// Every request size up to 4 MiB has a class at most 1/8 larger, classes are ordered and each
// class is its own size's class. The mean rounding over sizes spread evenly in log scale (the
// churn benchmark's) is printed: the internal fragmentation the classes cost.
TEST(CacheClasses, RoundUpByLessThanAnEighth) {
  int last = -1;
  for (std::size_t b = 256; b <= CacheClasses::kMaxClassed; b += 256) {
    const int c = CacheClasses::of(b);
    ASSERT_GE(c, last) << b;
    ASSERT_LT(c, CacheClasses::kCount) << b;
    last = c;
    ASSERT_GE(CacheClasses::bytes(c), b);
    ASSERT_LT(CacheClasses::bytes(c) - b, b / 8 + 1) << b;
    ASSERT_EQ(CacheClasses::bytes(c) % 256, 0u);
    ASSERT_EQ(CacheClasses::of(CacheClasses::bytes(c)), c);
    ASSERT_TRUE(CacheClasses::is_class_size(CacheClasses::bytes(c)));
    if (c > 0) {
      ASSERT_GT(b, CacheClasses::bytes(c - 1)) << "the smallest class that fits";
    }
  }
  EXPECT_EQ(last, CacheClasses::kCount - 1);
  EXPECT_FALSE(CacheClasses::is_class_size(CacheClasses::kMaxClassed + 256));
  double sum = 0;
  constexpr int kSamples = 100000;
  for (int i = 0; i < kSamples; ++i) {
    const double bytes = std::exp2(8 + 14.0 * (i + 0.5) / kSamples);
    const std::size_t req = (static_cast<std::size_t>(bytes) + 255) / 256 * 256;
    sum += static_cast<double>(CacheClasses::round(req)) / static_cast<double>(req);
  }
  std::printf("class rounding, sizes 256 B..4 MiB log-uniform (256-aligned): mean %.4f\n",
              sum / kSamples);
  EXPECT_LT(sum / kSamples, 1.05);
}

TEST(ThreadCache, ClassListsServeTheirClassOrTheNextAndStayBounded) {
  ThreadCache c;
  ThreadCache::Victims victims;
  ThreadCache::Parked out{};
  const std::size_t a = CacheClasses::round(100 * 1024),
                    b = CacheClasses::bytes(CacheClasses::of(a) + 1);
  const std::size_t far = CacheClasses::bytes(CacheClasses::of(a) + 2);
  EXPECT_EQ(c.put(0, a, true, {0xa000, 1}, &victims), ThreadCache::Put::parked);
  EXPECT_FALSE(c.take(0, a, false, &out)) << "exact entries hold nothing";
  EXPECT_FALSE(c.take(0, b, true, &out)) << "a smaller class never serves a larger request";
  ASSERT_TRUE(c.take(0, a, true, &out));
  EXPECT_EQ(out.ptr, 0xa000u);
  EXPECT_EQ(c.put(0, b, true, {0xb000, 2}, &victims), ThreadCache::Put::parked);
  EXPECT_EQ(c.put(0, far, true, {0xc000, 3}, &victims), ThreadCache::Put::parked);
  ASSERT_TRUE(c.take(0, a, true, &out)) << "the next class up serves";
  EXPECT_EQ(out.ptr, 0xb000u);
  EXPECT_FALSE(c.take(0, a, true, &out)) << "two classes up does not";
  // A size that is no class's goes among the exact entries even when classed.
  EXPECT_EQ(c.put(0, a + 256, true, {0xd000, 4}, &victims), ThreadCache::Put::parked);
  EXPECT_TRUE(c.take(0, a + 256, false, &out));
  EXPECT_EQ(victims.count, 0);
  // Bytes: 1 MiB blocks until the bound; the victims come back, the rest stay within it.
  std::size_t handed_back = 0;
  constexpr int kBlocks = 200;
  for (int i = 0; i < kBlocks; ++i) {
    victims.count = 0;
    ASSERT_EQ(c.put(1, kMiB, true, {0x100000000u + kMiB * static_cast<DevPtr>(i), 0}, &victims),
              ThreadCache::Put::parked);
    handed_back += static_cast<std::size_t>(victims.count);
  }
  const int mib = CacheClasses::of(kMiB);
  EXPECT_EQ(c.parked() - 1 + handed_back, static_cast<std::size_t>(kBlocks))
      << "parked or handed back";
  EXPECT_EQ(c.central_parked(), static_cast<std::size_t>(c.central_cap(mib)))
      << "overflow fills the central list first";
  EXPECT_LE(c.parked() - 1 - c.central_parked(), static_cast<std::size_t>(c.class_cap(mib)));
  // Another thread's miss of the class takes from the central list, and half of what is left.
  EXPECT_TRUE(c.take(2, kMiB, true, &out));
  EXPECT_EQ(c.central_parked(), static_cast<std::size_t>(c.central_cap(mib) - 1) / 2 +
                                    static_cast<std::size_t>(c.central_cap(mib) - 1) % 2);
  EXPECT_TRUE(c.take(2, kMiB, true, &out)) << "from its own list now";
}

// Many small blocks of many classes: the entries run out before the bytes do; the fullest lists
// make room, and every block is parked, in the central lists or handed back, once.
TEST(ThreadCache, EntriesRunningOutLoseNothing) {
  ThreadCache c;
  ThreadCache::Victims victims;
  std::set<DevPtr> out;
  constexpr int kPuts = 4000;
  for (int i = 0; i < kPuts; ++i) {
    victims.count = 0;
    const DevPtr p = 0x100000000u + 0x10000u * static_cast<DevPtr>(i);
    if (c.put(5, CacheClasses::bytes(i % 24), true, {p, 0}, &victims) == ThreadCache::Put::refused)
      out.insert(p);
    for (int v = 0; v < victims.count; ++v)
      out.insert(victims.blocks[static_cast<std::size_t>(v)].ptr);
  }
  EXPECT_LE(c.parked() - c.central_parked(), static_cast<std::size_t>(ThreadCache::kEntries));
  EXPECT_GE(c.parked() - c.central_parked(), static_cast<std::size_t>(ThreadCache::kEntries) / 2)
      << "they ran out";
  c.flush(true,
          [&](const ThreadCache::Parked& p) { EXPECT_TRUE(out.insert(p.ptr).second) << "twice"; });
  EXPECT_EQ(out.size(), static_cast<std::size_t>(kPuts)) << "a block was lost";
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
    while (!done.load())
      c.flush(true, [&](const ThreadCache::Parked& p) { flushed.push_back(p.ptr); });
  });
  std::vector<std::thread> owners;
  for (int t = 0; t < kOwners; ++t) {
    owners.emplace_back([&, t] {
      ThreadCache::Parked out{};
      ThreadCache::Victims victims;
      for (int i = 0; i < kBlocks; ++i) {
        const DevPtr id = (static_cast<DevPtr>(t) << 32) | static_cast<DevPtr>(i + 1);
        const std::size_t key = i % 4 == 3 ? 8 * kMiB : CacheClasses::bytes(i % 3 * 20);
        victims.count = 0;
        if (c.put(t, key, i % 2 == 0, {id, 0}, &victims) == ThreadCache::Put::refused)
          owned[t].push_back(id);
        for (int v = 0; v < victims.count; ++v)
          owned[t].push_back(victims.blocks[static_cast<std::size_t>(v)].ptr);
        if (i % 2 && c.take(t, key, key <= CacheClasses::kMaxClassed, &out))
          owned[t].push_back(out.ptr);
      }
    });
  }
  for (auto& th : owners) th.join();
  done = true;
  flusher.join();
  std::multiset<DevPtr> all(flushed.begin(), flushed.end());
  for (const auto& v : owned) all.insert(v.begin(), v.end());
  c.flush(true, [&](const ThreadCache::Parked& p) { all.insert(p.ptr); });
  std::set<DevPtr> unique(all.begin(), all.end());
  EXPECT_EQ(unique.size(), all.size()) << "a block came back twice";
  EXPECT_EQ(all.size(), static_cast<std::size_t>(kOwners) * kBlocks) << "a block was lost";
}

TEST_F(VmmCacheTest, AHitTakesTheParkedBlockWithoutTheHeap) {
  make();
  const DevPtr p = alloc(64 * kMiB);
  free(p);
  EXPECT_EQ(info().parked, 1u);
  EXPECT_EQ(info().heap_free_blocks, 1u)
      << "the block stays out of the heap: only the range's tail is free";
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
  EXPECT_EQ(info().pending, 1u) << "in the open epoch";
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

TEST_F(VmmCacheTest, EachThreadParksAtMostItsExactEntries) {
  make();
  std::vector<DevPtr> v;
  for (int i = 0; i < ThreadCache::kExact + 3; ++i)
    v.push_back(alloc((static_cast<std::size_t>(i) + 1) * kMiB));
  for (DevPtr p : v) free(p);
  EXPECT_EQ(info().parked, static_cast<std::size_t>(ThreadCache::kExact));
}

// ---- Size classes (on once a second thread allocates) -----------------------------------------

TEST_F(VmmCacheTest, ClassesStartWhenASecondThreadAllocates) {
  make();
  free(alloc(kMiB));
  free(alloc(3 * kMiB));
  EXPECT_FALSE(info().classed) << "one thread: exact entries only, the heap's placement as before";
  share();
  EXPECT_FALSE(info(1).classed) << "per device";
}

// Random sizes from one thread with classes on: every block is at least the request and at most
// the next class up from the request's class, and the thread mostly hits without the lock.
TEST_F(VmmCacheTest, AClassHitIsOfTheRequestsClassOrTheNext) {
  make();
  share();
  std::mt19937 rng(7);
  std::vector<std::pair<DevPtr, std::size_t>> live;
  const std::uint64_t locked = info().locked_calls;
  constexpr int kPairs = 20000;
  int wrong = 0;
  for (int i = 0; i < kPairs + 4; ++i) {
    if (live.size() == 4) {
      const std::size_t k = rng() % 4;
      free(live[k].first);
      live.erase(live.begin() + static_cast<long>(k));
    }
    const auto size = static_cast<std::size_t>(std::exp2(8 + 14.0 * (rng() % 10000) / 1e4));
    const DevPtr p = alloc(size);
    const int cls = CacheClasses::of((size + 255) / 256 * 256);
    const std::size_t got = block_bytes(p);
    if (got != CacheClasses::bytes(cls) && got != CacheClasses::bytes(cls + 1)) ++wrong;
    live.emplace_back(p, size);
  }
  EXPECT_EQ(wrong, 0) << "a block of another size than the request's class or the next";
  const double rate = static_cast<double>(info().locked_calls - locked) / (2.0 * kPairs);
  std::printf(
      "classes, one thread, 4 live blocks of 256 B..4 MiB: %.2f%% of calls took the lock, %zu KiB parked\n",
      100 * rate, info().parked_bytes >> 10);
  EXPECT_LT(rate, 0.10);
  for (const auto& [p, size] : live) free(p);
}

TEST_F(VmmCacheTest, AClassHitTakesNoLockAndMakesNoDriverCall) {
  make();
  share();
  free(alloc(300 * 1024));
  const std::uint64_t locked = info().locked_calls;
  fake.reset_calls();
  for (int i = 0; i < 1000; ++i) free(alloc(280 * 1024 + static_cast<std::size_t>(i % 16) * 256));
  EXPECT_EQ(info().locked_calls, locked);
  EXPECT_EQ(fake.total_calls(), 0u);
}

// Each device has its own caches: a block parked on device 0 never serves device 1.
TEST_F(VmmCacheTest, AClassHitIsNeverABlockOfAnotherDevice) {
  make();
  fake.set_current_device(1);
  free(alloc(kMiB, FreeSync::none, 1));
  fake.set_current_device(0);
  share(0);
  share(1);
  std::mt19937 rng(3);
  int foreign = 0;
  for (int i = 0; i < 4000; ++i) {
    const int dev = i % 2;
    const auto size = static_cast<std::size_t>(std::exp2(8 + 14.0 * (rng() % 10000) / 1e4));
    const DevPtr p = alloc(size, FreeSync::none, dev);
    if (!fake.has_access(p, dev, true) || fake.has_access(p, 1 - dev, false)) ++foreign;
    free(p);
  }
  EXPECT_EQ(foreign, 0);
  EXPECT_GT(info(0).parked, 0u);
  EXPECT_GT(info(1).parked, 0u);
}

// Producer threads allocate, consumer threads free (every free is from another thread than the
// allocation): nothing is lost, each consumer parks within its bound, and everything can be given
// back at the end.
TEST_F(VmmCacheTest, FreesFromOtherThreadsLoseNoBytes) {
  make();
  share();
  constexpr int kPairs = 4, kBlocks = 3000;
  std::mutex m;
  std::vector<std::pair<DevPtr, std::size_t>> queue;
  std::atomic<int> producing{kPairs};
  std::atomic<std::size_t> most_parked{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kPairs; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      for (int i = 0; i < kBlocks; ++i) {
        const auto size = static_cast<std::size_t>(std::exp2(8 + 14.0 * (rng() % 10000) / 1e4));
        const DevPtr p = alloc(size);
        d.memset_d8(p + size - 1, static_cast<unsigned char>(t + 1), 1);
        std::lock_guard lock(m);
        queue.emplace_back(p, size);
      }
      producing.fetch_sub(1);
    });
    pool.emplace_back([&, t] {
      for (;;) {
        std::pair<DevPtr, std::size_t> b{0, 0};
        {
          std::lock_guard lock(m);
          if (!queue.empty()) {
            b = queue.back();
            queue.pop_back();
          }
        }
        if (b.first == 0) {
          if (producing.load() == 0) break;
          std::this_thread::yield();
          continue;
        }
        free(b.first);
      }
      const std::size_t parked = info().parked_bytes;
      std::size_t seen = most_parked.load();
      while (parked > seen && !most_parked.compare_exchange_weak(seen, parked)) {}
      (void)t;
    });
  }
  for (auto& th : pool) th.join();
  // Each consumer parks at most thread_cache bytes of classed blocks and kExact larger ones (none
  // here).
  EXPECT_LE(most_parked.load(),
            2 * kPairs * ThreadCache::kDefaultBytes + defaults().central_bound());
  EXPECT_EQ(info().parked, info().central) << "every thread exited: its blocks went back";
  expect_everything_came_back();
}

TEST_F(VmmCacheTest, ClassedBlocksParkWithinTheBoundAndGoBackWhenMemoryIsShort) {
  make();
  share();
  std::vector<DevPtr> v;
  for (int cls = 0; cls < CacheClasses::kCount; ++cls)
    for (int i = 0; i < 4; ++i) v.push_back(alloc(CacheClasses::bytes(cls)));
  for (DevPtr p : v) free(p);
  EXPECT_LE(info().parked_bytes, ThreadCache::kDefaultBytes + defaults().central_bound());
  EXPECT_GT(info().parked_bytes, ThreadCache::kDefaultBytes / 2);
  std::printf("central lists: at most %zu MiB per device\n", defaults().central_bound() >> 20);
  // No memory beyond what the region holds, and a request that only fits with the parked blocks'
  // memory: they go back, and nothing new is created.
  const std::size_t used = fake.used(0);
  fake.set_capacity(0, used);
  const DevPtr big = alloc(used - 4 * kMiB);
  EXPECT_NE(big, 0u);
  EXPECT_EQ(info().parked, 0u);
  free(big);
}

// The backend's thread_cache option bounds what the caches park: a small one parks less than the
// default would, and 0 never turns the size classes on (each thread keeps only exact-size blocks).
TEST_F(VmmCacheTest, ThreadCacheOptionBoundsParkedBytes) {
  policy::BackendSpec spec;
  spec.thread_cache = 4 * kMiB;
  make(spec);
  share();
  const ThreadCache small(spec.thread_cache);
  ASSERT_LT(small.central_bound(), defaults().central_bound());
  std::vector<DevPtr> v;
  for (int cls = 0; cls < CacheClasses::kCount; ++cls)
    for (int i = 0; i < 4; ++i) v.push_back(alloc(CacheClasses::bytes(cls)));
  for (DevPtr p : v) free(p);
  EXPECT_LE(info().parked_bytes, spec.thread_cache + small.central_bound());
  EXPECT_GT(info().parked_bytes, spec.thread_cache / 2);
  std::printf("thread_cache 4MiB: central lists at most %zu MiB per device\n",
              small.central_bound() >> 20);
}

TEST_F(VmmCacheTest, ThreadCacheZeroKeepsSizeClassesOff) {
  policy::BackendSpec spec;
  spec.thread_cache = 0;
  make(spec);
  free(alloc(5 * kMiB, FreeSync::none));
  std::thread([&] { free(alloc(5 * kMiB, FreeSync::none)); }).join();
  EXPECT_FALSE(info().classed) << "a second thread allocated, but the option keeps classes off";
  const std::size_t size = 200 * 1024 + 256;  // no class's size: a classed cache would round it
  const DevPtr p = alloc(size);
  EXPECT_EQ(block_bytes(p), size);
  free(p);
  EXPECT_LE(info().parked, static_cast<std::size_t>(ThreadCache::kExact) * 2);
}

// A thread that frees more of a class than it allocates feeds the class's central list, and
// another thread's requests of the class are served from it without the device lock.
TEST_F(VmmCacheTest, AnotherThreadsOverflowServesWithoutTheLock) {
  make();
  share();
  const std::size_t size = 200 * 1024;
  std::vector<DevPtr> v;
  for (int i = 0; i < 64; ++i) v.push_back(alloc(size));
  for (DevPtr p : v) free(p);
  const int cls = CacheClasses::of(CacheClasses::round(size));
  ASSERT_EQ(info().central, static_cast<std::size_t>(defaults().central_cap(cls)));
  const std::uint64_t locked = info().locked_calls;
  std::thread([&] {
    std::vector<DevPtr> got;
    for (int i = 0; i < defaults().central_cap(cls); ++i) got.push_back(alloc(size));
    EXPECT_EQ(info().locked_calls, locked) << "served from the central list";
    for (DevPtr p : got) free(p);
  }).join();
}

TEST_F(VmmCacheTest, BarrierAllocationsAreNotRoundedNorParked) {
  make();
  share();
  const std::size_t size = 100 * 1024 + 256;
  const DevPtr p = alloc(size, FreeSync::barrier);
  EXPECT_EQ(block_bytes(p), size);
  free(p);
  EXPECT_EQ(info().parked, 0u);
  const DevPtr q = alloc(size);
  EXPECT_EQ(block_bytes(q), CacheClasses::round(size));
  free(q);
}

}  // namespace
}  // namespace allocshim
