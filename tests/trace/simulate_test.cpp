// The simulated device of `allocshim replay --simulate` (tools/sim): its books, and replays of every
// backend on it, their peaks and their failures on a device too small.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "policy/policy.h"
#include "analysis/replay.h"
#include "sim/simulated_device.h"

namespace {

using allocshim::DevPtr;
using allocshim::kStreamLegacy;
using allocshim::MemHandle;
using allocshim::PhysSpec;
using allocshim::Pool;
using allocshim::sim::SimulatedDevice;
namespace res = allocshim::res;
namespace analysis = allocshim::analysis;

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(SimulatedDevice, CountsAllocationsAndRefusesPastItsCapacity) {
  SimulatedDevice sim({1, 64 * kMiB});
  const auto& d = sim.driver();
  DevPtr a = 0, b = 0;
  ASSERT_EQ(d.mem_alloc(&a, 40 * kMiB), res::ok);
  EXPECT_EQ(d.mem_alloc(&b, 40 * kMiB), res::out_of_memory);
  std::size_t free = 0, total = 0;
  ASSERT_EQ(d.mem_get_info(&free, &total), res::ok);
  EXPECT_EQ(total, 64 * kMiB);
  EXPECT_EQ(free, 24 * kMiB);
  ASSERT_EQ(d.mem_alloc(&b, 100), res::ok);
  EXPECT_EQ(sim.used(0), 40 * kMiB + 256) << "rounded up to 256 bytes";
  EXPECT_EQ(d.mem_free(a), res::ok);
  EXPECT_EQ(d.mem_free(b), res::ok);
  EXPECT_EQ(d.mem_free(b), res::invalid_value);
  EXPECT_EQ(sim.used(0), 0u);
  EXPECT_EQ(sim.peak_used(0), 40 * kMiB + 256);
}

TEST(SimulatedDevice, PoolsKeepFreedBlocksUntilASynchronization) {
  SimulatedDevice sim({1, 64 * kMiB});
  const auto& d = sim.driver();
  DevPtr a = 0, b = 0;
  ASSERT_EQ(d.mem_alloc_async(&a, 3 * kMiB, kStreamLegacy), res::ok);
  ASSERT_EQ(d.mem_free_async(a, kStreamLegacy), res::ok);
  EXPECT_EQ(sim.used(0), 4 * kMiB) << "a cached block still counts";
  ASSERT_EQ(d.mem_alloc_async(&b, 4 * kMiB, kStreamLegacy), res::ok);
  EXPECT_EQ(b, a) << "the same rounded size reuses the cached block";
  ASSERT_EQ(d.mem_free_async(b, kStreamLegacy), res::ok);
  ASSERT_EQ(d.ctx_synchronize(), res::ok);
  EXPECT_EQ(sim.used(0), 0u) << "above the release threshold (0): given back";

  Pool pool = nullptr;
  ASSERT_EQ(d.mem_pool_create(&pool, allocshim::PoolSpec{{}, false, 8 * kMiB}), res::ok);
  ASSERT_EQ(d.mem_pool_set_release_threshold(pool, ~0ull), res::ok);
  ASSERT_EQ(d.mem_alloc_from_pool_async(&a, 6 * kMiB, pool, kStreamLegacy), res::ok);
  EXPECT_EQ(d.mem_alloc_from_pool_async(&b, 4 * kMiB, pool, kStreamLegacy), res::out_of_memory)
      << "past the pool's maximum size";
  ASSERT_EQ(d.mem_free_async(a, kStreamLegacy), res::ok);
  ASSERT_EQ(d.ctx_synchronize(), res::ok);
  std::uint64_t reserved = 0;
  ASSERT_EQ(d.mem_pool_reserved(pool, &reserved), res::ok);
  EXPECT_EQ(reserved, 6 * kMiB) << "below the threshold: kept";
  ASSERT_EQ(d.mem_alloc_from_pool_async(&b, 4 * kMiB, pool, kStreamLegacy), res::ok)
      << "the pool gives its cache back to grow";
  ASSERT_EQ(d.mem_pool_reserved(pool, &reserved), res::ok);
  EXPECT_EQ(reserved, 4 * kMiB);
  ASSERT_EQ(d.mem_free_async(b, kStreamLegacy), res::ok);
  ASSERT_EQ(d.mem_pool_destroy(pool), res::ok);
  EXPECT_EQ(sim.used(0), 0u);
}

TEST(SimulatedDevice, PhysicalMemoryCountsUntilReleasedAndUnmapped) {
  SimulatedDevice sim({2, 64 * kMiB});
  const auto& d = sim.driver();
  PhysSpec spec;
  spec.location.id = 1;
  std::size_t granularity = 0;
  ASSERT_EQ(d.mem_get_granularity(&granularity, spec), res::ok);
  EXPECT_EQ(granularity, 2 * kMiB);
  MemHandle h = 0;
  EXPECT_EQ(d.mem_create(&h, kMiB, spec), res::invalid_value)
      << "not a multiple of the granularity";
  ASSERT_EQ(d.mem_create(&h, 4 * kMiB, spec), res::ok);
  EXPECT_EQ(sim.used(1), 4 * kMiB);
  EXPECT_EQ(sim.used(0), 0u);
  DevPtr va = 0;
  ASSERT_EQ(d.mem_address_reserve(&va, 8 * kMiB, 0, 0), res::ok);
  ASSERT_EQ(d.mem_map(va + 2 * kMiB, 4 * kMiB, 0, h), res::ok);
  ASSERT_EQ(d.mem_set_access(va + 2 * kMiB, 4 * kMiB, 1, true), res::ok);
  ASSERT_EQ(d.mem_release(h), res::ok);
  EXPECT_EQ(sim.used(1), 4 * kMiB) << "still mapped";
  ASSERT_EQ(d.mem_unmap(va + 2 * kMiB, 4 * kMiB), res::ok);
  EXPECT_EQ(sim.used(1), 0u);
  EXPECT_EQ(d.mem_address_free(va, 8 * kMiB), res::ok);
}

allocshim::policy::Policy policy_of(const std::string& kind) {
  allocshim::policy::Policy p;
  std::vector<allocshim::policy::Diagnostic> diags;
  const std::string toml =
      "version = 1\n[defaults]\nbackend = \"b\"\n[backends.b]\nkind = \"" + kind + "\"\n";
  EXPECT_TRUE(allocshim::policy::load_string(toml, kind, p, diags))
      << (diags.empty() ? toml : diags[0].str());
  return p;
}

analysis::Event event(analysis::EventKind kind, std::uint64_t addr, std::uint64_t size,
                      int device = 0) {
  static std::uint64_t t = 0;
  analysis::Event e;
  e.kind = kind;
  e.addr = addr;
  e.size = size;
  e.time_ns = ++t;
  e.device = static_cast<std::int16_t>(device);
  return e;
}

// Replays three allocations of `bytes`, runs `between`, frees them and finishes.
template <class Between = void (*)()>
analysis::ReplayResult allocate_three_then_free(
    analysis::Replayer& replayer, std::uint64_t bytes, Between between = [] {}) {
  for (std::uint64_t i = 1; i <= 3; ++i)
    replayer.step(event(analysis::EventKind::alloc, i << 32, bytes));
  between();
  for (std::uint64_t i = 1; i <= 3; ++i)
    replayer.step(event(analysis::EventKind::free, i << 32, 0));
  return replayer.finish();
}

// Three blocks of 100 MiB held at once on a device of 256 MiB: the third fails with every backend,
// and what the backends reserved is what the device counted at most.
TEST(SimulatedDevice, ReplaysEveryBackendAndFailsOnADeviceTooSmall) {
  for (const char* kind : {"native", "async_pool", "vmm"}) {
    SCOPED_TRACE(kind);
    SimulatedDevice sim({1, 256 * kMiB});
    analysis::Replayer replayer(sim.driver(), policy_of(kind));
    const analysis::ReplayResult r = allocate_three_then_free(replayer, 100 * kMiB);
    EXPECT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(r.allocs, 3u);
    EXPECT_EQ(r.failures, 1u);
    EXPECT_EQ(r.frees, 2u);
    EXPECT_EQ(r.peak_live, 200 * kMiB);
    EXPECT_GE(r.peak_reserved, r.peak_live);
    EXPECT_LE(r.peak_reserved, sim.peak_used(0));
  }
}

// Under a budget with a host spill target the device holds at most the budget; the rest is served
// from host memory, which the device does not count.
TEST(SimulatedDevice, ReplaysABudgetThatSpillsToTheHost) {
  SimulatedDevice sim({1, 256 * kMiB});
  allocshim::policy::Policy p;
  std::vector<allocshim::policy::Diagnostic> diags;
  ASSERT_TRUE(allocshim::policy::load_string(
      "version = 1\n[defaults]\nbackend = \"vmm\"\n[budget]\ndevice = \"64MiB\"\nspill = \"host\"\n",
      "spill", p, diags))
      << diags[0].str();
  analysis::Replayer replayer(sim.driver(), p);
  const analysis::ReplayResult r =
      allocate_three_then_free(replayer, 40 * kMiB, [&] { EXPECT_LE(sim.used(0), 64 * kMiB); });
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.failures, 0u);
  EXPECT_EQ(r.frees, 3u);
  EXPECT_EQ(r.peak_live, 120 * kMiB);
  EXPECT_LE(sim.peak_used(0), 64 * kMiB);
}

// With --devices 2, a block traced on device 1 is served by device 1.
TEST(SimulatedDevice, ReplaysOnTheTracedDevice) {
  SimulatedDevice sim({2, 256 * kMiB});
  analysis::Replayer replayer(sim.driver(), policy_of("native"));
  replayer.step(event(analysis::EventKind::alloc, 0x1000, 10 * kMiB, 1));
  EXPECT_EQ(sim.used(1), 10 * kMiB);
  EXPECT_EQ(sim.used(0), 0u);
  replayer.step(event(analysis::EventKind::free, 0x1000, 0, 1));
  const analysis::ReplayResult r = replayer.finish();
  EXPECT_EQ(r.frees, 1u);
  EXPECT_EQ(sim.used(1), 0u);
}

}  // namespace
