// free_sync on the fake driver: what each mode waits for before a freed block comes back, for both
// pooling backends. Held streams stand for kernels still running; a guarantee broken here is a
// reuse race on a GPU.
#include "backends/free_sync.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backends/async_pool.h"
#include "backends/vmm.h"
#include "core/backend.h"
#include "base/clock.h"
#include "core/core.h"
#include "base/streams.h"
#include "core_fixture.h"
#include "fake_driver.h"
#include "policy/policy.h"

namespace allocshim {
namespace {

fake::FakeConfig two_devices() {
  fake::FakeConfig c;
  c.devices = 2;
  c.capacity = 1 * fake::kGiB;
  return c;
}

// A non-blocking stream of the current device, created and tracked as the stream hooks do.
Stream tracked_stream(const Driver& d, StreamTracker& streams, int device = 0) {
  Stream s = nullptr;
  EXPECT_EQ(d.stream_create(&s, kStreamNonBlocking), res::ok);
  streams.add(s, kStreamNonBlocking, device);
  return s;
}

// ---- The pending list on its own ---------------------------------------------------------------

class DeferredFreesTest : public ::testing::Test {
 protected:
  FakeDriver fake{two_devices()};
  const Driver& d = fake.driver();
  StreamTracker streams;
  std::vector<DevPtr> out;
  std::function<void(const PendingFree&)> collect = [this](const PendingFree& f) {
    out.push_back(f.ptr);
  };
  // Block 0x1000 freed into `q` and its epoch closed while the legacy stream still has work (a
  // kernel that may use the block).
  void close_one_behind_work(DeferredFrees& q) {
    fake.hold_stream(kStreamLegacy);
    q.defer_barrier({0x1000, 1, 0}, clock::ticks());
    q.close(collect);
  }
};

TEST_F(DeferredFreesTest, BarrierFreesJoinTheOpenEpochWithNoDriverCall) {
  DeferredFrees q(d, &streams, 0);
  fake.reset_calls();
  for (int i = 0; i < 100; ++i) q.defer_barrier({DevPtr(0x1000 + i), 100, 0}, clock::ticks());
  EXPECT_EQ(fake.calls(FakeOp::event_record), 0u);
  EXPECT_EQ(fake.calls(FakeOp::event_create), 0u);
  EXPECT_EQ(q.pending(), 100u);
  EXPECT_EQ(q.pending_bytes(), 10000u);
  EXPECT_EQ(q.poll(1000, collect), 0u) << "no events recorded yet, so nothing is known complete";
  q.close(collect);
  EXPECT_EQ(fake.calls(FakeOp::event_record), 1u) << "one event for the whole epoch";
  EXPECT_EQ(q.epochs(), 1u);
  EXPECT_TRUE(out.empty()) << "closing releases nothing by itself";
  EXPECT_EQ(q.poll(3, collect), 3u);
  EXPECT_EQ(out, (std::vector<DevPtr>{0x1000, 0x1001, 0x1002}))
      << "oldest first, within the budget";
  EXPECT_EQ(q.poll(1000, collect), 97u);
  EXPECT_TRUE(q.empty());
}

TEST_F(DeferredFreesTest, AnEpochIsReleasedOnlyAfterWorkIssuedBeforeItsCloseCompleted) {
  DeferredFrees q(d, &streams, 0);
  close_one_behind_work(q);
  q.defer_barrier({0x2000, 1, 0}, clock::ticks());  // the next epoch, still open
  EXPECT_EQ(q.poll(100, collect), 0u);
  EXPECT_EQ(fake.blocking_waits(), 0u) << "polling never waits";
  fake.release_stream(kStreamLegacy);
  EXPECT_EQ(q.poll(100, collect), 1u);
  EXPECT_EQ(out, (std::vector<DevPtr>{0x1000})) << "the open epoch has no events: it stays";
  fake.hold_stream(kStreamLegacy);
  EXPECT_EQ(q.drain(collect), 1u);
  EXPECT_EQ(out.back(), 0x2000u);
  EXPECT_EQ(fake.blocking_waits(), 1u) << "draining closes the epoch and waits for the held work";
}

TEST_F(DeferredFreesTest, AnEpochIsDueByAgeOrBytes) {
  DeferredFrees q(d, &streams, 0);
  const std::uint64_t t0 = clock::ticks();
  EXPECT_FALSE(q.due(t0)) << "nothing open";
  q.defer_barrier({0x1000, 1 * kMiB, 0}, t0);
  EXPECT_FALSE(q.due(t0));
  std::this_thread::sleep_for(std::chrono::nanoseconds(kEpochAgeNs + 200'000));
  EXPECT_TRUE(q.due(clock::ticks())) << "older than kEpochAgeNs";
  q.close(collect);
  const std::uint64_t t1 = clock::ticks();
  q.defer_barrier({0x2000, kEpochBytes - 1, 0}, t1);
  EXPECT_FALSE(q.due(t1));
  q.defer_barrier({0x3000, 1, 0}, t1);
  EXPECT_TRUE(q.due(t1)) << "holds kEpochBytes";
  fake.reset_calls();
  q.close_if_due(t1, collect);
  EXPECT_EQ(fake.calls(FakeOp::event_record), 1u);
  EXPECT_FALSE(q.due(clock::ticks()));
}

TEST_F(DeferredFreesTest, AtAShortageAnEpochIsClosedOnceItHoldsAFreePerEventOrIsDue) {
  SyncCounters counters;
  for (int i = 0; i < 3; ++i) tracked_stream(d, streams);  // a close records up to 4 events
  DeferredFrees q(d, &streams, 0, nullptr, &counters);
  const std::uint64_t t0 = clock::ticks();
  fake.reset_calls();
  const std::size_t enough = shortage_frees(3);
  ASSERT_EQ(enough, kFreesPerEvent * (kLegacyEventWeight + 3));
  for (std::size_t i = 1; i < enough; ++i) {
    q.defer_barrier({DevPtr(0x1000 + i), 1, 0}, t0);
    EXPECT_FALSE(q.close_at_shortage(t0, collect)) << i << " frees: grow rather than close";
  }
  EXPECT_EQ(fake.calls(FakeOp::event_record), 0u);
  EXPECT_EQ(counters.kept_open.load(), enough - 1);
  q.defer_barrier({0x2000, 1, 0}, t0);
  EXPECT_TRUE(q.close_at_shortage(t0, collect));
  EXPECT_EQ(q.epochs(), 1u);
  EXPECT_EQ(counters.shortage.load(), 1u);
  EXPECT_EQ(counters.events.load(), 1u) << "legacy; the three idle streams were only queried";
  EXPECT_EQ(counters.queries.load(), 3u);
  EXPECT_FALSE(q.close_at_shortage(t0, collect)) << "nothing open";
  q.defer_barrier({0x3000, 1, 0}, t0);
  std::this_thread::sleep_for(std::chrono::nanoseconds(kEpochAgeNs + 200'000));
  EXPECT_TRUE(q.close_at_shortage(clock::ticks(), collect)) << "one free, but due";
  EXPECT_TRUE(out.empty()) << "closing releases nothing by itself";
  EXPECT_EQ(q.poll(100, collect), enough + 1);
}

TEST_F(DeferredFreesTest, ClosingRecordsOnLegacyAndEveryLiveNonBlockingStreamOfTheDevice) {
  const Stream nb = tracked_stream(d, streams);
  fake.set_current_device(1);
  tracked_stream(d, streams, 1);  // another device's: no event of this device's epoch goes there
  fake.set_current_device(0);
  DeferredFrees q(d, &streams, 0);
  fake.reset_calls();
  q.defer_barrier({0x1000, 1, 0}, clock::ticks());
  q.close(collect);
  EXPECT_EQ(fake.calls(FakeOp::event_record), 1u)
      << "legacy; the idle non-blocking stream needs none";

  fake.hold_stream(nb);
  Event work = nullptr;
  ASSERT_EQ(d.event_create(&work, 0), res::ok);
  ASSERT_EQ(d.event_record(work, nb), res::ok);  // a kernel on nb
  q.defer_barrier({0x2000, 1, 0}, clock::ticks());
  fake.reset_calls();
  q.close(collect);
  EXPECT_EQ(fake.calls(FakeOp::event_record), 2u) << "legacy + the busy non-blocking stream";
  q.poll(10, collect);
  EXPECT_EQ(out, (std::vector<DevPtr>{0x1000}))
      << "the second epoch waits for the non-blocking stream";
  fake.release_stream(nb);
  q.poll(10, collect);
  EXPECT_EQ(out, (std::vector<DevPtr>{0x1000, 0x2000}));
  d.event_destroy(work);
}

TEST_F(DeferredFreesTest, AnEpochIsClosedInItsDevicesContextWhateverIsCurrent) {
  fake.set_current_device(1);
  Context ctx1 = nullptr;
  ASSERT_EQ(d.ctx_get_current(&ctx1), res::ok);
  fake.hold_stream(kStreamLegacy);  // device 1's: a kernel that may still use the block
  DeferredFrees q(d, &streams, 1, ctx1);
  q.defer_barrier({0x1000, 1, 0}, clock::ticks());
  fake.set_current_device(0);  // the thread that closes the epoch works on device 0
  q.close(collect);
  EXPECT_EQ(q.poll(10, collect), 0u) << "the event went to another device's legacy stream";
  Context now = nullptr;
  ASSERT_EQ(d.ctx_get_current(&now), res::ok);
  EXPECT_NE(now, ctx1) << "the closing thread's context is restored";
  fake.set_current_device(1);
  fake.release_stream(kStreamLegacy);
  EXPECT_EQ(q.poll(10, collect), 1u);
  fake.set_current_device(0);
}

TEST_F(DeferredFreesTest, EventsArePooledNotCreatedPerEpoch) {
  DeferredFrees q(d, &streams, 0);
  fake.reset_calls();
  for (int i = 0; i < 1000; ++i) {
    q.defer_barrier({DevPtr(0x1000 + i), 1, 0}, clock::ticks());
    q.close(collect);
    q.poll(kPollBudget, collect);
  }
  EXPECT_LE(fake.calls(FakeOp::event_create), 1u);
  EXPECT_EQ(q.events_created(), fake.calls(FakeOp::event_create));
  EXPECT_EQ(out.size(), 1000u);
}

TEST_F(DeferredFreesTest, AFailedRecordSynchronizesTheContextAndReleasesTheEpoch) {
  const Stream nb = tracked_stream(d, streams);
  DeferredFrees q(d, &streams, 0);
  close_one_behind_work(q);  // two events, both in use while the legacy stream is held
  d.stream_destroy(nb);      // still in the tracker: the next record on it fails
  q.defer_barrier({0x2000, 1, 0}, clock::ticks());
  q.defer_barrier({0x3000, 1, 0}, clock::ticks());
  fake.reset_calls();
  q.close(collect);
  EXPECT_EQ(fake.calls(FakeOp::ctx_synchronize), 1u) << "the events cannot cover the epoch";
  EXPECT_EQ(out, (std::vector<DevPtr>{0x2000, 0x3000})) << "synchronized, so released at once";
  EXPECT_EQ(q.pending(), 1u);
  EXPECT_EQ(q.pending_bytes(), 1u);
  fake.release_stream(kStreamLegacy);
  q.poll(10, collect);
  EXPECT_EQ(out.back(), 0x1000u)
      << "the failed epoch's legacy event was unwound, not left in front";
  EXPECT_TRUE(q.empty());
  fake.reset_calls();
  q.defer_barrier({0x4000, 1, 0}, clock::ticks());
  q.close(collect);
  EXPECT_EQ(fake.calls(FakeOp::event_create), 0u) << "pooled events are reused after a failure";
}

TEST_F(DeferredFreesTest, AContextSynchronizationReleasesOnlyFreesMadeBeforeItBegan) {
  DeferredFrees q(d, &streams, 0);
  fake.hold_stream(kStreamLegacy);  // kernels that may still use the blocks
  q.defer_barrier({0x1000, 1, 0}, clock::ticks());
  const std::uint64_t sync = streams.begin_context_sync();
  q.defer_barrier({0x2000, 1, 0}, clock::ticks());  // during the synchronization: not covered
  fake.reset_calls();
  EXPECT_EQ(q.context_synchronized(sync, collect), 1u);
  EXPECT_EQ(out, (std::vector<DevPtr>{0x1000}));
  EXPECT_EQ(fake.calls(FakeOp::event_record), 0u) << "no event needed";
  EXPECT_EQ(q.context_synchronized(sync, collect), 0u);
  EXPECT_EQ(q.pending(), 1u);
  EXPECT_EQ(q.context_synchronized(streams.begin_context_sync(), collect), 1u);
  EXPECT_TRUE(q.empty());
}

TEST_F(DeferredFreesTest, AContextSynchronizationAlsoReleasesClosedEpochsWhoseEventsCompleted) {
  DeferredFrees q(d, &streams, 0);
  close_one_behind_work(q);
  const std::uint64_t sync = streams.begin_context_sync();
  EXPECT_EQ(q.context_synchronized(sync, collect), 0u) << "its event has not completed";
  fake.release_stream(kStreamLegacy);
  EXPECT_EQ(q.context_synchronized(sync, collect), 1u);
}

// ---- Both backends, every mode -----------------------------------------------------------------

struct Kind {
  const char* name;
  BackendKind kind;
};
void PrintTo(const Kind& k, std::ostream* os) { *os << k.name; }

class FreeSyncTest : public testing::BackendFixture<::testing::TestWithParam<Kind>> {
 protected:
  FreeSyncTest() : BackendFixture(two_devices()) {}
  void SetUp() override { make(GetParam().kind); }
  void TearDown() override {
    fake.release_stream(kStreamLegacy);
    backend.reset();
  }

  DevPtr alloc(std::size_t size, FreeSync sync, int device = 0, Api api = Api::alloc,
               Stream stream = kStreamLegacy) {
    return alloc_on(size, sync, device, api, stream);
  }
  // Stands for a kernel still running on `s`: work the stream holds back until the test releases
  // it (fake.release_stream).
  void launch(Stream s) {
    fake.hold_stream(s);
    if (work == nullptr) {
      ASSERT_EQ(d.event_create(&work, 0), res::ok);
    }
    ASSERT_EQ(d.event_record(work, s), res::ok);
  }
  // An epoch of fewer than kFreesPerEvent frees per event stays open at a shortage (memory grows)
  // until it is due: wait until it is.
  static void age_open_epoch() {
    std::this_thread::sleep_for(std::chrono::nanoseconds(kEpochAgeNs + 200'000));
  }
  // Whether one of the next `n` allocations gets `a` back (polled at a shortage, so not always the
  // first).
  bool reused_within(DevPtr a, int n, int device = 0) {
    for (int i = 0; i < n; ++i)
      if (alloc(1 * kMiB, FreeSync::barrier, device) == a) return true;
    return false;
  }
  // A barrier block freed while `s` runs work comes back to no allocation, before or after its
  // epoch is due, until `s` has finished that work; then it does.
  void expect_barrier_waits_for(Stream s) {
    const DevPtr a = alloc(1 * kMiB, FreeSync::barrier);
    launch(s);
    free(a);
    EXPECT_NE(alloc(1 * kMiB, FreeSync::barrier), a);
    // One free is fewer than kFreesPerEvent per event a close would record: the epoch stays open
    // until it is due, and is then closed with an event that covers the busy stream.
    age_open_epoch();
    EXPECT_NE(alloc(1 * kMiB, FreeSync::barrier), a);
    fake.release_stream(s);
    EXPECT_TRUE(reused_within(a, 8)) << "reusable once the stream passed the free";
  }

  Event work = nullptr;
};

TEST_P(FreeSyncTest, NoneReusesAtOnceEvenWithWorkPending) {
  const DevPtr a = alloc(1 * kMiB, FreeSync::none);
  launch(kStreamLegacy);
  fake.reset_calls();
  free(a);
  EXPECT_EQ(alloc(1 * kMiB, FreeSync::none), a);
  EXPECT_EQ(fake.blocking_waits(), 0u);
  EXPECT_EQ(fake.calls(FakeOp::ctx_synchronize), 0u);
}

TEST_P(FreeSyncTest, DeviceSynchronizesAtFreeThenReuses) {
  const DevPtr a = alloc(1 * kMiB, FreeSync::device);
  launch(kStreamLegacy);
  fake.reset_calls();
  free(a);
  EXPECT_EQ(fake.calls(FakeOp::ctx_synchronize), 1u);
  EXPECT_EQ(fake.blocking_waits(), 1u) << "the free waited for the running work, as cudaFree does";
  EXPECT_EQ(alloc(1 * kMiB, FreeSync::device), a);
}

TEST_P(FreeSyncTest, BarrierReusesOnlyAfterTheLegacyStreamPassedTheFree) {
  const DevPtr a = alloc(1 * kMiB, FreeSync::barrier);
  launch(kStreamLegacy);
  free(a);
  const DevPtr b = alloc(1 * kMiB, FreeSync::barrier);
  EXPECT_NE(b, a) << "reused while kernels issued before the free may still run";
  age_open_epoch();
  EXPECT_NE(alloc(1 * kMiB, FreeSync::barrier), a)
      << "closed (due), its event behind the held work";
  EXPECT_EQ(fake.blocking_waits(), 0u) << "neither the free nor the allocations waited";
  EXPECT_EQ(fake.calls(FakeOp::event_synchronize), 0u);
  fake.release_stream(kStreamLegacy);
  EXPECT_TRUE(reused_within(a, 8)) << "reused once the work completed";
}

TEST_P(FreeSyncTest, BarrierCoversBlockingStreamsThroughTheLegacyStream) {
  Stream blocking = nullptr;
  ASSERT_EQ(d.stream_create(&blocking, 0), res::ok);
  expect_barrier_waits_for(blocking);
}

TEST_P(FreeSyncTest, BarrierWaitsForTrackedNonBlockingStreams) {
  expect_barrier_waits_for(tracked_stream(d, streams));
}

// The shortage rule (DeferredFrees::close_at_shortage): whether an epoch is kept open while memory
// grows or closed with fewer frees than events, no block freed while kernels run comes back before
// they completed, and all come back after.
TEST_P(FreeSyncTest, BarrierNeverReusesBeforeTheEpochsEventsCompletedWhateverClosesIt) {
  std::vector<Stream> nb;
  for (int i = 0; i < 3; ++i) nb.push_back(tracked_stream(d, streams));
  for (Stream s : nb) {
    launch(s);
  }
  std::set<DevPtr> freed;
  auto churn = [&](int n) {
    for (int i = 0; i < n; ++i) {
      const DevPtr p = alloc(1 * kMiB, FreeSync::barrier);
      EXPECT_EQ(freed.count(p), 0u) << "reused while the streams' kernels run, iteration " << i;
      free(p);
      freed.insert(p);
    }
  };
  // Shortages: epochs kept open while memory grows, then closed with events on the busy streams.
  churn(static_cast<int>(2 * shortage_frees(3)));
  age_open_epoch();
  churn(3);  // the open epoch is due: closed at fewer frees than events
  EXPECT_EQ(fake.blocking_waits(), 0u);
  const SyncCounters& c = backend->stats().device(0).sync();
  EXPECT_GT(c.epochs.load(), 0u);
  if (GetParam().kind == BackendKind::vmm) {
    EXPECT_GT(c.kept_open.load(), 0u) << "some shortages grew rather than close a small epoch";
  }
  for (Stream s : nb) fake.release_stream(s);
  backend->close_epochs(0, nullptr);
  bool reused = false;
  for (int i = 0; i < 40 && !reused; ++i) {
    const DevPtr p = alloc(1 * kMiB, FreeSync::barrier);
    reused = freed.count(p) != 0;
  }
  EXPECT_TRUE(reused) << "reusable once the streams passed the frees";
}

TEST_P(FreeSyncTest, BarrierFallsBackToSynchronizingWhenARecordFails) {
  const Stream nb = tracked_stream(d, streams);
  const DevPtr a = alloc(1 * kMiB, FreeSync::barrier);
  d.stream_destroy(nb);  // the tracker has not heard of it yet
  fake.hold_stream(kStreamLegacy);
  fake.reset_calls();
  free(a);
  EXPECT_EQ(fake.calls(FakeOp::ctx_synchronize), 0u);
  backend->close_epochs(0, nullptr);
  EXPECT_EQ(fake.calls(FakeOp::ctx_synchronize), 1u);
  EXPECT_EQ(alloc(1 * kMiB, FreeSync::barrier), a) << "synchronized, so reusable at once";
}

TEST_P(FreeSyncTest, BarrierRecordsEventsPerEpochNotPerFree) {
  const Stream nb = tracked_stream(d, streams);
  std::vector<DevPtr> v;
  for (int i = 0; i < 50; ++i) v.push_back(alloc(64 << 10, FreeSync::barrier));
  launch(nb);  // busy, so each epoch needs an event there too
  fake.reset_calls();
  for (DevPtr p : v) free(p);
  // Only an epoch older than kEpochAgeNs closes on its own; 50 frees take far less, even under a
  // sanitizer, but leave room for a slow machine.
  EXPECT_LE(fake.calls(FakeOp::event_record), 4u)
      << "one legacy + one non-blocking event per epoch";
  backend->close_epochs(0, nullptr);
  EXPECT_GE(fake.calls(FakeOp::event_record), 2u);
  fake.release_stream(nb);
}

TEST_P(FreeSyncTest, BarrierFreesMadeBeforeAContextSynchronizationAreReusableAfterIt) {
  // b must join a's open epoch. On a slow machine (a sanitizer, a loaded host) that epoch can come
  // due between the two frees; its close then records an event after b, which rightly covers b
  // too, and the case is not the one under test: set it up again.
  for (int attempt = 0; attempt < 20; ++attempt) {
    const DevPtr a = alloc(1 * kMiB, FreeSync::barrier);
    const DevPtr b = alloc(1 * kMiB, FreeSync::barrier);
    launch(kStreamLegacy);
    free(a);
    const std::uint64_t sync = streams.begin_context_sync();
    fake.reset_calls();
    free(b);  // while the synchronization runs: not covered by it
    if (fake.calls(FakeOp::event_record) != 0) {
      fake.release_stream(kStreamLegacy);
      ASSERT_EQ(d.ctx_synchronize(), res::ok);
      backend->context_synchronized(0, streams.begin_context_sync());
      continue;
    }
    fake.release_stream(kStreamLegacy);  // what the synchronization waited for
    fake.hold_stream(kStreamLegacy);     // and b's kernels, issued after it began, still run
    fake.reset_calls();
    backend->context_synchronized(0, sync);
    EXPECT_EQ(fake.calls(FakeOp::event_record), 0u);
    const DevPtr c = alloc(1 * kMiB, FreeSync::barrier);
    EXPECT_EQ(c, a) << "released by the synchronization, with no event";
    EXPECT_NE(alloc(1 * kMiB, FreeSync::barrier), b) << "freed after the synchronization began";
    return;
  }
  GTEST_SKIP() << "a's epoch came due before b's free in every attempt";
}

TEST_P(FreeSyncTest, BarrierEpochClosedBeforeAStreamIsDestroyedCoversTheStream) {
  const Stream nb = tracked_stream(d, streams);
  const DevPtr a = alloc(1 * kMiB, FreeSync::barrier);
  launch(nb);
  free(a);
  streams.remove(nb);  // what Core::on_stream_destroyed does: the tracker forgets it, then
  backend->close_epochs(0, nb);              // the epoch is closed with an event on it too
  ASSERT_EQ(d.stream_destroy(nb), res::ok);  // its work still runs
  backend->close_epochs(0, nullptr);
  EXPECT_NE(alloc(2 * kMiB, FreeSync::barrier), a);
  EXPECT_NE(alloc(1 * kMiB, FreeSync::barrier), a)
      << "reused while the destroyed stream's kernel runs";
  ASSERT_EQ(d.ctx_synchronize(),
            res::ok);  // the destroyed stream's work completes (the fake's only way)
  bool reused = false;
  for (int i = 0; i < 8 && !reused; ++i) reused = alloc(1 * kMiB, FreeSync::barrier) == a;
  EXPECT_TRUE(reused) << "reusable once the work completed";
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
  launch(kStreamLegacy);  // device 1's
  fake.set_current_device(0);
  free(a);  // from a thread whose current device is 0
  fake.set_current_device(1);
  EXPECT_NE(alloc(1 * kMiB, FreeSync::barrier, 1), a) << "the barrier went to the wrong device";
  age_open_epoch();
  EXPECT_NE(alloc(1 * kMiB, FreeSync::barrier, 1), a) << "the barrier went to the wrong device";
  fake.release_stream(kStreamLegacy);
  EXPECT_TRUE(reused_within(a, 8, 1));
  fake.set_current_device(0);
}

INSTANTIATE_TEST_SUITE_P(Backends, FreeSyncTest,
                         ::testing::Values(Kind{"async_pool", BackendKind::async_pool},
                                           Kind{"vmm", BackendKind::vmm}),
                         [](const ::testing::TestParamInfo<Kind>& i) { return i.param.name; });

// ---- Through the core: the synchronization and stream hooks -----------------------------------

class CoreFreeSyncTest : public ::testing::TestWithParam<Kind> {
 protected:
  DevPtr alloc(std::size_t size) { return testing::must_alloc(core, size); }
  FakeDriver fake{two_devices()};
  Core core{fake.driver(), testing::single(GetParam().kind, FreeSync::barrier)};
};

TEST_P(CoreFreeSyncTest, TheProgramsContextSynchronizationCompletesEarlierFrees) {
  const DevPtr a = alloc(1 * kMiB);
  fake.hold_stream(kStreamLegacy);
  Event e = nullptr;
  ASSERT_EQ(fake.driver().event_create(&e, 0), res::ok);
  ASSERT_EQ(fake.driver().event_record(e, kStreamLegacy), res::ok);  // a kernel reading `a`
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
  EXPECT_NE(alloc(1 * kMiB), a);
  // cuCtxSynchronize's hook: numbered before the real call, reported after it returned.
  const std::uint64_t sync = core.before_context_sync();
  fake.release_stream(kStreamLegacy);
  core.after_context_sync(sync);
  EXPECT_EQ(alloc(1 * kMiB), a);
  fake.driver().event_destroy(e);
}

TEST_P(CoreFreeSyncTest, DestroyingAStreamClosesTheEpochWhileTheStreamExists) {
  Stream nb = nullptr;
  ASSERT_EQ(fake.driver().stream_create(&nb, kStreamNonBlocking), res::ok);
  core.on_stream_created(nb, kStreamNonBlocking);
  const DevPtr a = alloc(1 * kMiB);
  (void)alloc(1 * kMiB);  // the heap's first range is in use
  fake.hold_stream(nb);
  Event e = nullptr;
  ASSERT_EQ(fake.driver().event_create(&e, 0), res::ok);
  ASSERT_EQ(fake.driver().event_record(e, nb), res::ok);  // a kernel reading `a` on nb
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
  fake.reset_calls();
  core.on_stream_destroyed(nb);
  EXPECT_EQ(fake.calls(FakeOp::event_record), 2u) << "legacy and the stream about to go";
  ASSERT_EQ(fake.driver().stream_destroy(nb), res::ok);
  for (int i = 0; i < 4; ++i)
    EXPECT_NE(alloc(1 * kMiB), a) << "reused while the stream's work runs";
  ASSERT_EQ(fake.driver().ctx_synchronize(), res::ok);  // the destroyed stream's work completes
  bool reused = false;
  for (int i = 0; i < 8 && !reused; ++i) reused = alloc(1 * kMiB) == a;
  EXPECT_TRUE(reused) << "reusable once the work completed";
  fake.driver().event_destroy(e);
}

INSTANTIATE_TEST_SUITE_P(Backends, CoreFreeSyncTest,
                         ::testing::Values(Kind{"async_pool", BackendKind::async_pool},
                                           Kind{"vmm", BackendKind::vmm}),
                         [](const ::testing::TestParamInfo<Kind>& i) { return i.param.name; });

}  // namespace
}  // namespace allocshim
