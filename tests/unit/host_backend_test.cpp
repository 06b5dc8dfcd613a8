// The `host` backend on the fake driver: pinned host chunks (HOST_NUMA with the device's NUMA id,
// HOST where there is none) mapped into the device's address space with access granted before the
// address is handed out; pointer queries; peers; frees that wait; nothing leaked on failure.
#include "backends/host.h"
#include "host_probe.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/core.h"
#include "core_fixture.h"
#include "base/streams.h"
#include "fake_driver.h"

namespace allocshim {
namespace {

constexpr int kNumaAttr = static_cast<int>(DevAttr::host_numa_id);

struct Fixture {
  explicit Fixture(FakeConfig c = strict()) : fake(c) {
    policy::BackendSpec spec;
    spec.name = "host";
    spec.kind = BackendKind::host;
    std::string why;
    backend = make_backend(spec, fake.driver(), streams, why);
    EXPECT_NE(backend, nullptr) << why;
  }
  static FakeConfig strict() {
    FakeConfig c;
    c.strict_access = true;  // unusable until cuMemSetAccess, as on a GPU
    return c;
  }
  Result alloc(std::size_t size, DevPtr* p, Block* block, FreeSync sync = FreeSync::device) {
    AllocRequest req;
    req.size = size;
    req.device = current;
    std::uint64_t cookie = 0;
    const Result r = backend->allocate(req, sync, p, &cookie);
    *block = Block{size, 0, static_cast<std::int16_t>(current), Api::alloc, sync, cookie};
    return r;
  }
  FakeDriver fake;
  StreamTracker streams;
  std::unique_ptr<Backend> backend;
  int current = 0;
};

TEST(HostBackend, ServesPinnedHostChunksMappedForTheDevice) {
  FakeConfig c = Fixture::strict();
  c.attributes[kNumaAttr] = 3;
  Fixture f(c);
  DevPtr p = 0;
  Block b;
  ASSERT_EQ(f.alloc(5 * kMiB + 7, &p, &b), res::ok);
  EXPECT_EQ(p % 256, 0u);
  EXPECT_EQ(f.fake.used(0), 0u) << "no device memory";
  EXPECT_EQ(f.fake.host_used(), 6 * kMiB) << "rounded up to the granularity";
  const HostInfo h = host_info(*f.backend, 0);
  EXPECT_EQ(h.host_location.type, Location::Type::host_numa);
  EXPECT_EQ(h.host_location.id, 3);
  EXPECT_EQ(h.host_bytes, 6 * kMiB);
  EXPECT_EQ(h.mappings, 1u) << "one physical allocation for the policy kind";
  EXPECT_TRUE(f.fake.has_access(p, 0, true));
  EXPECT_TRUE(f.fake.has_access(p + 5 * kMiB, 0, true));
  ASSERT_EQ(f.fake.driver().memset_d8(p, 0x5a, 5 * kMiB + 7), res::ok);
  EXPECT_EQ(f.backend->reserved(0), 0u) << "holds no device memory";
  ASSERT_EQ(f.backend->deallocate(p, b, FreeRequest{}), res::ok);
  EXPECT_EQ(f.fake.host_used(), 0u);
  EXPECT_EQ(f.fake.live_handles(), 0u);
  EXPECT_EQ(f.fake.reservations(), 0u);
}

TEST(HostBackend, UsesNodeZeroWithoutANumaId) {
  // cuMemCreate asks for HOST_NUMA id 0 where the host has no NUMA; plain HOST memory could not
  // be exported (IPC).
  FakeConfig c = Fixture::strict();
  c.attributes[kNumaAttr] = -1;
  Fixture f(c);
  DevPtr p = 0;
  Block b;
  ASSERT_EQ(f.alloc(kMiB, &p, &b), res::ok);
  EXPECT_EQ(host_info(*f.backend, 0).host_location.type, Location::Type::host_numa);
  EXPECT_EQ(host_info(*f.backend, 0).host_location.id, 0);
  ASSERT_EQ(f.backend->deallocate(p, b, FreeRequest{}), res::ok);
}

TEST(HostBackend, AnswersPointerQueriesWithTheBlock) {
  Fixture f;
  DevPtr p = 0, q = 0;
  Block bp, bq;
  ASSERT_EQ(f.alloc(3 * kMiB, &p, &bp), res::ok);
  ASSERT_EQ(f.alloc(1000, &q, &bq), res::ok);
  DevPtr base = 0;
  std::size_t size = 0;
  ASSERT_TRUE(f.backend->find(p + 3 * kMiB - 1, &base, &size));
  EXPECT_EQ(base, p);
  EXPECT_EQ(size, 3 * kMiB);
  ASSERT_TRUE(f.backend->find(q + 999, &base, &size));
  EXPECT_EQ(base, q);
  EXPECT_EQ(size, 1000u);
  EXPECT_FALSE(f.backend->find(q + 1000, &base, &size)) << "past the block, in its rounding";
  ASSERT_EQ(f.backend->deallocate(p, bp, FreeRequest{}), res::ok);
  EXPECT_FALSE(f.backend->find(p, &base, &size));
  ASSERT_EQ(f.backend->deallocate(q, bq, FreeRequest{}), res::ok);
}

TEST(HostBackend, PeersGetAccessToLiveAndLaterAllocations) {
  FakeConfig c = Fixture::strict();
  c.devices = 2;
  Fixture f(c);
  DevPtr p = 0, q = 0;
  Block bp, bq;
  ASSERT_EQ(f.alloc(2 * kMiB, &p, &bp), res::ok);
  EXPECT_FALSE(f.fake.has_access(p, 1, true));
  ASSERT_EQ(f.backend->enable_peer_access(1, 0), res::ok);
  EXPECT_TRUE(f.fake.has_access(p, 1, true));
  ASSERT_EQ(f.alloc(2 * kMiB, &q, &bq), res::ok);
  EXPECT_TRUE(f.fake.has_access(q, 1, true));
  ASSERT_EQ(f.backend->deallocate(p, bp, FreeRequest{}), res::ok);
  ASSERT_EQ(f.backend->deallocate(q, bq, FreeRequest{}), res::ok);
}

TEST(HostBackend, FreesWaitForTheDeviceAsCudaFreeDoes) {
  Fixture f;
  DevPtr p = 0, q = 0, r = 0;
  Block bp, bq, br;
  ASSERT_EQ(f.alloc(kMiB, &p, &bp, FreeSync::device), res::ok);
  ASSERT_EQ(f.alloc(kMiB, &q, &bq, FreeSync::none), res::ok);
  ASSERT_EQ(f.alloc(kMiB, &r, &br, FreeSync::none), res::ok);
  f.fake.reset_calls();
  ASSERT_EQ(f.backend->deallocate(p, bp, FreeRequest{}), res::ok);
  EXPECT_EQ(f.fake.calls(FakeOp::ctx_synchronize), 1u);
  ASSERT_EQ(f.backend->deallocate(q, bq, FreeRequest{}), res::ok);
  EXPECT_EQ(f.fake.calls(FakeOp::ctx_synchronize), 1u) << "none: the program synchronizes";
  Stream s = nullptr;
  ASSERT_EQ(f.fake.driver().stream_create(&s, kStreamNonBlocking), res::ok);
  ASSERT_EQ(f.backend->deallocate(r, br, FreeRequest{s, true}), res::ok);
  EXPECT_EQ(f.fake.calls(FakeOp::stream_synchronize), 1u) << "async: the stream first";
  f.fake.driver().stream_destroy(s);
}

TEST(HostBackend, FailuresMidwayLeaveNothingBehind) {
  for (FakeOp op :
       {FakeOp::mem_create, FakeOp::mem_map, FakeOp::mem_set_access, FakeOp::mem_address_reserve}) {
    Fixture f;
    f.fake.fail_next(op, res::out_of_memory);
    DevPtr p = 0;
    Block b;
    EXPECT_EQ(f.alloc(4 * kMiB, &p, &b), res::out_of_memory) << fake::op_name(op);
    EXPECT_EQ(f.fake.host_used(), 0u) << fake::op_name(op);
    EXPECT_EQ(f.fake.live_handles(), 0u) << fake::op_name(op);
    EXPECT_EQ(f.fake.reservations(), 0u) << fake::op_name(op);
    EXPECT_EQ(f.backend->stats().device(0).failures(), 1u);
    ASSERT_EQ(f.alloc(4 * kMiB, &p, &b), res::ok) << "and the next request works";
    ASSERT_EQ(f.backend->deallocate(p, b, FreeRequest{}), res::ok);
  }
}

TEST(HostBackend, HostCapacityIsTheLimit) {
  FakeConfig c = Fixture::strict();
  c.host_capacity = 16 * kMiB;
  Fixture f(c);
  DevPtr p = 0, q = 0;
  Block bp, bq;
  ASSERT_EQ(f.alloc(10 * kMiB, &p, &bp), res::ok);
  EXPECT_EQ(f.alloc(10 * kMiB, &q, &bq), res::out_of_memory);
  ASSERT_EQ(f.backend->deallocate(p, bp, FreeRequest{}), res::ok);
  ASSERT_EQ(f.alloc(10 * kMiB, &q, &bq), res::ok);
  ASSERT_EQ(f.backend->deallocate(q, bq, FreeRequest{}), res::ok);
}

// Through the core: a rule sends big requests to the host; the summary and mem_get_info see no
// device memory for them.
TEST(HostBackend, ARuleServesRequestsFromTheHost) {
  FakeDriver fake;
  Core core(
      fake.driver(),
      testing::parsed(
          "[defaults]\nbackend = \"native\"\n[[rules]]\nsize = \">= 8MiB\"\nbackend = \"host\"\n"));
  const DevPtr big = testing::must_alloc(core, 8 * kMiB);
  const DevPtr small = testing::must_alloc(core, kMiB);
  EXPECT_EQ(fake.host_used(), 8 * kMiB);
  EXPECT_EQ(fake.used(0), kMiB);
  std::size_t free = 0, total = 0;
  ASSERT_EQ(core.mem_get_info(&free, &total), res::ok);
  EXPECT_EQ(total - free, kMiB);
  ASSERT_EQ(core.free(big, FreeRequest{}), res::ok);
  ASSERT_EQ(core.free(small, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.host_used(), 0u);
}

}  // namespace
}  // namespace allocshim
