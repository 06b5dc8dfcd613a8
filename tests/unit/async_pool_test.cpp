// The async_pool backend on the fake driver: the pools it creates and how it configures them, when
// it synchronizes its internal stream, and what it leaves alone (the device's default pool).
#include "backends/async_pool.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/core.h"
#include "core_fixture.h"
#include "fake_driver.h"
#include "policy/policy.h"

namespace allocshim {
namespace {

class AsyncPoolTest : public testing::BackendFixture<> {
 protected:
  AsyncPoolTest() : BackendFixture(devices(2, 4 * kGiB)) {}
  void make(policy::BackendSpec spec = {}) {
    spec.name = "pool";
    BackendFixture::make(BackendKind::async_pool, spec);
  }
  DevPtr alloc(std::size_t size, int device = 0, Api api = Api::alloc,
               Stream stream = kStreamLegacy) {
    return alloc_on(size, FreeSync::none, device, api, stream);
  }
  Pool pool(int device = 0) const { return backend->ipc_pool(device); }
};

TEST_F(AsyncPoolTest, UsesAPoolOfItsOwnNeverTheDevicesDefault) {
  make();
  EXPECT_EQ(pool(), nullptr) << "created on the device's first allocation";
  alloc(3 * kMiB);
  ASSERT_NE(pool(), nullptr);
  EXPECT_NE(pool(), fake.default_pool(0));
  EXPECT_EQ(fake.live_pools(), 1u);
  EXPECT_EQ(fake.pool_reserved(fake.default_pool(0)), 0u);
  EXPECT_EQ(fake.calls(FakeOp::mem_alloc_async), 0u);
}

TEST_F(AsyncPoolTest, NeverReusesBlocksThroughHiddenStreamDependencies) {
  make();
  alloc(1 * kMiB);
  EXPECT_FALSE(fake.pool_reuse(pool(), PoolReuse::allow_internal_dependencies))
      << "a block could come back ordered behind a program stream's work";
  EXPECT_TRUE(fake.pool_reuse(pool(), PoolReuse::follow_event_dependencies));
  EXPECT_TRUE(fake.pool_reuse(pool(), PoolReuse::allow_opportunistic));
}

TEST_F(AsyncPoolTest, KeepsEverythingByDefaultAndHonoursAReleaseThreshold) {
  make();
  alloc(1 * kMiB);
  EXPECT_EQ(fake.pool_release_threshold(pool()), policy::kUnlimited);
  TearDown();
  policy::BackendSpec spec;
  spec.release_threshold = 8 * kMiB;
  make(spec);
  alloc(1 * kMiB);
  EXPECT_EQ(fake.pool_release_threshold(pool()), 8 * kMiB);
}

TEST_F(AsyncPoolTest, ReservesInitialBytesUpFrontAndKeepsThem) {
  policy::BackendSpec spec;
  spec.initial = 64 * kMiB;
  spec.release_threshold = 0;  // raised to `initial`, or the reservation would not survive a sync
  make(spec);
  alloc(64 * kMiB);
  EXPECT_EQ(backend->stats().device(0).hits(), 1u) << "served from the up-front reservation";
  EXPECT_EQ(fake.pool_reserved(pool()), 64 * kMiB);
  EXPECT_EQ(fake.pool_release_threshold(pool()), 64 * kMiB);
}

TEST_F(AsyncPoolTest, PoolsAreExportableWhereTheDeviceAllowsUnlessIpcIsFalse) {
  for (const std::optional<bool> ipc : {std::optional<bool>{}, std::optional<bool>{true}}) {
    policy::BackendSpec spec;
    spec.ipc = ipc;
    make(spec);
    alloc(1 * kMiB);
    int fd = -1;
    ASSERT_EQ(d.mem_pool_export_to_fd(&fd, pool()), res::ok) << "ipc " << (ipc ? "true" : "unset");
    EXPECT_GE(fd, 0);
    close(fd);
    for (auto it = blocks.begin(); it != blocks.end();) free((it++)->first);
  }
  policy::BackendSpec off;
  off.ipc = false;
  make(off);
  alloc(1 * kMiB);
  int fd = -1;
  EXPECT_NE(d.mem_pool_export_to_fd(&fd, pool()), res::ok) << "ipc = false: not exportable";
}

TEST(AsyncPoolIpc, ADeviceWithoutPosixFdHandlesGetsAPlainPool) {
  fake::FakeConfig c;
  c.attributes[static_cast<int>(DevAttr::posix_fd_supported)] = 0;
  FakeDriver fake(c);
  StreamTracker streams;
  policy::BackendSpec spec;
  spec.kind = BackendKind::async_pool;
  spec.name = "pool";
  std::string why;
  auto backend = make_backend(spec, fake.driver(), streams, why);
  ASSERT_NE(backend, nullptr) << why;
  AllocRequest req;
  req.size = kMiB;
  DevPtr p = 0;
  std::uint64_t cookie = 0;
  ASSERT_EQ(backend->allocate(req, FreeSync::none, &p, &cookie), res::ok) << "still served";
  int fd = -1;
  EXPECT_NE(fake.driver().mem_pool_export_to_fd(&fd, backend->ipc_pool(0)), res::ok);
  EXPECT_EQ(
      backend->deallocate(p, Block{kMiB, 0, 0, Api::alloc, FreeSync::none, cookie}, FreeRequest{}),
      res::ok);
}

TEST_F(AsyncPoolTest, SynchronizesItsStreamOnlyWhenThePoolGrew) {
  make();
  const DevPtr a = alloc(1 * kMiB);
  free(a);
  fake.reset_calls();
  EXPECT_EQ(alloc(1 * kMiB), a);
  EXPECT_EQ(fake.calls(FakeOp::stream_synchronize), 0u) << "a reused block needs no wait";
  EXPECT_EQ(backend->stats().device(0).hits(), 1u);
  alloc(1 * kMiB);
  EXPECT_EQ(fake.calls(FakeOp::stream_synchronize), 1u) << "fresh memory is waited for once";
  EXPECT_EQ(backend->stats().device(0).misses(), 2u);
}

TEST_F(AsyncPoolTest, StreamOrderedRequestsUseTheProgramsStream) {
  make();
  Stream s = nullptr;
  ASSERT_EQ(d.stream_create(&s, kStreamNonBlocking), res::ok);
  fake.hold_stream(s);
  const DevPtr p = alloc(1 * kMiB, 0, Api::async, s);
  EXPECT_NE(p, 0u);
  EXPECT_EQ(fake.calls(FakeOp::stream_synchronize), 0u) << "stream order is the program's to keep";
  FreeRequest fr;
  fr.async = true;
  fr.stream = s;
  EXPECT_EQ(backend->deallocate(p, blocks.at(p), fr), res::ok);
  blocks.erase(p);
  EXPECT_EQ(fake.blocking_waits(), 0u);
  fake.release_stream(s);
}

TEST_F(AsyncPoolTest, PeerAccessReachesPoolsMadeBeforeAndAfter) {
  make();
  alloc(1 * kMiB, 0);
  ASSERT_EQ(backend->enable_peer_access(1, 0), res::ok);  // device 1 reads device 0's pool
  EXPECT_TRUE(fake.pool_access(pool(0), 1));
  ASSERT_EQ(backend->enable_peer_access(0, 1), res::ok);  // before device 1's pool exists
  fake.set_current_device(1);
  alloc(1 * kMiB, 1);
  fake.set_current_device(0);
  EXPECT_TRUE(fake.pool_access(pool(1), 0));
}

TEST_F(AsyncPoolTest, ReportsWhatItReservesAndGivesItBackOnTrim) {
  make();
  std::vector<DevPtr> v;
  for (int i = 0; i < 4; ++i) v.push_back(alloc(3 * kMiB));
  for (DevPtr p : v) free(p);
  EXPECT_EQ(backend->reserved(0), fake.pool_reserved(pool()));
  EXPECT_GT(backend->reserved(0), 0u);
  EXPECT_EQ(backend->stats().device(0).peak_reserved_bytes(), fake.pool_reserved(pool()));
  ASSERT_EQ(backend->trim(0), res::ok);
  EXPECT_EQ(backend->reserved(0), 0u);
  EXPECT_EQ(fake.used(0), 0u);
}

TEST_F(AsyncPoolTest, ADeviceWithoutPoolsIsRefusedNotServedElsewhere) {
  // The fake answers attributes from its construction-time config, and only one fake may live at a
  // time: the backend gets a copy of the table whose attribute query says "no pools".
  static Driver table;
  table = d;
  table.device_get_attribute = [](int* value, DevAttr attr, int device) {
    if (attr == DevAttr::pools_supported) {
      *value = 0;
      return res::ok;
    }
    return FakeDriver::current()->driver().device_get_attribute(value, attr, device);
  };
  policy::BackendSpec spec;
  spec.kind = BackendKind::async_pool;
  std::string why;
  backend = make_backend(spec, table, streams, why);
  ASSERT_NE(backend, nullptr);
  AllocRequest req;
  req.size = 1 * kMiB;
  DevPtr p = 0;
  std::uint64_t cookie = 0;
  EXPECT_EQ(backend->allocate(req, FreeSync::none, &p, &cookie), res::not_supported);
  EXPECT_EQ(fake.live_pools(), 0u);
}

}  // namespace
}  // namespace allocshim
