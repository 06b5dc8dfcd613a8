// The registry of live allocations: exact lookup, growth, deletion that keeps probe chains intact,
// and concurrent use.
#include "core/registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

namespace allocshim {
namespace {

Block block_of(std::size_t size) {
  Block b;
  b.size = size;
  b.backend = 3;
  b.device = 1;
  b.api = Api::pitch;
  b.free_sync = FreeSync::barrier;
  b.cookie = size * 7;
  return b;
}

TEST(Registry, InsertFindErase) {
  Registry r;
  EXPECT_TRUE(r.insert(0x7f0000001000, block_of(42)));
  EXPECT_FALSE(r.insert(0x7f0000001000, block_of(43))) << "a duplicate must not replace the entry";
  Block b;
  ASSERT_TRUE(r.find(0x7f0000001000, &b));
  EXPECT_EQ(b.size, 42u);
  EXPECT_EQ(b.backend, 3u);
  EXPECT_EQ(b.device, 1);
  EXPECT_EQ(b.api, Api::pitch);
  EXPECT_EQ(b.free_sync, FreeSync::barrier);
  EXPECT_EQ(b.cookie, 42u * 7);
  EXPECT_FALSE(r.find(0x7f0000001100, &b)) << "only exact pointers are registered";
  EXPECT_TRUE(r.erase(0x7f0000001000, &b));
  EXPECT_FALSE(r.erase(0x7f0000001000, &b)) << "a second free of the same pointer is not ours";
  EXPECT_EQ(r.size(), 0u);
  EXPECT_FALSE(r.insert(0, block_of(1))) << "address 0 is never a live allocation";
}

// Large allocations come back 2 MiB-aligned (and VMM blocks often 1 GiB apart): they must stay
// near their home slots like any others. A hash whose low bits ignore the high bits of the pointer
// put all of them in a few slots, probing through hundreds.
TEST(Registry, AlignedPointersSpreadOverSlots) {
  for (const DevPtr step : {DevPtr{1} << 21, DevPtr{1} << 30}) {
    SCOPED_TRACE(step);
    Registry r;
    constexpr int kEntries = 4096;
    for (int i = 0; i < kEntries; ++i) {
      const DevPtr p = 0x7f0000000000ull + static_cast<DevPtr>(i) * step;
      ASSERT_TRUE(r.insert(p, block_of(static_cast<std::size_t>(i))));
    }
    EXPECT_LE(r.longest_probe(), 32u) << "clustered homes make long probe chains";
    for (int i = 0; i < kEntries; ++i) {
      Block b;
      ASSERT_TRUE(r.erase(0x7f0000000000ull + static_cast<DevPtr>(i) * step, &b));
      EXPECT_EQ(b.size, static_cast<std::size_t>(i));
    }
  }
}

// Many entries force every shard to grow several times; random erasure exercises backward-shift
// deletion. The registry must agree with a reference map at every step.
TEST(Registry, AgreesWithReferenceUnderRandomChurn) {
  Registry r;
  std::unordered_map<DevPtr, std::size_t> ref;
  std::mt19937_64 rng(12345);
  for (int step = 0; step < 200000; ++step) {
    // Addresses 256-byte aligned and clustered, as device pointers are.
    const DevPtr p = 0x7f0000000000ull + (rng() % 50000) * 256;
    if (ref.count(p)) {
      Block b;
      ASSERT_TRUE(r.erase(p, &b));
      ASSERT_EQ(b.size, ref[p]);
      ref.erase(p);
    } else {
      const std::size_t size = rng() % 100000 + 1;
      ASSERT_TRUE(r.insert(p, block_of(size)));
      ref[p] = size;
    }
  }
  EXPECT_EQ(r.size(), ref.size());
  for (const auto& [p, size] : ref) {
    Block b;
    ASSERT_TRUE(r.find(p, &b));
    EXPECT_EQ(b.size, size);
  }
  std::size_t visited = 0;
  r.for_each([&](DevPtr p, const Block& b) {
    ++visited;
    EXPECT_EQ(ref.at(p), b.size);
  });
  EXPECT_EQ(visited, ref.size());
}

TEST(Registry, ConcurrentThreadsLoseNothing) {
  Registry r;
  constexpr int kThreads = 16, kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&r, t] {
      std::vector<DevPtr> mine;
      for (int i = 0; i < kPerThread; ++i) {
        const DevPtr p = 0x100000000ull + (static_cast<DevPtr>(t) * kPerThread + i) * 512;
        ASSERT_TRUE(r.insert(p, block_of(static_cast<std::size_t>(i) + 1)));
        mine.push_back(p);
        if (i % 3 == 0) {
          Block b;
          ASSERT_TRUE(r.erase(mine.back(), &b));
          ASSERT_EQ(b.size, static_cast<std::size_t>(i) + 1);
          mine.pop_back();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  // Each thread kept two of every three of its entries.
  std::size_t expected = 0;
  for (int i = 0; i < kPerThread; ++i) expected += (i % 3 == 0) ? 0 : 1;
  EXPECT_EQ(r.size(), expected * kThreads);
}

// Blocks freed by a thread other than the one that allocated them (and by threads that came after
// it exited, on its reused id): every entry is found exactly once, while the owners keep inserting
// and rebuilding their tables.
TEST(Registry, FreesFromOtherThreadsWhileOwnersGrow) {
  Registry r;
  constexpr int kThreads = 8, kPerThread = 20000;
  std::vector<std::vector<DevPtr>> made(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const DevPtr p = 0x200000000ull + (static_cast<DevPtr>(t) * kPerThread + i) * 256;
        ASSERT_TRUE(r.insert(p, block_of(static_cast<std::size_t>(p))));
        made[static_cast<std::size_t>(t)].push_back(p);
      }
    });
  for (auto& th : pool) th.join();
  pool.clear();
  // Each thread frees the next one's blocks and inserts more of its own meanwhile.
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      for (const DevPtr p : made[static_cast<std::size_t>((t + 1) % kThreads)]) {
        Block b;
        ASSERT_TRUE(r.erase(p, &b));
        ASSERT_EQ(b.size, static_cast<std::size_t>(p));
        ASSERT_FALSE(r.erase(p, &b)) << "an entry is claimed once";
        const DevPtr own = p + 0x100000000ull;
        ASSERT_TRUE(r.insert(own, block_of(1)));
        ASSERT_TRUE(r.erase(own, &b));
      }
    });
  for (auto& th : pool) th.join();
  EXPECT_EQ(r.size(), 0u);
  std::size_t visited = 0;
  r.for_each([&](DevPtr, const Block&) { ++visited; });
  EXPECT_EQ(visited, 0u);
}

}  // namespace
}  // namespace allocshim
