// Free safety shared by the pooling backends (async_pool, vmm): what a free must wait for before
// the block it releases may be handed out again. The policy picks one mode per allocation:
//
//   device   cuCtxSynchronize at free, then the block is reusable at once. The same guarantee as
//            cudaFree: every kernel and copy issued before the free, on any stream of the device's
//            context, has completed. The freeing thread blocks; other threads do not wait for it
//            (the sync runs before the backend takes its lock).
//   barrier  The block is reused only once events recorded *after* the free have completed, on the
//            legacy default stream (which orders after the prior work of every blocking stream,
//            the per-thread default streams included) and on each live non-blocking stream of the
//            device (StreamTracker): once all work issued before the free, on any stream the shim
//            knows of, is done. The free does not block. Not covered: streams of other contexts on
//            the same device, streams created through an entry point the shim does not hook, work
//            captured in a CUDA graph that is launched later.
//   none     Reusable at once. Correct only for programs that synchronize before freeing.
//
// Epochs. A `barrier` free records nothing: it joins the device's open epoch. The epoch is closed
// -- one event on the legacy stream and one per busy non-blocking stream, for all its frees --
// when it is older than kEpochAgeNs or holds kEpochBytes (checked at the next free or allocation
// that takes the device lock), when an allocation would otherwise take new memory and the epoch
// holds kFreesPerEvent frees per event its close may record (close_at_shortage; vmm: before it
// maps; async_pool: when its pool holds less free than the request, or after it grew), before a
// stream is destroyed (events recorded later could not cover its work), and when memory is
// reclaimed.
// Events recorded at the close come after every free of the epoch, so they cover at least what
// events at each free would have. Why: an event on the legacy stream is a barrier across every
// blocking stream of every thread, so one per free serializes every thread's streams; one per
// epoch amortizes it over the epoch's frees (kernel_churn in tools/bench/sync_bench.sh measures it).
//
// The program's own cuCtxSynchronize completes every free made before it began: those blocks are
// released with no event (StreamTracker::begin_context_sync, Core::after_context_sync).
//
// Rejected, measured or argued in docs/policy.md: recording on each tracked blocking stream instead
// of the legacy stream (the legacy stream's own work and the per-thread default streams of other
// threads are invisible to the shim: kernels are not hooked), and immediate reuse while only the
// legacy stream is used (not provable for the same reason: cudaStreamPerThread works through the
// plain entry points). Also rejected (measured by sync_bench.sh, docs/policy.md): recording a
// close's events without the device lock, since the other threads' shortages then map new memory
// instead of closing the next epoch, and the extra mappings slow every driver call. Under the lock
// a close also throttles the growth.
//
// Stream-ordered frees (cuMemFreeAsync on stream S) always wait for S, whatever the mode: that is
// the program's own contract with the driver, and it costs one event at the free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/clock.h"
#include "base/driver.h"
#include "base/stats.h"
#include "base/streams.h"
#include "base/types.h"

namespace allocshim {

// A FIFO ring that reuses its storage: the pending list is pushed and popped on every free and
// allocation, and std::deque would allocate and free a block whenever it crosses one.
template <class T>
class Ring {
 public:
  bool empty() const { return size_ == 0; }
  std::size_t size() const { return size_; }
  T& front() { return buf_[head_]; }
  const T& operator[](std::size_t i) const { return buf_[(head_ + i) & (buf_.size() - 1)]; }
  void pop_front() {
    head_ = (head_ + 1) & (buf_.size() - 1);
    --size_;
  }
  void push_back(const T& v) {
    if (size_ == buf_.size()) grow();
    buf_[(head_ + size_) & (buf_.size() - 1)] = v;
    ++size_;
  }

 private:
  void grow() {
    std::vector<T> next(buf_.empty() ? 16 : buf_.size() * 2);
    for (std::size_t i = 0; i < size_; ++i) next[i] = buf_[(head_ + i) & (buf_.size() - 1)];
    buf_.swap(next);
    head_ = 0;
  }
  std::vector<T> buf_;  // power-of-two capacity
  std::size_t head_ = 0, size_ = 0;
};

// Events of one context, created on first need and then recycled: cuEventCreate stays off the hot
// path. Not thread-safe (the owning backend's device lock guards it).
class EventPool {
 public:
  explicit EventPool(const Driver& driver) : driver_(driver) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  Result acquire(Event* out);
  void release(Event e) { free_.push_back(e); }
  // The context the events belonged to was destroyed with them: forget them, never destroy.
  void abandon() { free_.clear(); }
  std::size_t created() const { return created_; }

 private:
  const Driver& driver_;
  std::vector<Event> free_;
  std::size_t created_ = 0;
};

// A freed block waiting for its events.
struct PendingFree {
  DevPtr ptr = 0;
  std::size_t size = 0;      // bytes held (for pending_bytes)
  std::uint64_t cookie = 0;  // the backend's cookie, handed back at release
};

// When a `barrier` epoch is closed on its own (see the header comment). 500 us: a legacy-stream
// barrier at most every half millisecond per device, while a freed block waits at most that long
// (plus the GPU's lag) before it can be reused. 64 MiB: large frees are not held back that long.
inline constexpr std::uint64_t kEpochAgeNs = 500'000;
inline constexpr std::size_t kEpochBytes = std::size_t{64} << 20;
// At a shortage an epoch is closed once it holds this many frees per event its close may record
// (DeferredFrees::close_at_shortage), so that a close's stream queries, taken under the device
// lock, are amortized and epochs mostly close by age; chosen by kernel_churn with 16 threads
// (tools/bench/sync_bench.sh), at the price of more memory held by pending frees.
inline constexpr std::size_t kFreesPerEvent = 4;
// What the legacy stream's event of a close weighs in that rule, in events on a non-blocking
// stream: it orders after every blocking stream's work, so it costs about ten times a query or
// record on one non-blocking stream (the `free_sync` counters of sync_bench.sh's kernel_churn
// runs, which chose the weight).
inline constexpr std::size_t kLegacyEventWeight = 8;
// The frees an epoch must hold to be closed at a shortage while `tracked` non-blocking streams live.
constexpr std::size_t shortage_frees(std::size_t tracked) {
  return kFreesPerEvent * (kLegacyEventWeight + tracked);
}

// The pending frees of one device: `barrier` frees in the open epoch (no events yet), then closed
// entries in FIFO order until the events recorded for them have completed. Closed entries are
// released oldest first, so a slow entry holds back later ones (they only wait longer; none is
// released early). Not thread-safe: the backend's device lock guards it, and the device's context
// must be current when close/poll/drain are called.
class DeferredFrees {
 public:
  // `ctx`: the device's context, where the events of a close go whatever context the closing
  // thread has current (null: the current one).
  // `counters`: where closes and waits are counted (the device's stats; null: nowhere).
  DeferredFrees(const Driver& driver, const StreamTracker* streams, int device,
                Context ctx = nullptr, SyncCounters* counters = nullptr);
  // Returns the events of entries still queued to the pool; the owner drains first if it wants the
  // blocks back.
  ~DeferredFrees();
  DeferredFrees(const DeferredFrees&) = delete;
  DeferredFrees& operator=(const DeferredFrees&) = delete;

  // `barrier`: `f` joins the open epoch (no driver call). `now` is clock::ticks(), which dates a
  // new epoch.
  void defer_barrier(const PendingFree& f, std::uint64_t now);
  // cuMemFreeAsync on `stream`: one event on that stream. On error nothing is queued and the caller
  // must make the free safe another way (synchronize the stream).
  Result defer_after(const PendingFree& f, Stream stream);

  // Whether the open epoch should be closed now (age or bytes).
  bool due(std::uint64_t now) const {
    return !open_.empty() &&
           (open_bytes_ >= kEpochBytes || clock::to_ns(now - opened_) >= kEpochAgeNs);
  }
  // Closes the open epoch: one event on the legacy stream and one on every live non-blocking stream
  // of the device that is not idle, after which its frees wait like any closed entry. If a record fails (a stream
  // destroyed behind the tracker's back, a dead context) the events cannot cover the epoch: the
  // context is synchronized instead and its frees are released at once. `also`: a stream the
  // tracker no longer lists that needs an event too (one about to be destroyed).
  template <class F>
  void close(F&& release, Stream also = nullptr) {
    if (open_.empty()) return;
    if (close_epoch(also) == res::ok) return;
    while (!open_.empty()) release(pop_open());
  }
  template <class F>
  void close_if_due(std::uint64_t now, F&& release) {
    if (due(now)) close(release);
  }
  // An allocation would take new memory: closes the open epoch if it is due or holds at least
  // kFreesPerEvent frees per event the close may record (the legacy stream's weighing
  // kLegacyEventWeight, and each tracked non-blocking stream), else leaves it open and the caller
  // grows. Returns whether it closed.
  // Why: a close costs a query per tracked stream and a record per busy one under the device
  // lock; closed at every shortage, many threads on non-blocking streams closed an epoch every
  // few frees and queued on the lock (the kernel_churn benchmark, tools/bench/results). Amortized
  // this way a close costs at most 2/kFreesPerEvent driver calls per free it covers, and the
  // memory held back is bounded by that many frees, kEpochBytes and kEpochAge.
  template <class F>
  bool close_at_shortage(std::uint64_t now, F&& release) {
    if (open_.empty()) return false;
    if (!due(now) && open_.size() < shortage_frees(tracked_streams())) {
      if (counters_ != nullptr) counters_->add(counters_->kept_open);
      return false;
    }
    if (counters_ != nullptr) counters_->add(counters_->shortage);
    close(release);
    return true;
  }
  // The program synchronized the device's context, a sync that began as `sync` (StreamTracker::
  // begin_context_sync): every free made before then is complete. Releases those of the open
  // epoch without events, and every closed entry whose events have completed.
  template <class F>
  std::size_t context_synchronized(std::uint64_t sync, F&& release) {
    std::size_t n = 0;
    while (!open_.empty() && open_.front().sync < sync) {
      release(pop_open());
      ++n;
    }
    return n + advance(~std::size_t{0}, false, release);
  }

  // Releases, oldest first, closed entries whose events have all completed, at most `max_entries`
  // of them; stops at the first entry still pending. Never blocks; leaves the open epoch open.
  // release(const PendingFree&) is called for each. Returns how many were released.
  template <class F>
  std::size_t poll(std::size_t max_entries, F&& release) {
    return advance(max_entries, false, release);
  }
  // Memory is short: closes the open epoch, waits for every pending entry and releases them all.
  template <class F>
  std::size_t drain(F&& release) {
    if (counters_ != nullptr && !empty()) counters_->add(counters_->drains);
    std::size_t n = 0;
    close([&](const PendingFree& f) {
      release(f);
      ++n;
    });
    return n + advance(~std::size_t{0}, true, release);
  }

  bool empty() const { return entries_.empty() && open_.empty(); }
  bool in_flight() const { return !entries_.empty(); }  // closed entries wait for their events
  // Whether the block at `ptr` waits here (pointer queries must not find it live). Linear: called
  // only by queries, never on the allocation path.
  bool holds(DevPtr ptr) const;
  // The context was destroyed with the events (and the blocks pending on them): forgets both, so
  // that destroying this object touches no dead handle.
  void abandon();
  std::size_t pending() const { return entries_.size() + open_.size(); }
  std::size_t pending_bytes() const { return bytes_ + open_bytes_; }
  std::size_t events_created() const { return events_pool_.created(); }
  std::uint64_t epochs() const { return epochs_; }  // epochs closed with events

 private:
  struct Entry {
    PendingFree free;
    std::uint32_t events;  // its events, still at the front of events_ when it is the head
  };
  struct Open {
    PendingFree free;
    std::uint64_t sync;  // StreamTracker::context_syncs() at the free
  };
  Result record(Stream stream);   // one event on `stream`, appended to events_
  std::size_t tracked_streams();  // live non-blocking streams of the device (snapshot in scratch_)
  void unwind(std::size_t recorded);
  // Records the open epoch's events (in ctx_) and moves its frees to entries_; on error records
  // nothing, synchronizes the context and leaves the frees in open_ for the caller to release.
  Result close_epoch(Stream also);
  PendingFree pop_open() {
    const PendingFree f = open_.front().free;
    open_.pop_front();
    open_bytes_ -= f.size;
    return f;
  }
  // True when the head entry's events have all completed (waiting for them if `wait`).
  bool head_complete(bool wait);

  template <class F>
  std::size_t advance(std::size_t max_entries, bool wait, F& release) {
    std::size_t n = 0;
    while (n < max_entries && !entries_.empty()) {
      if (!head_complete(wait)) break;
      const PendingFree f = entries_.front().free;
      entries_.pop_front();
      bytes_ -= f.size;
      release(f);
      ++n;
    }
    return n;
  }

  const Driver& driver_;
  const StreamTracker* streams_;
  int device_;
  Context ctx_;
  EventPool events_pool_;
  Ring<Open> open_;
  std::uint64_t opened_ = 0;  // clock ticks at the open epoch's first free
  std::size_t open_bytes_ = 0;
  Ring<Entry> entries_;
  Ring<Event> events_;
  std::vector<Stream> scratch_;  // snapshot of the live non-blocking streams
  std::size_t bytes_ = 0;        // of entries_
  std::uint64_t epochs_ = 0;
  SyncCounters* counters_;
};

// How many pending entries an allocation or free examines on the hot path. Small: each costs an
// event query, and entries complete roughly in order, so a few per call keep up with the frees.
inline constexpr std::size_t kPollBudget = 8;

}  // namespace allocshim
