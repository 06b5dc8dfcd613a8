// Tests of the fake driver's streams, events and pools: the free-safety and pool conformance tests
// of the backends rely on this model of stream order.
#include <unistd.h>

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "fake_driver.h"
#include "fake_test_util.h"

namespace allocshim::fake {
namespace {

using namespace allocshim::fake::testing;

TEST_F(FakeDriverTest, EventsCompleteUnlessTheirStreamIsHeld) {
  Stream s = nullptr;
  Event e = nullptr;
  ASSERT_EQ(d.stream_create(&s, 0), res::ok);
  ASSERT_EQ(d.event_create(&e, kEventDisableTiming), res::ok);
  EXPECT_EQ(d.event_query(e), res::ok);  // never recorded
  ASSERT_EQ(d.event_record(e, s), res::ok);
  EXPECT_EQ(d.event_query(e), res::ok);

  fake.hold_stream(s);
  ASSERT_EQ(d.event_record(e, s), res::ok);
  EXPECT_EQ(d.event_query(e), res::not_ready);
  fake.release_stream(s);
  EXPECT_EQ(d.event_query(e), res::ok);

  fake.hold_stream(s);
  ASSERT_EQ(d.event_record(e, s), res::ok);
  EXPECT_EQ(fake.blocking_waits(), 0u);
  ASSERT_EQ(d.event_synchronize(e), res::ok);  // completes the held work instead of blocking
  EXPECT_EQ(fake.blocking_waits(), 1u);
  EXPECT_EQ(d.event_query(e), res::ok);
  // Still held: new work is pending again until a stream sync.
  ASSERT_EQ(d.event_record(e, s), res::ok);
  EXPECT_EQ(d.event_query(e), res::not_ready);
  ASSERT_EQ(d.stream_synchronize(s), res::ok);
  EXPECT_EQ(d.event_query(e), res::ok);
  EXPECT_EQ(fake.calls(FakeOp::stream_synchronize), 1u);

  ASSERT_EQ(d.event_destroy(e), res::ok);
  ASSERT_EQ(d.stream_destroy(s), res::ok);
  EXPECT_EQ(d.stream_destroy(s), res::invalid_handle);
  EXPECT_EQ(fake.live_streams(), 0u);
  EXPECT_EQ(fake.live_events(), 0u);
}

TEST_F(FakeDriverTest, LegacyStreamEventsWaitForBlockingStreamsOnly) {
  Stream blocking = nullptr, non_blocking = nullptr;
  Event e = nullptr;
  ASSERT_EQ(d.stream_create(&blocking, 0), res::ok);
  ASSERT_EQ(d.stream_create(&non_blocking, kStreamNonBlocking), res::ok);
  ASSERT_EQ(d.event_create(&e, 0), res::ok);
  Event dummy = nullptr;
  ASSERT_EQ(d.event_create(&dummy, 0), res::ok);

  fake.hold_stream(non_blocking);
  ASSERT_EQ(d.event_record(dummy, non_blocking), res::ok);  // pending work on it
  ASSERT_EQ(d.event_record(e, kStreamLegacy), res::ok);
  EXPECT_EQ(d.event_query(e), res::ok);  // the legacy stream does not order non-blocking work
  fake.release_stream(non_blocking);

  fake.hold_stream(blocking);
  ASSERT_EQ(d.event_record(dummy, blocking), res::ok);
  ASSERT_EQ(d.event_record(e, kStreamLegacy), res::ok);
  EXPECT_EQ(d.event_query(e), res::not_ready);  // ...but it does order blocking streams' work
  fake.release_stream(blocking);
  EXPECT_EQ(d.event_query(e), res::ok);

  fake.hold_stream(kStreamLegacy);
  ASSERT_EQ(d.event_record(e, kStreamLegacy), res::ok);
  EXPECT_EQ(d.event_query(e), res::not_ready);
  ASSERT_EQ(d.ctx_synchronize(), res::ok);
  EXPECT_EQ(d.event_query(e), res::ok);
  fake.release_stream(kStreamLegacy);
}

TEST_F(FakeDriverTest, MemFreeSynchronizesTheDevice) {
  Stream s = nullptr;
  Event e = nullptr;
  DevPtr p = 0;
  ASSERT_EQ(d.stream_create(&s, kStreamNonBlocking), res::ok);
  ASSERT_EQ(d.event_create(&e, 0), res::ok);
  ASSERT_EQ(d.mem_alloc(&p, 256), res::ok);
  fake.hold_stream(s);
  ASSERT_EQ(d.event_record(e, s), res::ok);
  ASSERT_EQ(d.mem_free(p), res::ok);
  EXPECT_EQ(d.event_query(e), res::ok);
  EXPECT_EQ(fake.blocking_waits(), 1u);
}

TEST_F(FakeDriverTest, AsyncAllocationsComeFromTheDefaultPool) {
  Pool pool = fake.default_pool(0);
  DevPtr p = 0, q = 0;
  ASSERT_EQ(d.mem_alloc_async(&p, 1000, kStreamLegacy), res::ok);
  fill_and_check(p, 1000, 2);
  EXPECT_EQ(fake.pool_reserved(pool), kGran);
  EXPECT_EQ(fake.used(0), kGran);
  std::uint64_t reserved = 0;
  ASSERT_EQ(d.mem_pool_reserved(pool, &reserved), res::ok);
  EXPECT_EQ(reserved, kGran);
  std::uint64_t used = 0;
  ASSERT_EQ(d.mem_pool_used(pool, &used), res::ok);
  EXPECT_EQ(used, kGran);  // blocks are whole granules
  ASSERT_EQ(d.mem_free_async(p, kStreamLegacy), res::ok);
  EXPECT_EQ(fake.pool_reserved(pool), kGran);  // freed but cached
  EXPECT_EQ(fake.pool_used(pool), 0u);
  ASSERT_EQ(d.mem_pool_used(pool, &used), res::ok);
  EXPECT_EQ(used, 0u);
  ASSERT_EQ(d.mem_alloc_async(&q, 2000, kStreamLegacy), res::ok);
  EXPECT_EQ(q, p);  // reused
  ASSERT_EQ(d.mem_free_async(q, kStreamLegacy), res::ok);
  // Release threshold 0 (the default): a synchronization gives the cache back.
  ASSERT_EQ(d.stream_synchronize(kStreamLegacy), res::ok);
  EXPECT_EQ(fake.pool_reserved(pool), 0u);
  EXPECT_EQ(fake.used(0), 0u);
}

TEST_F(FakeDriverTest, PoolReusesAcrossStreamsOnlyAfterTheFreeCompleted) {
  Pool pool = nullptr;
  PoolSpec spec;
  ASSERT_EQ(d.mem_pool_create(&pool, spec), res::ok);
  ASSERT_EQ(d.mem_pool_set_release_threshold(pool, ~0ull), res::ok);
  Stream a = nullptr, b = nullptr;
  ASSERT_EQ(d.stream_create(&a, kStreamNonBlocking), res::ok);
  ASSERT_EQ(d.stream_create(&b, kStreamNonBlocking), res::ok);
  DevPtr p = 0, q = 0, r = 0;
  ASSERT_EQ(d.mem_alloc_from_pool_async(&p, kGran, pool, a), res::ok);
  fake.hold_stream(a);
  ASSERT_EQ(d.mem_free_async(p, a), res::ok);
  ASSERT_EQ(d.mem_alloc_from_pool_async(&q, kGran, pool, b), res::ok);
  EXPECT_NE(q, p);  // the free has not happened yet on stream a
  EXPECT_EQ(fake.pool_reserved(pool), 2 * kGran);
  ASSERT_EQ(d.mem_alloc_from_pool_async(&r, kGran, pool, a), res::ok);
  EXPECT_EQ(r, p);  // same stream: stream order makes it safe
  ASSERT_EQ(d.mem_free_async(r, a), res::ok);
  fake.release_stream(a);
  ASSERT_EQ(d.mem_alloc_from_pool_async(&r, kGran, pool, b), res::ok);
  EXPECT_EQ(r, p);

  ASSERT_EQ(d.mem_free_async(q, b), res::ok);
  ASSERT_EQ(d.mem_free_async(r, b), res::ok);
  ASSERT_EQ(d.ctx_synchronize(), res::ok);
  EXPECT_EQ(fake.pool_reserved(pool), 2 * kGran);  // threshold max: kept
  ASSERT_EQ(d.mem_pool_trim_to(pool, kGran), res::ok);
  EXPECT_EQ(fake.pool_reserved(pool), kGran);
  ASSERT_EQ(d.mem_pool_trim_to(pool, 0), res::ok);
  EXPECT_EQ(fake.used(0), 0u);
  ASSERT_EQ(d.mem_pool_destroy(pool), res::ok);
  EXPECT_EQ(d.mem_pool_destroy(fake.default_pool(0)), res::invalid_value);
}

TEST_F(FakeDriverTest, PoolGivesItsCacheBackBeforeRunningOutOfMemory) {
  Pool pool = nullptr;
  ASSERT_EQ(d.mem_pool_create(&pool, PoolSpec{}), res::ok);
  ASSERT_EQ(d.mem_pool_set_release_threshold(pool, ~0ull), res::ok);
  std::vector<DevPtr> ps(32);
  for (auto& p : ps)
    ASSERT_EQ(d.mem_alloc_from_pool_async(&p, kGran, pool, kStreamLegacy), res::ok);
  DevPtr extra = 0;
  EXPECT_EQ(d.mem_alloc_from_pool_async(&extra, kGran, pool, kStreamLegacy), res::out_of_memory);
  for (auto p : ps) ASSERT_EQ(d.mem_free_async(p, kStreamLegacy), res::ok);
  // Cached blocks of another size are released to make room (all of them: the fake trims fully).
  EXPECT_EQ(d.mem_alloc_from_pool_async(&extra, 4 * kGran, pool, kStreamLegacy), res::ok);
  EXPECT_EQ(fake.used(0), 4 * kGran);
  EXPECT_EQ(fake.pool_reserved(pool), 4 * kGran);
}

TEST_F(FakeDriverTest, PoolAccessAndMaxSize) {
  Pool pool = nullptr;
  PoolSpec spec;
  spec.max_size = 2 * kGran;
  ASSERT_EQ(d.mem_pool_create(&pool, spec), res::ok);
  EXPECT_TRUE(fake.pool_access(pool, 0));
  EXPECT_FALSE(fake.pool_access(pool, 1));
  ASSERT_EQ(d.mem_pool_set_access(pool, 1, true), res::ok);
  EXPECT_TRUE(fake.pool_access(pool, 1));
  DevPtr p = 0;
  ASSERT_EQ(d.mem_alloc_from_pool_async(&p, 2 * kGran, pool, kStreamLegacy), res::ok);
  EXPECT_EQ(d.mem_alloc_from_pool_async(&p, 1, pool, kStreamLegacy), res::out_of_memory);
}

TEST_F(FakeDriverTest, PoolExportImportRoundTrips) {
  Pool pool = nullptr, plain = nullptr, imported = nullptr;
  PoolSpec spec;
  spec.posix_fd = true;
  ASSERT_EQ(d.mem_pool_create(&pool, spec), res::ok);
  ASSERT_EQ(d.mem_pool_create(&plain, PoolSpec{}), res::ok);
  int fd = -1;
  EXPECT_EQ(d.mem_pool_export_to_fd(&fd, plain), res::invalid_value);
  ASSERT_EQ(d.mem_pool_export_to_fd(&fd, pool), res::ok);
  ASSERT_EQ(d.mem_pool_import_from_fd(&imported, fd), res::ok);
  close(fd);

  DevPtr p = 0, q = 0;
  ASSERT_EQ(d.mem_alloc_from_pool_async(&p, 3 * kGran, pool, kStreamLegacy), res::ok);
  fill_and_check(p, 3 * kGran, 4);
  unsigned char data[kIpcHandleBytes];
  DevPtr unshared_p = 0;
  Pool unshared = nullptr;
  ASSERT_EQ(d.mem_pool_create(&unshared, spec), res::ok);
  ASSERT_EQ(d.mem_alloc_from_pool_async(&unshared_p, kGran, unshared, kStreamLegacy), res::ok);
  EXPECT_EQ(d.mem_pool_export_pointer(data, unshared_p), res::invalid_value)
      << "a pointer is exportable only from a pool already exported (as on the H100)";
  ASSERT_EQ(d.mem_free_async(unshared_p, kStreamLegacy), res::ok);
  ASSERT_EQ(d.mem_pool_destroy(unshared), res::ok);
  ASSERT_EQ(d.mem_pool_export_pointer(data, p), res::ok);
  ASSERT_EQ(d.mem_pool_import_pointer(&q, imported, data), res::ok);
  EXPECT_NE(q, p);
  EXPECT_EQ(std::memcmp(reinterpret_cast<void*>(p), reinterpret_cast<void*>(q), 3 * kGran), 0);
  reinterpret_cast<unsigned char*>(q)[17] = 0xee;
  EXPECT_EQ(reinterpret_cast<unsigned char*>(p)[17], 0xee);
  DevPtr base = 0;
  std::size_t size = 0;
  ASSERT_EQ(d.mem_get_address_range(&base, &size, q + 5), res::ok);
  EXPECT_EQ(base, q);
  EXPECT_EQ(size, 3 * kGran);
  ASSERT_EQ(d.mem_free_async(q, kStreamLegacy), res::ok);
  ASSERT_EQ(d.mem_free_async(p, kStreamLegacy), res::ok);
}

TEST_F(FakeDriverTest, PoolReusePolicyIsRecorded) {
  Pool pool = nullptr;
  ASSERT_EQ(d.mem_pool_create(&pool, PoolSpec{}), res::ok);
  EXPECT_TRUE(fake.pool_reuse(pool, PoolReuse::allow_internal_dependencies));
  ASSERT_EQ(d.mem_pool_set_reuse(pool, PoolReuse::allow_internal_dependencies, false), res::ok);
  EXPECT_FALSE(fake.pool_reuse(pool, PoolReuse::allow_internal_dependencies));
  EXPECT_TRUE(fake.pool_reuse(pool, PoolReuse::follow_event_dependencies));
}

}  // namespace
}  // namespace allocshim::fake
