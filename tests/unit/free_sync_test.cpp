// free_sync on the fake driver: what each mode waits for before a freed block comes back, for both
// pooling backends. Held streams stand for kernels still running; a guarantee broken here is a
// reuse race on a GPU.
#include "backends/free_sync.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backends/async_pool.h"
#include "backends/vmm.h"
#include "core/backend.h"
#include "core/core.h"
#include "core/streams.h"
#include "fake_driver.h"
#include "policy/policy.h"

namespace allocshim {
namespace {

using fake::FakeDriver;
using fake::FakeOp;
constexpr std::size_t kMiB = fake::kMiB;

fake::FakeConfig two_devices() {
  fake::FakeConfig c;
  c.devices = 2;
  c.capacity = 1 * fake::kGiB;
  return c;
}

// ---- The pending list on its own ---------------------------------------------------------------

class DeferredFreesTest : public ::testing::Test {
 protected:
  FakeDriver fake{two_devices()};
  const Driver& d = fake.driver();
  StreamTracker streams;
};

TEST_F(DeferredFreesTest, ReleasesOldestFirstWithinItsBudgetAndStopsAtPendingWork) {
  DeferredFrees q(d, &streams, 0);
  for (int i = 0; i < 10; ++i) ASSERT_EQ(q.defer_barrier({DevPtr(0x1000 + i), 100, 0}), res::ok);
  std::vector<DevPtr> out;
  auto collect = [&](const PendingFree& f) { out.push_back(f.ptr); };
  EXPECT_EQ(q.poll(3, collect), 3u);
  EXPECT_EQ(out, (std::vector<DevPtr>{0x1000, 0x1001, 0x1002}));
  EXPECT_EQ(q.pending_bytes(), 700u);

  fake.hold_stream(kStreamLegacy);
  ASSERT_EQ(q.defer_barrier({0x2000, 1, 0}), res::ok);
  EXPECT_EQ(q.poll(100, collect), 7u) << "entries recorded before the held work are released";
  EXPECT_EQ(q.poll(100, collect), 0u);
  EXPECT_EQ(q.pending(), 1u);
  EXPECT_EQ(fake.blocking_waits(), 0u) << "polling never waits";
  EXPECT_EQ(q.drain(collect), 1u);
  EXPECT_EQ(out.back(), 0x2000u);
  EXPECT_EQ(fake.blocking_waits(), 1u) << "draining waits for the held work";
}

TEST_F(DeferredFreesTest, RecordsOnLegacyAndEveryLiveNonBlockingStreamOfTheDevice) {
  Stream nb = nullptr, other = nullptr;
  ASSERT_EQ(d.stream_create(&nb, kStreamNonBlocking), res::ok);
  streams.add(nb, kStreamNonBlocking, 0);
  fake.set_current_device(1);
  ASSERT_EQ(d.stream_create(&other, kStreamNonBlocking), res::ok);
  streams.add(other, kStreamNonBlocking, 1);
  fake.set_current_device(0);
  DeferredFrees q(d, &streams, 0);
  fake.reset_calls();
  ASSERT_EQ(q.defer_barrier({0x1000, 1, 0}), res::ok);
  EXPECT_EQ(fake.calls(FakeOp::event_record), 2u) << "legacy + the device's one non-blocking stream";

  fake.hold_stream(nb);
  ASSERT_EQ(q.defer_barrier({0x2000, 1, 0}), res::ok);
  int released = 0;
  auto count = [&](const PendingFree&) { ++released; };
  q.poll(10, count);
  EXPECT_EQ(released, 1) << "the second free waits for the non-blocking stream";
  fake.release_stream(nb);
  q.poll(10, count);
  EXPECT_EQ(released, 2);
}

TEST_F(DeferredFreesTest, EventsArePooledNotCreatedPerFree) {
  DeferredFrees q(d, &streams, 0);
  fake.reset_calls();
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(q.defer_barrier({DevPtr(0x1000 + i), 1, 0}), res::ok);
    q.poll(kPollBudget, [](const PendingFree&) {});
  }
  EXPECT_LE(fake.calls(FakeOp::event_create), 1u);
  EXPECT_EQ(q.events_created(), fake.calls(FakeOp::event_create));
}

TEST_F(DeferredFreesTest, AFailedRecordQueuesNothingAndKeepsItsEvents) {
  Stream nb = nullptr;
  ASSERT_EQ(d.stream_create(&nb, kStreamNonBlocking), res::ok);
  streams.add(nb, kStreamNonBlocking, 0);
  DeferredFrees q(d, &streams, 0);
  ASSERT_EQ(q.defer_barrier({0x1000, 1, 0}), res::ok);  // two events exist now, both in use
  fake.hold_stream(kStreamLegacy);
  ASSERT_EQ(q.defer_barrier({0x2000, 1, 0}), res::ok);  // four
  d.stream_destroy(nb);  // still in the tracker: the next record on it fails
  EXPECT_EQ(q.defer_barrier({0x3000, 1, 0}), res::invalid_handle);
  EXPECT_EQ(q.pending(), 2u);
  EXPECT_EQ(q.pending_bytes(), 2u);
  fake.release_stream(kStreamLegacy);
  std::vector<DevPtr> out;
  q.poll(10, [&](const PendingFree& f) { out.push_back(f.ptr); });
  EXPECT_EQ(out, (std::vector<DevPtr>{0x1000, 0x2000})) << "the failed entry's event was unwound";
  // Five recorded events and the one whose record failed, which went back to the pool.
  EXPECT_EQ(q.events_created(), 6u);
  fake.reset_calls();
  ASSERT_EQ(q.defer_barrier({0x4000, 1, 0}), res::invalid_handle);
  EXPECT_EQ(fake.calls(FakeOp::event_create), 0u) << "pooled events are reused after a failure";
}

// ---- Both backends, every mode -----------------------------------------------------------------

struct Kind {
  const char* name;
  BackendKind kind;
};
void PrintTo(const Kind& k, std::ostream* os) { *os << k.name; }

class FreeSyncTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    policy::BackendSpec spec;
    spec.name = GetParam().name;
    spec.kind = GetParam().kind;
    std::string why;
    backend = make_backend(spec, d, streams, why);
    ASSERT_NE(backend, nullptr) << why;
  }
  void TearDown() override {
    fake.release_stream(kStreamLegacy);
    backend.reset();
  }

  DevPtr alloc(std::size_t size, FreeSync sync, int device = 0, Api api = Api::alloc,
               Stream stream = kStreamLegacy) {
    AllocRequest req;
    req.size = size;
    req.device = device;
    req.api = api;
    req.stream = stream;
    DevPtr p = 0;
    std::uint64_t cookie = 0;
    EXPECT_EQ(backend->allocate(req, sync, &p, &cookie), res::ok);
    blocks[p] = Block{size, 0, static_cast<std::int16_t>(device), api, sync, cookie};
    return p;
  }
  // Stands for a kernel on `s`: work the stream holds back while the test holds the stream.
  void launch(Stream s) {
    if (work == nullptr) {
      ASSERT_EQ(d.event_create(&work, 0), res::ok);
    }
    ASSERT_EQ(d.event_record(work, s), res::ok);
  }
  void free(DevPtr p, FreeRequest req = {}) {
    EXPECT_EQ(backend->deallocate(p, blocks.at(p), req), res::ok);
    blocks.erase(p);
  }

  FakeDriver fake{two_devices()};
  const Driver& d = fake.driver();
  StreamTracker streams;
  std::unique_ptr<Backend> backend;
  std::map<DevPtr, Block> blocks;
  Event work = nullptr;
};

TEST_P(FreeSyncTest, NoneReusesAtOnceEvenWithWorkPending) {
  const DevPtr a = alloc(1 * kMiB, FreeSync::none);
  fake.hold_stream(kStreamLegacy);
  launch(kStreamLegacy);
  fake.reset_calls();
  free(a);
  EXPECT_EQ(alloc(1 * kMiB, FreeSync::none), a);
  EXPECT_EQ(fake.blocking_waits(), 0u);
  EXPECT_EQ(fake.calls(FakeOp::ctx_synchronize), 0u);
}

TEST_P(FreeSyncTest, DeviceSynchronizesAtFreeThenReuses) {
  const DevPtr a = alloc(1 * kMiB, FreeSync::device);
  fake.hold_stream(kStreamLegacy);
  launch(kStreamLegacy);
  fake.reset_calls();
  free(a);
  EXPECT_EQ(fake.calls(FakeOp::ctx_synchronize), 1u);
  EXPECT_EQ(fake.blocking_waits(), 1u) << "the free waited for the running work, as cudaFree does";
  EXPECT_EQ(alloc(1 * kMiB, FreeSync::device), a);
}

TEST_P(FreeSyncTest, BarrierReusesOnlyAfterTheLegacyStreamPassedTheFree) {
  const DevPtr a = alloc(1 * kMiB, FreeSync::barrier);
  fake.hold_stream(kStreamLegacy);
  launch(kStreamLegacy);
  free(a);
  const DevPtr b = alloc(1 * kMiB, FreeSync::barrier);
  EXPECT_NE(b, a) << "reused while kernels issued before the free may still run";
  EXPECT_EQ(fake.blocking_waits(), 0u) << "neither the free nor the allocation waited";
  EXPECT_EQ(fake.calls(FakeOp::event_synchronize), 0u);
  fake.release_stream(kStreamLegacy);
  EXPECT_EQ(alloc(1 * kMiB, FreeSync::barrier), a) << "reused once the work completed";
}

TEST_P(FreeSyncTest, BarrierCoversBlockingStreamsThroughTheLegacyStream) {
  Stream blocking = nullptr;
  ASSERT_EQ(d.stream_create(&blocking, 0), res::ok);
  const DevPtr a = alloc(1 * kMiB, FreeSync::barrier);
  fake.hold_stream(blocking);
  launch(blocking);
  free(a);
  EXPECT_NE(alloc(1 * kMiB, FreeSync::barrier), a);
  fake.release_stream(blocking);
  EXPECT_EQ(alloc(1 * kMiB, FreeSync::barrier), a);
}

TEST_P(FreeSyncTest, BarrierWaitsForTrackedNonBlockingStreams) {
  Stream nb = nullptr;
  ASSERT_EQ(d.stream_create(&nb, kStreamNonBlocking), res::ok);
  streams.add(nb, kStreamNonBlocking, 0);
  const DevPtr a = alloc(1 * kMiB, FreeSync::barrier);
  fake.hold_stream(nb);
  launch(nb);
  free(a);
  EXPECT_NE(alloc(1 * kMiB, FreeSync::barrier), a);
  fake.release_stream(nb);
  EXPECT_EQ(alloc(1 * kMiB, FreeSync::barrier), a);
}

TEST_P(FreeSyncTest, BarrierFallsBackToSynchronizingWhenARecordFails) {
  Stream nb = nullptr;
  ASSERT_EQ(d.stream_create(&nb, kStreamNonBlocking), res::ok);
  streams.add(nb, kStreamNonBlocking, 0);
  const DevPtr a = alloc(1 * kMiB, FreeSync::barrier);
  d.stream_destroy(nb);  // the tracker has not heard of it yet
  fake.hold_stream(kStreamLegacy);
  fake.reset_calls();
  free(a);
  EXPECT_EQ(fake.calls(FakeOp::ctx_synchronize), 1u);
  EXPECT_EQ(alloc(1 * kMiB, FreeSync::barrier), a) << "synchronized, so reusable at once";
}

TEST_P(FreeSyncTest, BarrierHotPathNeverWaits) {
  fake.hold_stream(kStreamLegacy);
  for (int i = 0; i < 50; ++i) free(alloc(64 << 10, FreeSync::barrier));
  EXPECT_EQ(fake.blocking_waits(), 0u);
  EXPECT_EQ(fake.calls(FakeOp::event_synchronize), 0u);
  EXPECT_EQ(fake.calls(FakeOp::ctx_synchronize), 0u);
}

TEST_P(FreeSyncTest, BarrierWaitsRatherThanFailsWhenMemoryIsShort) {
  fake.set_capacity(0, 32 * kMiB);
  std::vector<DevPtr> v;
  for (int i = 0; i < 4; ++i) v.push_back(alloc(8 * kMiB, FreeSync::barrier));
  fake.hold_stream(kStreamLegacy);
  for (DevPtr p : v) free(p);
  EXPECT_EQ(fake.blocking_waits(), 0u);
  const DevPtr p = alloc(8 * kMiB, FreeSync::barrier);
  EXPECT_NE(p, 0u);
  EXPECT_GE(fake.blocking_waits(), 1u) << "the pending frees were waited for, then reused";
}

TEST_P(FreeSyncTest, StreamOrderedFreeWaitsForItsStream) {
  Stream s = nullptr;
  ASSERT_EQ(d.stream_create(&s, kStreamNonBlocking), res::ok);  // not tracked: only the free's
  const DevPtr a = alloc(1 * kMiB, FreeSync::none, 0, Api::async, s);
  fake.hold_stream(s);
  launch(s);
  FreeRequest fr;
  fr.async = true;
  fr.stream = s;
  free(a, fr);
  EXPECT_NE(alloc(1 * kMiB, FreeSync::none), a) << "reused before its stream reached the free";
  fake.release_stream(s);
  EXPECT_EQ(alloc(1 * kMiB, FreeSync::none), a);
}

TEST_P(FreeSyncTest, FreesFromAnotherDeviceWaitOnTheBlocksDevice) {
  fake.set_current_device(1);
  const DevPtr a = alloc(1 * kMiB, FreeSync::barrier, 1);
  fake.hold_stream(kStreamLegacy);  // device 1's
  launch(kStreamLegacy);
  fake.set_current_device(0);
  free(a);  // from a thread whose current device is 0
  fake.set_current_device(1);
  EXPECT_NE(alloc(1 * kMiB, FreeSync::barrier, 1), a) << "the barrier went to the wrong device";
  fake.release_stream(kStreamLegacy);
  EXPECT_EQ(alloc(1 * kMiB, FreeSync::barrier, 1), a);
  fake.set_current_device(0);
}

INSTANTIATE_TEST_SUITE_P(Backends, FreeSyncTest,
                         ::testing::Values(Kind{"async_pool", BackendKind::async_pool},
                                           Kind{"vmm", BackendKind::vmm}),
                         [](const ::testing::TestParamInfo<Kind>& i) { return i.param.name; });

}  // namespace
}  // namespace allocshim
