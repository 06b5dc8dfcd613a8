// Context destruction mid-run (core/reset.cpp): after cuDevicePrimaryCtxReset or cuCtxDestroy the
// shim holds nothing of the context, never touches a handle the driver destroyed (the fake counts
// such uses; a real driver may crash on them), and serves the device again from scratch.
#include <gtest/gtest.h>

#include <vector>

#include "backends/vmm.h"
#include "core/core.h"
#include "fake_driver.h"
#include "core_fixture.h"

namespace allocshim {
namespace {

using testing::single;

struct Param {
  BackendKind kind;
  FreeSync sync;
};

std::string name_of(const ::testing::TestParamInfo<Param>& info) {
  return std::string(backend_kind_name(info.param.kind)) + "_" +
         (info.param.sync == FreeSync::barrier ? "barrier" : "device");
}

class Reset : public ::testing::TestWithParam<Param> {
 protected:
  Reset() : core(fake.driver(), single(GetParam().kind, GetParam().sync)) {}

  DevPtr alloc(std::size_t bytes) { return testing::must_alloc(core, bytes); }
  // What a program does between resets: allocate, use, free some, leave some, a stream of its
  // own (a barrier free records an event on it), and a free still pending when the reset comes.
  std::vector<DevPtr> round() {
    Stream s = nullptr;
    EXPECT_EQ(fake.driver().stream_create(&s, kStreamNonBlocking), res::ok);
    core.on_stream_created(s, kStreamNonBlocking);
    std::vector<DevPtr> kept;
    for (std::size_t bytes : {std::size_t{4096}, 3 * kMiB, 40 * kMiB, std::size_t{100000}}) {
      const DevPtr p = alloc(bytes);
      EXPECT_EQ(fake.driver().memset_d8(p, 0x5a, bytes), res::ok);
      kept.push_back(p);
    }
    fake.hold_stream(s);  // work in flight: a barrier free stays pending
    EXPECT_EQ(core.free(kept[1], FreeRequest{}), res::ok);
    kept.erase(kept.begin() + 1);
    return kept;
  }
  std::size_t live_bytes() const {
    std::size_t live = 0;
    for (std::size_t i = 0; i < core.backend_count(); ++i)
      live += core.backend(i).stats().device(0).live_bytes();
    return live;
  }
  void reset_device() {
    core.on_primary_reset(0);                           // the hook, before the driver
    ASSERT_EQ(fake.reset_primary_context(0), res::ok);  // what the driver does
  }

  // Releasing the last reference destroys the primary context only in the test of that path.
  static FakeConfig config() {
    FakeConfig c;
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    c.release_destroys = test.rfind("TheLastPrimaryRelease", 0) == 0;
    return c;
  }

  FakeDriver fake{config()};
  Core core;
};

TEST_P(Reset, DropsEveryBlockStreamEventAndPoolAndServesAgain) {
  for (int i = 0; i < 4; ++i) {
    const std::vector<DevPtr> kept = round();
    reset_device();
    EXPECT_EQ(core.registry().size(), 0u) << "the program's blocks died with the context";
    EXPECT_EQ(live_bytes(), 0u);
    EXPECT_EQ(fake.live_pools(), 0u);
    EXPECT_EQ(fake.live_streams(), 0u);
    EXPECT_EQ(fake.live_events(), 0u);
    // VMM memory is not the context's in the fake: whatever the shim mapped, it gave back.
    EXPECT_EQ(fake.live_handles(), 0u);
    EXPECT_EQ(fake.mappings(), 0u);
    EXPECT_EQ(fake.reservations(), 0u);
    EXPECT_EQ(fake.used(0), 0u);
    // A stale pointer's free goes to the driver, which refuses it as natively.
    EXPECT_NE(core.free(kept.front(), FreeRequest{}), res::ok);
  }
  // Served again from scratch, and usable.
  const DevPtr p = alloc(5 * kMiB);
  EXPECT_EQ(fake.driver().memset_d8(p, 1, 5 * kMiB), res::ok);
  EXPECT_EQ(core.free(p, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.stale_uses(), 0u) << "the shim used a handle the reset destroyed";
  EXPECT_EQ(core.contexts_dropped(), 4u);
}

TEST_P(Reset, CtxDestroyDropsTheSameWay) {
  round();
  Context ctx = nullptr;
  ASSERT_EQ(fake.driver().ctx_get_current(&ctx), res::ok);
  if (ctx == nullptr) {
    fake.set_current_device(0);
    ASSERT_EQ(fake.driver().ctx_get_current(&ctx), res::ok);
  }
  core.on_context_destroy(ctx);
  ASSERT_EQ(fake.destroy_context(ctx), res::ok);
  fake.set_current_device(0);
  EXPECT_EQ(core.registry().size(), 0u);
  EXPECT_EQ(fake.live_pools() + fake.live_events() + fake.live_handles(), 0u);
  const DevPtr p = alloc(kMiB);
  EXPECT_EQ(core.free(p, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.stale_uses(), 0u);
}

TEST_P(Reset, TheLastPrimaryReleaseDropsWithoutTouchingTheDeadContext) {
  // The last reference goes, and the context with it; the shim learns only afterwards
  // (cuDevicePrimaryCtxGetState) and must not touch its streams, events or pools, which are gone.
  for (int i = 0; i < 4; ++i) {
    Context runtime = nullptr;
    ASSERT_EQ(fake.driver().primary_ctx_retain(&runtime, 0), res::ok);  // the runtime's reference
    ASSERT_EQ(fake.driver().ctx_set_current(runtime), res::ok);
    round();
    const Context ctx = core.primary_context(0);               // the hook, before the release
    ASSERT_EQ(fake.driver().primary_ctx_release(0), res::ok);  // the real release: destroyed
    core.after_primary_release(0, ctx);
    EXPECT_EQ(core.registry().size(), 0u);
    EXPECT_EQ(live_bytes(), 0u);
    EXPECT_EQ(fake.live_handles() + fake.mappings() + fake.reservations(), 0u)
        << "VMM memory given back";
  }
  Context runtime = nullptr;
  ASSERT_EQ(fake.driver().primary_ctx_retain(&runtime, 0), res::ok);
  const DevPtr p = alloc(5 * kMiB);
  EXPECT_EQ(core.free(p, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.stale_uses(), 0u) << "the shim used a handle the release destroyed";
  EXPECT_EQ(core.contexts_dropped(), 4u);
}

TEST_P(Reset, AResetByARouteTheShimDoesNotHookIsFoundAtTheNextRetain) {
  // The runtime retains the primary context before it uses the device again; the handle is the
  // same, the id (cuCtxGetId) is new, and the old context's handles must not be touched.
  for (int i = 0; i < 4; ++i) {
    Context runtime = nullptr;
    ASSERT_EQ(fake.driver().primary_ctx_retain(&runtime, 0), res::ok);
    core.after_primary_retain(0, runtime);  // the hook
    ASSERT_EQ(fake.driver().ctx_set_current(runtime), res::ok);
    round();
    ASSERT_EQ(fake.reset_primary_context(0), res::ok);  // no hook before it
  }
  Context runtime = nullptr;
  ASSERT_EQ(fake.driver().primary_ctx_retain(&runtime, 0), res::ok);
  core.after_primary_retain(0, runtime);
  EXPECT_EQ(core.registry().size(), 0u);
  EXPECT_EQ(live_bytes(), 0u);
  EXPECT_EQ(fake.live_handles() + fake.mappings() + fake.reservations(), 0u)
      << "VMM memory given back";
  const DevPtr p = alloc(5 * kMiB);
  EXPECT_EQ(fake.driver().memset_d8(p, 1, 5 * kMiB), res::ok);
  EXPECT_EQ(core.free(p, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.stale_uses(), 0u) << "the shim used a handle the reset destroyed";
  EXPECT_EQ(core.contexts_dropped(), 4u);
  // Retains that find the same context drop nothing.
  ASSERT_EQ(fake.driver().primary_ctx_retain(&runtime, 0), res::ok);
  core.after_primary_retain(0, runtime);
  EXPECT_EQ(core.contexts_dropped(), 4u);
}

TEST_P(Reset, AReleaseThatLeavesTheContextAliveDropsNothing) {
  Context runtime = nullptr;
  ASSERT_EQ(fake.driver().primary_ctx_retain(&runtime, 0), res::ok);
  ASSERT_EQ(fake.driver().primary_ctx_retain(&runtime, 0), res::ok);
  const DevPtr p = alloc(kMiB);
  const Context ctx = core.primary_context(0);
  ASSERT_EQ(fake.driver().primary_ctx_release(0), res::ok);
  core.after_primary_release(0, ctx);
  EXPECT_EQ(core.registry().size(), 1u);
  EXPECT_EQ(core.contexts_dropped(), 0u);
  EXPECT_EQ(core.free(p, FreeRequest{}), res::ok);
}

// Each backend kind with the free_sync modes it is run with.
const Param kBackends[] = {
    {BackendKind::native, FreeSync::device},      {BackendKind::async_pool, FreeSync::device},
    {BackendKind::async_pool, FreeSync::barrier}, {BackendKind::vmm, FreeSync::device},
    {BackendKind::vmm, FreeSync::barrier},        {BackendKind::host, FreeSync::device},
    {BackendKind::managed, FreeSync::device}};
INSTANTIATE_TEST_SUITE_P(Backends, Reset, ::testing::ValuesIn(kBackends), name_of);

TEST(ResetOtherDevice, LeavesTheOtherDevicesMemoryAlone) {
  FakeConfig c;
  c.devices = 2;
  FakeDriver fake(c);
  Core core(fake.driver(), single(BackendKind::async_pool, FreeSync::barrier));
  AllocRequest req;
  req.size = kMiB;
  fake.set_current_device(1);
  DevPtr on1 = 0;
  ASSERT_EQ(core.alloc(req, &on1), res::ok);
  fake.set_current_device(0);
  DevPtr on0 = 0;
  ASSERT_EQ(core.alloc(req, &on0), res::ok);
  core.on_primary_reset(0);
  ASSERT_EQ(fake.reset_primary_context(0), res::ok);
  EXPECT_EQ(core.registry().size(), 1u);
  EXPECT_EQ(fake.live_pools(), 1u) << "device 1's pool stays";
  fake.set_current_device(1);
  EXPECT_EQ(core.free(on1, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.stale_uses(), 0u);
}

}  // namespace
}  // namespace allocshim
