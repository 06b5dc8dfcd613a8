// 64 threads allocating mixed sizes through the core, a third of the blocks freed by another
// thread, on every pooling backend and free_sync: every byte is counted (what was allocated is
// freed once, nothing overlaps while live, the statistics and the registry end at zero, the driver
// gets back all it gave). Run under TSan by the tsan preset.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/core.h"
#include "fake_driver.h"

namespace allocshim {
namespace {

using fake::FakeConfig;
using fake::FakeDriver;
using fake::kGiB;

constexpr int kThreads = 64;
constexpr int kOpsPerThread = 300;

// Live ranges seen by the test, to catch two live blocks sharing an address.
class Ranges {
 public:
  void add(DevPtr p, std::size_t size) {
    std::lock_guard lock(mutex_);
    auto next = live_.lower_bound(p);
    if (next != live_.end() && next->first < p + size) overlaps_++;
    if (next != live_.begin() && std::prev(next)->first + std::prev(next)->second > p) overlaps_++;
    live_[p] = size;
  }
  bool remove(DevPtr p) {
    std::lock_guard lock(mutex_);
    return live_.erase(p) == 1;
  }
  int overlaps() const { return overlaps_; }

 private:
  std::mutex mutex_;
  std::map<DevPtr, std::size_t> live_;
  int overlaps_ = 0;
};

// Blocks one thread hands to another to free.
struct Mailbox {
  std::mutex mutex;
  std::vector<std::pair<DevPtr, std::size_t>> blocks;
};

struct Case {
  BackendKind kind;
  FreeSync sync;
};

class ThreadsStress : public ::testing::TestWithParam<Case> {};

TEST_P(ThreadsStress, EveryByteIsCounted) {
  FakeConfig config;
  config.capacity = 8 * kGiB;
  FakeDriver fake(config);
  policy::Policy p;
  policy::BackendSpec spec;
  spec.name = backend_kind_name(GetParam().kind);
  spec.kind = GetParam().kind;
  p.backends.push_back(spec);
  p.default_free_sync = GetParam().sync;
  p.source = "<stress>";
  Core core(fake.driver(), p);
  ASSERT_TRUE(core.error().empty()) << core.error();

  Ranges ranges;
  std::vector<Mailbox> mail(kThreads);
  std::atomic<std::uint64_t> allocated{0}, freed{0}, failures{0}, lost{0};
  std::atomic<int> done{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) * 7919u + 1);
      std::vector<std::pair<DevPtr, std::size_t>> mine;
      auto free_block = [&](DevPtr ptr, std::size_t size) {
        if (!ranges.remove(ptr)) lost++;
        if (core.free(ptr, FreeRequest{}) != res::ok) failures++;
        freed += size;
      };
      for (int i = 0; i < kOpsPerThread; ++i) {
        // 256 B .. 4 MiB, most of them small, as in real programs.
        const std::size_t size = (std::size_t{256} << (rng() % 15)) + (rng() % 4) * 256;
        AllocRequest req;
        req.size = size;
        DevPtr ptr = 0;
        if (core.alloc(req, &ptr) != res::ok) {
          failures++;
          continue;
        }
        ranges.add(ptr, size);
        allocated += size;
        if (rng() % 3 == 0) {
          Mailbox& m =
              mail[static_cast<std::size_t>((t + 1 + static_cast<int>(rng() % 5)) % kThreads)];
          std::lock_guard lock(m.mutex);
          m.blocks.emplace_back(ptr, size);
        } else {
          mine.emplace_back(ptr, size);
        }
        if (mine.size() > 8) {
          const std::size_t k = rng() % mine.size();
          free_block(mine[k].first, mine[k].second);
          mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(k));
        }
        std::vector<std::pair<DevPtr, std::size_t>> theirs;
        {
          std::lock_guard lock(mail[static_cast<std::size_t>(t)].mutex);
          theirs.swap(mail[static_cast<std::size_t>(t)].blocks);
        }
        for (const auto& [bp, bs] : theirs) free_block(bp, bs);
      }
      for (const auto& [bp, bs] : mine) free_block(bp, bs);
      done++;
      // Blocks other threads may still post: each thread drains its box once all are done.
      while (done.load() < kThreads) std::this_thread::yield();
      std::lock_guard lock(mail[static_cast<std::size_t>(t)].mutex);
      for (const auto& [bp, bs] : mail[static_cast<std::size_t>(t)].blocks) free_block(bp, bs);
      mail[static_cast<std::size_t>(t)].blocks.clear();
    });
  for (auto& th : pool) th.join();

  EXPECT_EQ(failures.load(), 0u);
  EXPECT_EQ(lost.load(), 0u) << "a block freed twice or never handed out";
  EXPECT_EQ(ranges.overlaps(), 0) << "two live blocks shared addresses";
  EXPECT_EQ(allocated.load(), freed.load());
  EXPECT_EQ(core.registry().size(), 0u);
  EXPECT_EQ(core.unknown_frees(), 0u);
  std::uint64_t allocs = 0, frees = 0, bytes = 0, live = 0;
  for (std::size_t i = 0; i < core.backend_count(); ++i) {
    const DeviceStats& d = core.backend(i).stats().device(0);
    allocs += d.allocs();
    frees += d.frees();
    bytes += d.bytes_allocated();
    live += d.live_bytes();
  }
  EXPECT_EQ(allocs, static_cast<std::uint64_t>(kThreads) * kOpsPerThread);
  EXPECT_EQ(frees, allocs);
  EXPECT_EQ(bytes, allocated.load());
  EXPECT_EQ(live, 0u);
  // Everything cached goes back to the driver: nothing was lost inside a backend.
  for (std::size_t i = 0; i < core.backend_count(); ++i)
    const_cast<Backend&>(core.backend(i)).trim(-1);
  if (GetParam().kind == BackendKind::native) {
    EXPECT_EQ(fake.live_allocations(), 0u);
  }
  if (GetParam().kind == BackendKind::vmm) {
    EXPECT_EQ(fake.used(0), 0u) << "chunks still held after trim";
  }
}

// Each backend kind with the free_sync modes it is run with.
const Case kBackends[] = {
    {BackendKind::native, FreeSync::device},   {BackendKind::vmm, FreeSync::none},
    {BackendKind::vmm, FreeSync::device},      {BackendKind::vmm, FreeSync::barrier},
    {BackendKind::async_pool, FreeSync::none}, {BackendKind::async_pool, FreeSync::barrier}};
INSTANTIATE_TEST_SUITE_P(Backends, ThreadsStress, ::testing::ValuesIn(kBackends),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(backend_kind_name(info.param.kind)) + "_" +
                                  free_sync_name(info.param.sync);
                         });

}  // namespace
}  // namespace allocshim
