// Device budgets on the fake driver (docs/oversubscription.md): what counts against a budget, what
// cuMemGetInfo reports under one, spill = none / host / managed, splitting one allocation between
// device and host chunks, promotion back to the device, and failures midway leaving nothing behind.
#include "core/budget.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "backends/host.h"
#include "host_probe.h"
#include "core/core.h"
#include "core_fixture.h"
#include "fake_driver.h"
#include "fake_test_util.h"

namespace allocshim {
namespace {

using fake::testing::fill;
using fake::testing::verify;

// The budget on the native backend (what the driver holds is then exactly what the program holds),
// unless the test's policy names another default.
policy::Policy load(const std::string& text) {
  const std::string native =
      text.find("[defaults]") == std::string::npos ? "[defaults]\nbackend = \"native\"\n" : "";
  return testing::parsed(native + text, "budget.toml");
}

using testing::must_alloc;
using testing::try_alloc;
const Backend* spill_backend(const Core& core) { return testing::spill_target(core); }

TEST(Budget, NoBudgetChangesNothing) {
  FakeDriver fake;
  Core core(fake.driver(), load(""));
  EXPECT_FALSE(core.budget().active());
  std::size_t free = 0, total = 0;
  ASSERT_EQ(core.mem_get_info(&free, &total), res::ok);
  EXPECT_EQ(total, kGiB);
  EXPECT_EQ(free, kGiB);
}

TEST(Budget, MemGetInfoReportsTheBudgetAndWhatIsLeftOfIt) {
  FakeDriver fake;
  Core core(fake.driver(), load("[budget]\ndevice = \"64MiB\"\n"));
  std::size_t free = 0, total = 0;
  ASSERT_EQ(core.mem_get_info(&free, &total), res::ok);
  EXPECT_EQ(total, 64 * kMiB);
  EXPECT_EQ(free, 64 * kMiB);
  const DevPtr p = must_alloc(core, 16 * kMiB);
  ASSERT_EQ(core.mem_get_info(&free, &total), res::ok);
  EXPECT_EQ(total, 64 * kMiB);
  EXPECT_EQ(free, 48 * kMiB);
  ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
  ASSERT_EQ(core.mem_get_info(&free, &total), res::ok);
  EXPECT_EQ(free, 64 * kMiB);
}

TEST(Budget, PercentagesAndPerDeviceEntriesResolveAgainstEachDevice) {
  FakeConfig c;
  c.devices = 3;
  FakeDriver fake(c);
  Core core(fake.driver(), load("[budget.device]\n0 = \"100MiB\"\n1 = \"25%\"\n"));
  EXPECT_EQ(core.budget().limit(0), 100 * kMiB);
  EXPECT_EQ(core.budget().limit(1), 256 * kMiB);
  EXPECT_EQ(core.budget().limit(2), policy::kUnlimited) << "no default: no budget";
  fake.set_current_device(1);
  std::size_t free = 0, total = 0;
  ASSERT_EQ(core.mem_get_info(&free, &total), res::ok);
  EXPECT_EQ(total, 256 * kMiB);
  fake.set_current_device(2);
  ASSERT_EQ(core.mem_get_info(&free, &total), res::ok);
  EXPECT_EQ(total, kGiB);
  fake.set_current_device(0);

  Core pct(fake.driver(), load("[budget]\ndevice = \"50%\"\n"));
  EXPECT_EQ(pct.budget().limit(2), 512 * kMiB);
}

TEST(Budget, CountsNativePoolsVmmAndTheProgramsOwnCuMemCreate) {
  FakeDriver fake;
  Core core(fake.driver(), load(R"(
[budget]
device = "256MiB"

[[rules]]
size = ">= 8MiB"
backend = "vmm"

[[rules]]
size = ">= 4MiB"
backend = "async_pool"
)"));
  Budget& b = core.budget();
  const DevPtr n = must_alloc(core, 1 * kMiB);   // native
  const DevPtr v = must_alloc(core, 10 * kMiB);  // vmm: 10 MiB in 2 MiB chunks
  const DevPtr a = must_alloc(core, 5 * kMiB);   // async_pool
  ASSERT_EQ(core.admit_create(32 * kMiB, Location{}), res::ok);
  core.on_created(77, 32 * kMiB, Location{});
  // The fake counts the same device bytes (its cuMemCreate was not called: the handle is made up).
  EXPECT_EQ(b.backed(0), fake.used(0) + 32 * kMiB);
  EXPECT_GE(b.backed(0), 1 * kMiB + 10 * kMiB + 5 * kMiB + 32 * kMiB);
  // Freed pool memory stays backed (the pool holds it) but is free to the program.
  ASSERT_EQ(core.free(v, FreeRequest{}), res::ok);
  std::size_t free = 0, total = 0;
  ASSERT_EQ(core.mem_get_info(&free, &total), res::ok);
  EXPECT_GE(b.backed(0), 10 * kMiB + 32 * kMiB);
  EXPECT_EQ(free, total - (b.backed(0) - b.cached(0)));
  core.on_released(77);
  ASSERT_EQ(core.free(n, FreeRequest{}), res::ok);
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
}

TEST(Budget, SpillNoneFailsLikeAFullDeviceAndRecovers) {
  FakeDriver fake;
  Core core(fake.driver(), load("[budget]\ndevice = \"64MiB\"\nspill = \"none\"\n"));
  const DevPtr p = must_alloc(core, 48 * kMiB);
  DevPtr q = 0;
  EXPECT_EQ(try_alloc(core, 32 * kMiB, &q), res::out_of_memory);
  EXPECT_EQ(fake.used(0), 48 * kMiB) << "the driver was not asked";
  EXPECT_EQ(core.registry().size(), 1u);
  EXPECT_EQ(core.budget().device_report(0).refused, 1u);
  // The program received that out-of-memory: its backend's row counts it as failed.
  const auto failures = [&core] {
    std::uint64_t n = 0;
    for (std::size_t i = 0; i < core.backend_count(); ++i)
      n += core.backend(i).stats().device(0).failures();
    return n;
  };
  EXPECT_EQ(failures(), 1u);
  EXPECT_EQ(core.admit_create(32 * kMiB, Location{}), res::out_of_memory);
  const std::string summary = core.summary();
  EXPECT_NE(summary.find("program cuMemCreate"), std::string::npos)
      << "the program's refused cuMemCreate is shown as failed\n"
      << summary;
  EXPECT_EQ(nlohmann::json::parse(core.stats_json())["created"]["devices"][0]["failures"], 1);
  EXPECT_EQ(core.admit_create(32 * kMiB, Location{Location::Type::host_numa, 0}), res::ok)
      << "host memory is not the device's";
  ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
  q = must_alloc(core, 32 * kMiB);
  ASSERT_EQ(core.free(q, FreeRequest{}), res::ok);
}

TEST(Budget, PoolCachesAreGivenBackBeforeARequestIsRefused) {
  FakeDriver fake;
  Core core(fake.driver(), load(R"(
[budget]
device = "64MiB"

[[rules]]
size = ">= 8MiB"
backend = "vmm"
)"));
  const DevPtr v = must_alloc(core, 40 * kMiB);
  ASSERT_EQ(core.free(v, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.used(0), 40 * kMiB) << "the vmm keeps its chunks cached";
  const DevPtr n = must_alloc(core, 30 * kMiB);      // native: fits only if the cache goes
  const DevPtr m = must_alloc(core, 30 * kMiB - 1);  // vmm again: 30 MiB more
  EXPECT_LE(fake.used(0), 64 * kMiB);
  EXPECT_EQ(core.budget().device_report(0).refused, 0u);
  ASSERT_EQ(core.free(n, FreeRequest{}), res::ok);
  ASSERT_EQ(core.free(m, FreeRequest{}), res::ok);
}

TEST(Budget, SpillHostSplitsOneRangeBetweenDeviceAndHostChunks) {
  FakeConfig c;
  c.strict_access = true;  // a chunk without access faults, as on a GPU
  FakeDriver fake(c);
  Core core(fake.driver(), load("[budget]\ndevice = \"64MiB\"\nspill = \"host\"\n"));
  const DevPtr a = must_alloc(core, 48 * kMiB);
  const DevPtr s = must_alloc(core, 40 * kMiB);  // 16 MiB of room: 8 device chunks, 12 host chunks
  const Backend* spill = spill_backend(core);
  ASSERT_NE(spill, nullptr);
  const HostInfo h = host_info(*spill, 0);
  EXPECT_EQ(h.allocations, 1u);
  EXPECT_EQ(h.device_bytes, 16 * kMiB);
  EXPECT_EQ(h.host_bytes, 24 * kMiB);
  EXPECT_EQ(fake.used(0), 64 * kMiB) << "device memory stops at the budget";
  EXPECT_EQ(fake.host_used(), 24 * kMiB);
  fill(fake.driver(), s, 40 * kMiB, 3);
  EXPECT_TRUE(verify(fake.driver(), s, 40 * kMiB, 3));
  std::size_t free = 1, total = 0;
  ASSERT_EQ(core.mem_get_info(&free, &total), res::ok);
  EXPECT_EQ(free, 0u);
  EXPECT_EQ(total, 64 * kMiB);
  // Pointer queries see the spilled block as one allocation.
  DevPtr base = 0;
  std::size_t size = 0;
  ASSERT_TRUE(core.find_block(s + 30 * kMiB, &base, &size));
  EXPECT_EQ(base, s);
  EXPECT_EQ(size, 40 * kMiB);
  // Past the budget entirely: all host.
  const DevPtr t = must_alloc(core, 3 * kMiB);
  EXPECT_EQ(host_info(*spill, 0).host_bytes, 28 * kMiB);
  const Budget::DeviceReport r = core.budget().device_report(0);
  EXPECT_EQ(r.spilled_allocs, 2u);
  EXPECT_EQ(r.spilled_bytes, 28 * kMiB);
  EXPECT_LE(r.peak_backed, 64 * kMiB);
  for (DevPtr p : {a, s, t}) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.used(0), 0u);
  EXPECT_EQ(fake.host_used(), 0u);
  EXPECT_EQ(fake.live_handles(), 0u);
  EXPECT_EQ(fake.reservations(), 0u);
  EXPECT_EQ(core.budget().backed(0), 0u);
}

TEST(Budget, TheSpillTargetPlacesTheDevicePartTheCoreClaimedAndClaimsNothingItself) {
  // The core decides how much of a new allocation may be on the device; the spill target is
  // mechanism: it maps what it was given, says what it placed, and never claims on its own.
  FakeDriver fake;
  Core core(fake.driver(), load("[budget]\ndevice = \"64MiB\"\nspill = \"host\"\n"));
  Backend& spill = const_cast<Backend&>(*spill_backend(core));
  AllocRequest req;
  req.size = 10 * kMiB + 1;
  std::size_t range = 0, unit = 0;
  ASSERT_TRUE(spill.device_extent(req, &range, &unit));
  ASSERT_GT(unit, 0u);
  EXPECT_EQ(range % unit, 0u);
  EXPECT_GE(range, req.size);
  EXPECT_LT(range - req.size, unit);
  Budget& budget = core.budget();
  const std::size_t part = budget.claim(0, 4 * kMiB, unit);
  ASSERT_EQ(part, 4 * kMiB) << "the budget has room";
  const std::uint64_t backed = budget.backed(0);
  std::size_t placed = 1;
  req.device_part = part;
  req.device_placed = &placed;
  DevPtr p = 0;
  std::uint64_t cookie = 0;
  ASSERT_EQ(spill.allocate(req, FreeSync::device, &p, &cookie), res::ok);
  EXPECT_EQ(placed, part);
  EXPECT_EQ(host_info(spill, 0).device_bytes, part);
  EXPECT_EQ(host_info(spill, 0).host_bytes, range - part);
  EXPECT_EQ(fake.used(0), part);
  EXPECT_EQ(budget.backed(0), backed) << "the backend claimed on its own";
  // Without a device part everything goes to the host, though the budget has room.
  AllocRequest none;
  none.size = 2 * kMiB;
  DevPtr q = 0;
  ASSERT_EQ(spill.allocate(none, FreeSync::device, &q, &cookie), res::ok);
  EXPECT_EQ(host_info(spill, 0).device_bytes, part);
  EXPECT_EQ(budget.backed(0), backed);
  // Frees give the device part back.
  ASSERT_EQ(spill.deallocate(q, Block{none.size, 0, 0, Api::alloc, FreeSync::device, 0}, {}),
            res::ok);
  ASSERT_EQ(spill.deallocate(p, Block{req.size, 0, 0, Api::alloc, FreeSync::device, 0}, {}),
            res::ok);
  EXPECT_EQ(budget.backed(0), 0u);
  EXPECT_EQ(fake.used(0), 0u);
  EXPECT_EQ(fake.host_used(), 0u);
}

TEST(Budget, TheSpillTargetTakesItsHostSideFromBackendsHost) {
  FakeDriver fake;
  const std::string head = "[budget]\ndevice = \"64MiB\"\nspill = \"host\"\nmigrate = ";
  const std::string host = "[backends.host]\nhost_reserve = \"8MiB\"\npin_ahead = true\n";
  Core moving(fake.driver(), load(head + "\"auto\"\n" + host));
  EXPECT_EQ(moving.budget().host_reserve(), 8 * kMiB);
  EXPECT_TRUE(host_pins_ahead(*spill_backend(moving)));
  Core defaults(fake.driver(), load(head + "\"auto\"\n"));
  EXPECT_EQ(defaults.budget().host_reserve(), std::uint64_t{4} << 30);
  EXPECT_FALSE(host_pins_ahead(*spill_backend(defaults)));
  Core still(fake.driver(), load(head + "\"off\"\n[backends.host]\nhost_reserve = \"8MiB\"\n"));
  EXPECT_EQ(still.budget().host_reserve(), 0u) << "nothing moves: nothing to keep";
  // The host side is the spill target's: a reload that changes only it keeps `backend = "host"`.
  const policy::Policy a = load("[backends.host]\nhost_reserve = \"8MiB\"\n");
  const policy::Policy b = load("[backends.host]\nhost_reserve = \"16MiB\"\n");
  EXPECT_TRUE(a.host_side().same_instance(b.host_side()));
  EXPECT_FALSE(a.host_side() == b.host_side());
}

TEST(Budget, TheCoreGivesBackTheDevicePartTheDriverCouldNotBack) {
  // The budget has room, the driver does not (another process took it): the device part the core
  // claimed goes back, and the allocation lives on the host.
  FakeDriver fake;
  Core core(fake.driver(), load("[budget]\ndevice = \"64MiB\"\nspill = \"host\"\n"));
  const DevPtr a = must_alloc(core, 48 * kMiB);
  fake.fail_next(FakeOp::mem_create, res::out_of_memory, 1);  // the device piece only
  const DevPtr s = must_alloc(core, 40 * kMiB);
  fake.clear_failures();
  EXPECT_EQ(host_info(*spill_backend(core), 0).device_bytes, 0u);
  EXPECT_EQ(host_info(*spill_backend(core), 0).host_bytes, 40 * kMiB);
  EXPECT_EQ(core.budget().backed(0), 48 * kMiB) << "a claim the driver could not back stayed";
  ASSERT_EQ(core.free(s, FreeRequest{}), res::ok);
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
  EXPECT_EQ(core.budget().backed(0), 0u);
  EXPECT_EQ(fake.host_used(), 0u);
}

TEST(Budget, SpilledRangesTakeTheRoomThatPoolCachesHold) {
  // The spill benchmark's sequence: a block freed into the vmm, then one request larger than the
  // whole budget. The cached chunks are room: the device part must be the whole budget, not what
  // is left beside the cache (this was 36-68% of the bandwidth bound on the H100).
  FakeDriver fake;
  Core core(fake.driver(), load(R"(
[defaults]
backend = "vmm"

[budget]
device = "64MiB"
spill = "host"
)"));
  const DevPtr v = must_alloc(core, 32 * kMiB);
  ASSERT_EQ(core.free(v, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.used(0), 32 * kMiB) << "the vmm keeps its chunks cached";
  const DevPtr s = must_alloc(core, 80 * kMiB);
  const Backend* spill = spill_backend(core);
  ASSERT_NE(spill, nullptr);
  EXPECT_EQ(host_info(*spill, 0).device_bytes, 64 * kMiB);
  EXPECT_EQ(host_info(*spill, 0).host_bytes, 16 * kMiB);
  EXPECT_LE(fake.used(0), 64 * kMiB);
  EXPECT_EQ(core.budget().device_report(0).peak_backed, 64 * kMiB);
  ASSERT_EQ(core.free(s, FreeRequest{}), res::ok);
}

TEST(Budget, SpillManagedServesManagedMemoryPreferringTheHost) {
  FakeDriver fake;
  Core core(fake.driver(), load("[budget]\ndevice = \"64MiB\"\nspill = \"managed\"\n"));
  const DevPtr a = must_alloc(core, 60 * kMiB);
  const DevPtr s = must_alloc(core, 20 * kMiB);
  EXPECT_EQ(fake.managed_used(), 20 * kMiB);
  bool host_preferred = false, accessed = false;
  for (const fake::AdviceRecord& r : fake.advice()) {
    if (r.ptr != s) continue;
    if (r.advice == Advice::set_preferred_location && r.location.type == Location::Type::host)
      host_preferred = true;
    if (r.advice == Advice::set_accessed_by && r.location.type == Location::Type::device)
      accessed = true;
  }
  EXPECT_TRUE(host_preferred);
  EXPECT_TRUE(accessed);
  EXPECT_EQ(core.budget().device_report(0).spilled_bytes, 20 * kMiB);
  ASSERT_EQ(core.free(s, FreeRequest{}), res::ok);
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.managed_used(), 0u);
}

TEST(Budget, ManagedRequestsAreNeverSpilledToTheHostBackend) {
  FakeDriver fake;
  Core core(fake.driver(), load(R"(
[budget]
device = "64MiB"
spill = "host"

[[rules]]
api = "managed"
backend = "vmm"
)"));
  const DevPtr a = must_alloc(core, 60 * kMiB);
  const DevPtr m = must_alloc(core, 20 * kMiB, Api::managed);  // host-accessible memory asked for
  EXPECT_EQ(core.budget().device_report(0).spilled_allocs, 0u);
  EXPECT_EQ(fake.host_used(), 0u);
  ASSERT_EQ(core.free(m, FreeRequest{}), res::ok);
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
}

TEST(Budget, PromoteMovesHostChunksBackToTheDeviceAtTheSameAddress) {
  FakeConfig c;
  c.strict_access = true;
  FakeDriver fake(c);
  Core core(fake.driver(),
            load("[budget]\ndevice = \"64MiB\"\nspill = \"host\"\nmigrate = \"promote\"\n"));
  const DevPtr a = must_alloc(core, 48 * kMiB);
  const DevPtr s = must_alloc(core, 40 * kMiB);
  fill(fake.driver(), s, 40 * kMiB, 9);
  const Backend* spill = spill_backend(core);
  ASSERT_NE(spill, nullptr);
  EXPECT_EQ(host_info(*spill, 0).host_bytes, 24 * kMiB);
  fake.reset_calls();
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);  // 48 MiB of room: every host chunk comes back
  const HostInfo h = host_info(*spill, 0);
  EXPECT_EQ(h.host_bytes, 0u);
  EXPECT_EQ(h.device_bytes, 40 * kMiB);
  EXPECT_EQ(h.promoted_bytes, 24 * kMiB);
  EXPECT_EQ(fake.host_used(), 24 * kMiB) << "the host chunks, kept in the host reserve";
  EXPECT_EQ(fake.used(0), 40 * kMiB);
  EXPECT_GE(fake.calls(FakeOp::ctx_synchronize), 2u) << "synchronized before and after the copies";
  EXPECT_EQ(fake.calls(FakeOp::memcpy_dtod), 1u)
      << "spilled in one piece of a move's size: one move";
  EXPECT_TRUE(verify(fake.driver(), s, 40 * kMiB, 9)) << "same address, same bytes";
  EXPECT_EQ(core.budget().device_report(0).promoted_bytes, 24 * kMiB);
  EXPECT_NE(core.summary().find("moved host->device 24.0 MiB"), std::string::npos)
      << core.summary();
  ASSERT_EQ(core.free(s, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.used(0), 0u);
  EXPECT_EQ(fake.host_used(), 0u) << "no allocation left: the reserve went with the last";
  EXPECT_EQ(fake.live_handles(), 0u);
}

TEST(Budget, PromotionStopsAtTheBudget) {
  FakeDriver fake;
  Core core(fake.driver(),
            load("[budget]\ndevice = \"64MiB\"\nspill = \"host\"\nmigrate = \"promote\"\n"));
  const DevPtr a = must_alloc(core, 60 * kMiB);
  const DevPtr s = must_alloc(core, 20 * kMiB);  // 4 MiB device, 16 MiB host
  const DevPtr b = must_alloc(core, 2 * kMiB);   // host
  fill(fake.driver(), s, 20 * kMiB, 1);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);  // no device room returned: nothing moves
  EXPECT_EQ(host_info(*spill_backend(core), 0).host_bytes, 16 * kMiB);
  const DevPtr c2 = must_alloc(core, 8 * kMiB);  // spilled too (all host)
  ASSERT_EQ(core.free(c2, FreeRequest{}), res::ok);
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
  EXPECT_EQ(host_info(*spill_backend(core), 0).host_bytes, 0u) << "60 MiB of room: all of it";
  EXPECT_TRUE(verify(fake.driver(), s, 20 * kMiB, 1));
  ASSERT_EQ(core.free(s, FreeRequest{}), res::ok);
}

TEST(Budget, PromotionIsPartialWhenRoomIsShort) {
  FakeDriver fake;
  Core core(fake.driver(),
            load("[budget]\ndevice = \"256MiB\"\nspill = \"host\"\nmigrate = \"promote\"\n"));
  const DevPtr a = must_alloc(core, 184 * kMiB);
  const DevPtr x = must_alloc(core, 64 * kMiB);
  const DevPtr s = must_alloc(core, 136 * kMiB);  // 8 MiB device, 128 MiB host in two pieces
  fill(fake.driver(), s, 136 * kMiB, 2);
  ASSERT_EQ(core.free(x, FreeRequest{}), res::ok);  // 64 MiB of room: one piece
  EXPECT_EQ(host_info(*spill_backend(core), 0).host_bytes, 64 * kMiB);
  EXPECT_LE(fake.used(0), 256 * kMiB);
  EXPECT_TRUE(verify(fake.driver(), s, 136 * kMiB, 2));
  // Async frees never promote (they must not synchronize the device).
  const DevPtr y = must_alloc(core, 1);  // all host (no room)
  ASSERT_EQ(core.free(y, FreeRequest{kStreamLegacy, true}), res::ok);
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
  EXPECT_EQ(host_info(*spill_backend(core), 0).host_bytes, 0u);
  EXPECT_TRUE(verify(fake.driver(), s, 136 * kMiB, 2));
  ASSERT_EQ(core.free(s, FreeRequest{}), res::ok);
}

TEST(Budget, CuMemCreateFailingMidwayLeaksNothingAndReturnsTheDriversError) {
  for (int skip : {0, 1, 2, 3}) {
    FakeDriver fake;
    Core core(fake.driver(), load("[budget]\ndevice = \"64MiB\"\nspill = \"host\"\n"));
    const DevPtr a = must_alloc(core, 48 * kMiB);
    const std::size_t used = fake.used(0);
    fake.fail_next(FakeOp::mem_create, res::out_of_memory, 1000, skip);
    DevPtr s = 0;
    const Result r = try_alloc(core, 150 * kMiB, &s);  // 16 MiB device, 134 MiB host in 3 pieces
    fake.clear_failures();
    // skip 0: the device piece is refused (the driver has less than the budget says), the host
    // pieces then fail too; otherwise a host piece fails after some were mapped.
    EXPECT_EQ(r, res::out_of_memory) << "skip " << skip;
    EXPECT_EQ(fake.used(0), used) << "skip " << skip;
    EXPECT_EQ(fake.host_used(), 0u) << "skip " << skip;
    EXPECT_EQ(fake.live_handles(), 0u) << "skip " << skip;
    EXPECT_EQ(fake.mappings(), 0u);
    EXPECT_EQ(fake.reservations(), 0u);
    EXPECT_EQ(core.registry().size(), 1u);
    EXPECT_EQ(core.budget().backed(0), 48 * kMiB) << "the claim went back";
    // And the next request works.
    s = must_alloc(core, 150 * kMiB);
    ASSERT_EQ(core.free(s, FreeRequest{}), res::ok);
    ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
  }
}

TEST(Budget, MapOrAccessFailingMidwayLeaksNothing) {
  for (FakeOp op : {FakeOp::mem_map, FakeOp::mem_set_access, FakeOp::mem_address_reserve}) {
    FakeDriver fake;
    Core core(fake.driver(), load("[budget]\ndevice = \"64MiB\"\nspill = \"host\"\n"));
    const DevPtr a = must_alloc(core, 60 * kMiB);
    fake.fail_next(op, res::unknown, 1000, op == FakeOp::mem_map ? 3 : 0);
    DevPtr s = 0;
    // 4 MiB device, 146 MiB host in 3 pieces: the map that fails is the last host piece's.
    EXPECT_EQ(try_alloc(core, 150 * kMiB, &s), res::unknown) << fake::op_name(op);
    fake.clear_failures();
    EXPECT_EQ(fake.host_used(), 0u) << fake::op_name(op);
    EXPECT_EQ(fake.live_handles(), 0u) << fake::op_name(op);
    EXPECT_EQ(fake.reservations(), 0u) << fake::op_name(op);
    EXPECT_EQ(core.budget().backed(0), 60 * kMiB);
    ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
  }
}

TEST(Budget, ThreadsNeverTakeMoreDeviceMemoryThanTheBudget) {
  FakeDriver fake;
  Core core(fake.driver(), load(R"(
[budget]
device = "96MiB"
spill = "host"

[[rules]]
size = ">= 4MiB"
backend = "vmm"
)"));
  constexpr int kThreads = 8;
  std::atomic<int> errors{0};
  std::atomic<std::size_t> peak{0};
  auto worker = [&](int t) {
    std::vector<DevPtr> mine;
    for (int i = 0; i < 60; ++i) {
      const std::size_t size = ((i * 7 + t) % 5 + 1) * kMiB + 4096 * t;
      DevPtr p = 0;
      if (try_alloc(core, size, &p) != res::ok) {
        ++errors;
        continue;
      }
      mine.push_back(p);
      std::size_t u = fake.used(0), seen = peak.load();
      while (u > seen && !peak.compare_exchange_weak(seen, u)) {}
      if (i % 3 == 2) {
        if (core.free(mine.front(), FreeRequest{}) != res::ok) ++errors;
        mine.erase(mine.begin());
      }
    }
    for (DevPtr p : mine)
      if (core.free(p, FreeRequest{}) != res::ok) ++errors;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_LE(peak.load(), 96 * kMiB) << "the fake's device memory never passed the budget";
  EXPECT_GT(core.budget().device_report(0).spilled_allocs, 0u) << "the workload needed spilling";
  EXPECT_EQ(core.registry().size(), 0u);
  EXPECT_EQ(fake.host_used(), 0u);
}

// The overrides the GPU suite (tests/gpu/suite.txt) sets through ALLOCSHIM_CONF.
TEST(Budget, TheGpuSuitesOverridesParse) {
  for (const char* conf :
       {"budget.device=8GiB,budget.spill=host", "budget.device=8GiB,budget.spill=managed",
        "budget.device=8GiB,budget.spill=host,budget.migrate=promote"}) {
    policy::Policy p = policy::default_policy();
    std::vector<policy::Diagnostic> errors;
    ASSERT_TRUE(policy::apply_overrides(p, nullptr, conf, errors))
        << conf << ": " << (errors.empty() ? "" : errors[0].str());
    EXPECT_EQ(p.budget.device, 8 * kGiB);
    EXPECT_NE(p.budget.spill, policy::Budget::Spill::none);
  }
  policy::Policy p = policy::default_policy();
  std::vector<policy::Diagnostic> errors;
  ASSERT_TRUE(policy::apply_overrides(p, "native", "budget.device=8GiB,budget.spill=host", errors));
  EXPECT_EQ(p.budget.migrate, policy::Budget::Migrate::off);
}

TEST(Budget, SummaryAndStatsFileCarryTheBudget) {
  FakeDriver fake;
  Core core(fake.driver(), load("[budget]\ndevice = \"64MiB\"\nspill = \"host\"\n"));
  const DevPtr a = must_alloc(core, 60 * kMiB);
  const DevPtr s = must_alloc(core, 8 * kMiB);
  const std::string text = core.summary();
  EXPECT_NE(text.find("budget device 0: limit 64.0 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("spilled 1 allocations, 4.0 MiB to host"), std::string::npos) << text;
  const std::string json = core.stats_json();
  EXPECT_NE(json.find("\"budget\":[{\"device\":0,\"limit\":67108864"), std::string::npos) << json;
  ASSERT_EQ(core.free(s, FreeRequest{}), res::ok);
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
}

}  // namespace
}  // namespace allocshim
