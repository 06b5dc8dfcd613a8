// The core's dispatch on the fake driver: policy decision -> backend -> registry, frees routed back
// to the backend that served them, unknown pointers forwarded, fallbacks, accounting.
#include "core/core.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/async_pool.h"
#include "fake_driver.h"
#include "core_fixture.h"
#include "policy/watch.h"

#include <unistd.h>

#include <cstdio>

namespace allocshim {
namespace {

using testing::single;

policy::Policy load(const char* text) { return testing::parsed(text, "test.toml"); }

std::size_t index_of(const Core& core, BackendKind kind) {
  return testing::backend_index(core, kind);
}

TEST(Core, NativeAllocationIsRegisteredAndFreedByTheDriver) {
  FakeDriver fake;
  Core core(fake.driver(), single(BackendKind::native));
  AllocRequest req;
  req.size = 3 * kMiB;
  DevPtr p = 0;
  ASSERT_EQ(core.alloc(req, &p), res::ok);
  EXPECT_NE(p, 0u);
  EXPECT_EQ(fake.calls(FakeOp::mem_alloc), 1u);
  EXPECT_EQ(core.registry().size(), 1u);
  EXPECT_EQ(fake.used(0), 3 * kMiB);

  ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.calls(FakeOp::mem_free), 1u);
  EXPECT_EQ(core.registry().size(), 0u);
  EXPECT_EQ(fake.used(0), 0u);
  const DeviceStats& s = core.backend(0).stats().device(0);
  EXPECT_EQ(s.allocs(), 1u);
  EXPECT_EQ(s.frees(), 1u);
  EXPECT_EQ(s.bytes_allocated(), 3 * kMiB);
  EXPECT_EQ(s.peak_bytes(), 3 * kMiB);
  EXPECT_EQ(s.live_bytes(), 0u);
  EXPECT_EQ(core.unknown_frees(), 0u);
}

TEST(Core, FreeOfAPointerTheShimDidNotAllocateIsForwarded) {
  FakeDriver fake;
  Core core(fake.driver(), single(BackendKind::native));
  DevPtr foreign = 0;
  ASSERT_EQ(fake.driver().mem_alloc(&foreign, kMiB), res::ok);  // made before the shim saw it
  ASSERT_EQ(core.free(foreign, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.used(0), 0u) << "the driver must have freed it";
  EXPECT_EQ(core.unknown_frees(), 1u);
  // A bogus pointer gets the driver's own error, not a crash or a success.
  EXPECT_NE(core.free(0xdead0000, FreeRequest{}), res::ok);
}

TEST(Core, DriverFailureIsReturnedUnchangedAndNothingIsRegistered) {
  FakeDriver fake;
  Core core(fake.driver(), single(BackendKind::native));
  fake.fail_next(FakeOp::mem_alloc, res::out_of_memory);
  AllocRequest req;
  req.size = kMiB;
  DevPtr p = 0;
  EXPECT_EQ(core.alloc(req, &p), res::out_of_memory);
  EXPECT_EQ(core.registry().size(), 0u);
  EXPECT_EQ(core.backend(0).stats().device(0).failures(), 1u);
}

TEST(Core, APolicyThatCannotBeServedFallsBackToNativeAndSaysWhy) {
  FakeDriver fake;
  // `host` needs the VMM API: a driver without it cannot serve this policy.
  Driver no_vmm = fake.driver();
  no_vmm.mem_create = nullptr;
  Core core(no_vmm, single(BackendKind::host));
  EXPECT_NE(core.error().find("host"), std::string::npos) << core.error();
  AllocRequest req;
  req.size = kMiB;
  DevPtr p = 0;
  ASSERT_EQ(core.alloc(req, &p), res::ok);
  EXPECT_EQ(fake.calls(FakeOp::mem_alloc), 1u);
  ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.used(0), 0u);
}

// The default backend is for cudaMalloc-style memory: managed memory must stay host-accessible and
// the program's own stream-ordered allocations keep their pool and stream unless a rule says so.
TEST(Core, ManagedAndAsyncRequestsStayNativeUnlessARuleNamesThem) {
  FakeDriver fake;
  Core core(fake.driver(), single(BackendKind::vmm, FreeSync::none));
  DevPtr m = 0, a = 0, d = 0;
  AllocRequest managed;
  managed.size = kMiB;
  managed.api = Api::managed;
  managed.flags = 1;  // CU_MEM_ATTACH_GLOBAL
  ASSERT_EQ(core.alloc(managed, &m), res::ok);
  EXPECT_EQ(fake.calls(FakeOp::mem_alloc_managed), 1u);
  AllocRequest async;
  async.size = kMiB;
  async.api = Api::async;
  ASSERT_EQ(core.alloc(async, &a), res::ok);
  EXPECT_EQ(fake.calls(FakeOp::mem_alloc_async), 1u);
  AllocRequest plain;
  plain.size = kMiB;
  ASSERT_EQ(core.alloc(plain, &d), res::ok);
  EXPECT_EQ(fake.calls(FakeOp::mem_alloc), 0u)
      << "cudaMalloc-style requests go to the default (vmm)";
  EXPECT_EQ(core.free(m, FreeRequest{}), res::ok);
  EXPECT_EQ(core.free(a, FreeRequest{kStreamLegacy, true}), res::ok);
  EXPECT_EQ(fake.calls(FakeOp::mem_free_async), 1u);
  EXPECT_EQ(core.free(d, FreeRequest{}), res::ok);
  EXPECT_EQ(core.registry().size(), 0u);
}

TEST(Core, RulesRouteSizesToDifferentBackendsAndFreesReturnToTheirOwner) {
  FakeDriver fake;
  Core core(fake.driver(), load(R"(
version = 1
[defaults]
backend = "native"
free_sync = "device"
[backends.big]
kind = "vmm"
[[rules]]
size = ">= 1MiB"
backend = "big"
)"));
  ASSERT_TRUE(core.error().empty()) << core.error();
  AllocRequest small, big;
  small.size = 4096;
  big.size = 4 * kMiB;
  DevPtr s = 0, b = 0;
  ASSERT_EQ(core.alloc(small, &s), res::ok);
  ASSERT_EQ(core.alloc(big, &b), res::ok);
  EXPECT_EQ(fake.calls(FakeOp::mem_alloc), 1u) << "only the small one is native";
  const std::size_t vmm = index_of(core, BackendKind::vmm),
                    native = index_of(core, BackendKind::native);
  ASSERT_LT(vmm, core.backend_count());
  ASSERT_LT(native, core.backend_count());
  EXPECT_EQ(core.backend(vmm).stats().device(0).allocs(), 1u);
  EXPECT_EQ(core.backend(native).stats().device(0).allocs(), 1u);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
  ASSERT_EQ(core.free(s, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.calls(FakeOp::mem_free), 1u) << "the vmm block must not be freed with cuMemFree";
  EXPECT_EQ(core.backend(vmm).stats().device(0).frees(), 1u);
  EXPECT_EQ(core.backend(native).stats().device(0).frees(), 1u);
}

// Frameworks size themselves from cuMemGetInfo: memory a pooling backend caches after the program
// freed it must be reported free.
TEST(Core, MemGetInfoReportsCachedPoolMemoryAsFree) {
  FakeDriver fake;
  Core core(fake.driver(), single(BackendKind::vmm, FreeSync::none));
  AllocRequest req;
  req.size = 8 * kMiB;
  DevPtr p = 0;
  ASSERT_EQ(core.alloc(req, &p), res::ok);
  ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
  const std::size_t vmm = index_of(core, BackendKind::vmm);
  const std::size_t cached = core.backend(vmm).reserved(0);
  ASSERT_GT(cached, 0u)
      << "the vmm backend keeps its chunks after a free (default release threshold)";
  std::size_t driver_free = 0, driver_total = 0, free = 0, total = 0;
  ASSERT_EQ(fake.driver().mem_get_info(&driver_free, &driver_total), res::ok);
  ASSERT_EQ(core.mem_get_info(&free, &total), res::ok);
  EXPECT_EQ(total, driver_total);
  EXPECT_EQ(free, driver_free + cached);
}

TEST(Core, HostAndProgramVmmAllocationsAreAccounted) {
  FakeDriver fake;
  Core core(fake.driver(), single(BackendKind::native));
  void* h = nullptr;
  ASSERT_EQ(core.host_alloc(&h, 4096, 0, true), res::ok);
  ASSERT_NE(h, nullptr);
  core.on_created(0x1234, 2 * kMiB, Location{Location::Type::device, 0});
  const auto live = nlohmann::json::parse(core.stats_json());
  EXPECT_EQ(live["api"]["host"], 1);
  EXPECT_EQ(live["api"]["create"], 1);
  EXPECT_EQ(live["host"]["devices"][0]["live"], 4096);
  EXPECT_EQ(live["created"]["devices"][0]["live"], 2 * kMiB);
  ASSERT_EQ(core.host_free(h), res::ok);
  core.on_released(0x1234);
  core.on_released(0x9999);  // a handle the shim never saw: ignored
  const auto after = nlohmann::json::parse(core.stats_json());
  EXPECT_EQ(after["host"]["devices"][0]["live"], 0);
  EXPECT_EQ(after["created"]["devices"][0]["live"], 0);
  EXPECT_NE(core.summary().find("program cuMemCreate"), std::string::npos);
}

// The device of an allocation is the current context's; with one device it can only be 0, and the
// core stops asking the driver once it knows the count (a cuCtxGetDevice per hit saved).
TEST(Core, AsksForTheCurrentDeviceOnlyWithSeveralDevices) {
  for (int devices : {1, 2}) {
    FakeConfig c;
    c.devices = devices;
    FakeDriver fake(c);
    Core core(fake.driver(), single(BackendKind::vmm, FreeSync::none));
    AllocRequest req;
    req.size = 4096;
    DevPtr p = 0;
    ASSERT_EQ(core.alloc(req, &p), res::ok);
    ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
    fake.reset_calls();
    for (int i = 0; i < 10; ++i) {
      ASSERT_EQ(core.alloc(req, &p), res::ok);
      ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
    }
    EXPECT_EQ(fake.calls(FakeOp::ctx_get_device), devices == 1 ? 0u : 10u) << devices << " devices";
    if (devices == 2) {
      fake.set_current_device(1);
      ASSERT_EQ(core.alloc(req, &p), res::ok);
      EXPECT_EQ(core.backend(1).stats().device(1).allocs(), 1u) << "served on the current device";
      ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
    }
  }
}

TEST(Core, StatsJsonDescribesEveryBackend) {
  FakeDriver fake;
  Core core(fake.driver(), single(BackendKind::native));
  DevPtr p = 0;
  AllocRequest req;
  req.size = 1000;
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(core.alloc(req, &p), res::ok);
    ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
  }
  const auto j = nlohmann::json::parse(core.stats_json());
  ASSERT_EQ(j["backends"].size(), core.backend_count());
  EXPECT_EQ(j["backends"][0]["kind"], "native");
  EXPECT_EQ(j["backends"][0]["devices"][0]["allocs"], 5);
  EXPECT_EQ(j["backends"][0]["devices"][0]["frees"], 5);
  EXPECT_EQ(j["api"]["alloc"], 5);
  std::uint64_t histogram = 0;
  for (const auto& v : j["backends"][0]["devices"][0]["latency_log2_ns"])
    histogram += v.get<std::uint64_t>();
  EXPECT_EQ(histogram, 10u) << "every alloc and free lands in one latency bucket";
}

}  // namespace
}  // namespace allocshim

namespace allocshim {
namespace {

void write_file(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(text.c_str(), f);
  std::fclose(f);
}

// Two devices whose VMM mappings no device may use until granted, as on a GPU.
FakeConfig two_strict_devices() { return FakeConfig{.devices = 2, .strict_access = true}; }

// Whether `device` may use the VMM range [p, p + size) (its first and its last byte).
bool granted(const FakeDriver& fake, DevPtr p, std::size_t size, int device) {
  return fake.has_access(p, device, true) && fake.has_access(p + size - 1, device, true);
}

// Device 0's primary context, retained (the caller releases it), with device 1 current: the
// program about to call cuCtxEnablePeerAccess(ctx0) from device 1.
Context device0_context_from_device1(FakeDriver& fake) {
  Context ctx0 = nullptr;
  EXPECT_EQ(fake.driver().primary_ctx_retain(&ctx0, 0), res::ok);
  fake.set_current_device(1);
  return ctx0;
}

// cuCtxEnablePeerAccess from the program's current device (1) to a peer context (device 0's): the
// core must name both devices right, so device 1 reaches device 0's pooled memory, made before and
// after the call (with the devices swapped, device 0 would be "granted" its own memory and device 1
// would fault on a GPU). The program's context is current again afterwards, and a repeated call
// reports ALREADY_ENABLED as the driver does.
TEST(CorePeers, PeerAccessReachesTheCurrentDeviceThroughEveryPoolingBackend) {
  for (BackendKind kind : {BackendKind::vmm, BackendKind::async_pool}) {
    SCOPED_TRACE(backend_kind_name(kind));
    FakeDriver fake(two_strict_devices());
    const Driver& d = fake.driver();
    Core core(d, single(kind));
    const std::size_t pooled = index_of(core, kind);
    ASSERT_LT(pooled, core.backend_count()) << core.error();
    auto reaches = [&](DevPtr p, std::size_t size, int device) {
      if (kind == BackendKind::async_pool)
        return fake.pool_access(core.backend(pooled).ipc_pool(0), device);
      return granted(fake, p, size, device);
    };
    const DevPtr before = testing::must_alloc(core, 3 * kMiB);  // device 0, current by default
    EXPECT_FALSE(reaches(before, 3 * kMiB, 1));
    Context ctx0 = device0_context_from_device1(fake);
    ASSERT_NE(ctx0, nullptr);
    ASSERT_EQ(core.enable_peer_access(ctx0, 0), res::ok);
    EXPECT_TRUE(fake.peer_enabled(1, 0));
    int current = -1;
    ASSERT_EQ(d.ctx_get_device(&current), res::ok);
    EXPECT_EQ(current, 1) << "the program's context is current again";
    EXPECT_TRUE(reaches(before, 3 * kMiB, 1));
    fake.set_current_device(0);
    const DevPtr after = testing::must_alloc(core, 64 * kMiB);
    EXPECT_TRUE(reaches(after, 64 * kMiB, 1));
    fake.set_current_device(1);
    EXPECT_EQ(core.enable_peer_access(ctx0, 0), res::peer_access_already_enabled);
    fake.set_current_device(0);
    EXPECT_EQ(core.free(before, FreeRequest{}), res::ok);
    EXPECT_EQ(core.free(after, FreeRequest{}), res::ok);
    EXPECT_EQ(d.primary_ctx_release(0), res::ok);
  }
}

// One backend failing to extend peer access must not keep the others from it: the pool's grant
// fails, the vmm region is still granted, and the program gets the pool's error (its kernels would
// fault on that memory, so an error now beats an illegal address later).
TEST(CorePeers, AFailingBackendDoesNotStopTheOthers) {
  FakeDriver fake(two_strict_devices());
  const Driver& d = fake.driver();
  Core core(d, load(R"(
version = 1
[defaults]
backend = "async_pool"
[[rules]]
size = ">= 1MiB"
backend = "vmm"
)"));
  AllocRequest small, big;
  small.size = 4096;
  big.size = 8 * kMiB;
  DevPtr s = 0, v = 0;
  ASSERT_EQ(core.alloc(small, &s), res::ok);
  ASSERT_EQ(core.alloc(big, &v), res::ok);
  const std::size_t pool = index_of(core, BackendKind::async_pool);
  ASSERT_LT(pool, core.backend_count());
  Context ctx0 = device0_context_from_device1(fake);
  ASSERT_NE(ctx0, nullptr);
  fake.fail_next(FakeOp::mem_pool_set_access, res::out_of_memory);
  EXPECT_EQ(core.enable_peer_access(ctx0, 0), res::out_of_memory);
  EXPECT_FALSE(fake.pool_access(core.backend(pool).ipc_pool(0), 1));
  EXPECT_TRUE(granted(fake, v, 8 * kMiB, 1))
      << "the vmm region is granted although the pool's grant failed";
  fake.set_current_device(0);
  EXPECT_EQ(core.free(s, FreeRequest{}), res::ok);
  EXPECT_EQ(core.free(v, FreeRequest{}), res::ok);
  EXPECT_EQ(d.primary_ctx_release(0), res::ok);
}

// Reload: new allocations follow the new file, blocks already handed out are freed by the backend
// that made them, and a broken file keeps the policy in force.
TEST(CoreReload, NewAllocationsFollowTheNewFileAndOldBlocksGoHome) {
  FakeDriver fake;
  std::string dir_name = ::testing::TempDir() + "allocshim-reload-XXXXXX";
  ASSERT_NE(mkdtemp(dir_name.data()), nullptr);
  const char* dir = dir_name.c_str();
  const std::string path = std::string(dir) + "/policy.toml";
  write_file(path, "version = 1\n[defaults]\nbackend = \"native\"\n");
  policy::Policy first;
  std::vector<policy::Diagnostic> errors;
  const policy::LoadOptions all{policy::kAllKinds};
  ASSERT_TRUE(policy::load_file(path, first, errors, all));
  Core core(fake.driver(), first);
  core.enable_reload(std::make_unique<policy::PolicyWatcher>(path, 0, nullptr, nullptr, all));

  AllocRequest req;
  req.size = kMiB;
  DevPtr before = 0, after = 0;
  ASSERT_EQ(core.alloc(req, &before), res::ok);
  EXPECT_EQ(fake.calls(FakeOp::mem_alloc), 1u);

  write_file(path,
             "version = 1\n[defaults]\nbackend = \"vmm\"\nfree_sync = \"none\"\n# now pooled\n");
  ASSERT_EQ(core.alloc(req, &after), res::ok);
  EXPECT_EQ(core.reloads(), 1u);
  EXPECT_EQ(fake.calls(FakeOp::mem_alloc), 1u)
      << "the second allocation must come from the vmm backend";
  EXPECT_EQ(core.policy().backends[static_cast<std::size_t>(core.policy().default_backend)].kind,
            BackendKind::vmm);

  ASSERT_EQ(core.free(before, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.calls(FakeOp::mem_free), 1u)
      << "the block made before the reload goes back natively";

  write_file(path, "version = 1\n[defaults]\nbackend = \"nosuch\"\n");
  DevPtr third = 0;
  ASSERT_EQ(core.alloc(req, &third), res::ok);
  EXPECT_EQ(core.reloads(), 1u) << "an invalid file is not installed";
  EXPECT_EQ(fake.calls(FakeOp::mem_alloc), 1u) << "and the vmm policy stays in force";
  ASSERT_EQ(core.free(after, FreeRequest{}), res::ok);
  ASSERT_EQ(core.free(third, FreeRequest{}), res::ok);
  EXPECT_EQ(core.registry().size(), 0u);
  std::remove(path.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace allocshim

namespace allocshim {
namespace {

// A rule on the call stack: the test binary's own module matches "*core_test*", nothing matches
// the other glob. The stack is symbolized once per distinct call site, then served from the cache.
__attribute__((noinline)) Result allocate_here(Core& core, DevPtr* p) {
  AllocRequest req;
  req.size = kMiB;
  return core.alloc(req, p);
}

TEST(CoreCallsite, RulesMatchTheCallStackAndDecisionsAreCachedPerSite) {
  FakeDriver fake;
  Core core(fake.driver(), load(R"(
version = 1
[defaults]
backend = "native"
[backends.pooled]
kind = "vmm"
[[rules]]
callsite = "*no_such_function_anywhere*"
backend = "native"
free_sync = "none"
[[rules]]
callsite = "*core_test*"
backend = "pooled"
)"));
  std::vector<DevPtr> blocks(100);
  for (DevPtr& p : blocks) ASSERT_EQ(allocate_here(core, &p), res::ok);
  EXPECT_EQ(fake.calls(FakeOp::mem_alloc), 0u) << "every allocation matched the second rule (vmm)";
  EXPECT_EQ(core.callsites().lookups(), 100u);
  EXPECT_EQ(core.callsites().misses(), 1u) << "one call site: symbolized once";
  for (DevPtr p : blocks) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
}

TEST(CoreCallsite, PoliciesWithoutCallsiteRulesNeverCaptureStacks) {
  FakeDriver fake;
  Core core(fake.driver(), single(BackendKind::native));
  DevPtr p = 0;
  ASSERT_EQ(allocate_here(core, &p), res::ok);
  EXPECT_EQ(core.callsites().lookups(), 0u);
  ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
}

}  // namespace
}  // namespace allocshim

namespace allocshim {
namespace {

// Memory one backend caches is free memory for another: when the driver refuses a native request,
// the vmm backend's cached chunks are released and the request retried once.
TEST(CoreOutOfMemory, CachedMemoryOfOtherBackendsIsReleasedBeforeTheRefusalIsFinal) {
  FakeConfig config;
  config.capacity = 64 * kMiB;
  FakeDriver fake(config);
  Core core(fake.driver(), load(R"(
version = 1
[defaults]
backend = "native"
[backends.pooled]
kind = "vmm"
[[rules]]
size = "<= 32MiB"
backend = "pooled"
free_sync = "none"
)"));
  AllocRequest small;
  small.size = 32 * kMiB;
  DevPtr p = 0;
  ASSERT_EQ(core.alloc(small, &p), res::ok);
  ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
  ASSERT_GE(fake.used(0), 32 * kMiB) << "the vmm backend keeps its chunks cached after the free";

  AllocRequest big;  // native: needs all 64 MiB, which only fit once the cache is released
  big.size = 60 * kMiB;
  DevPtr q = 0;
  ASSERT_EQ(core.alloc(big, &q), res::ok);
  ASSERT_EQ(core.free(q, FreeRequest{}), res::ok);

  AllocRequest impossible;
  impossible.size = 65 * kMiB;
  EXPECT_EQ(core.alloc(impossible, &q), res::out_of_memory)
      << "still the driver's own error when nothing helps";
}

}  // namespace
}  // namespace allocshim
