// Free safety shared by the pooling backends (async_pool, vmm): what a free must wait for before
// the block it releases may be handed out again. The policy picks one mode per allocation:
//
//   device   cuCtxSynchronize at free, then the block is reusable at once. The same guarantee as
//            cudaFree: every kernel and copy issued before the free, on any stream of the device's
//            context, has completed. The freeing thread blocks; other threads do not wait for it
//            (the sync runs before the backend takes its lock).
//   barrier  At free, events are recorded on the legacy default stream (which orders after the
//            prior work of every blocking stream, the per-thread default streams included) and on
//            each live non-blocking stream of the device (StreamTracker). The block is reused only
//            once all of them have completed, i.e. once all work issued before the free, on any
//            stream the shim knows of, is done. The free does not block; the hot path queries the
//            oldest pending frees (never waits) and waits only when memory is short. Not covered:
//            streams of other contexts on the same device, and streams created through an entry
//            point the shim does not hook; work captured in a CUDA graph that is launched later.
//   none     Reusable at once. Correct only for programs that synchronize before freeing.
//
// Stream-ordered frees (cuMemFreeAsync on stream S) always wait for S, whatever the mode: that is
// the program's own contract with the driver, and it costs one event.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/driver.h"
#include "core/streams.h"
#include "policy/types.h"

namespace allocshim {

// Makes `ctx` current on this thread for the scope and restores the previous context after. Events,
// streams and cuCtxSynchronize act on the *current* context, but a thread may free memory of
// another device than its current one. One ctx_get_current when no switch is needed; a null `ctx`
// (not known) does nothing.
class ScopedContext {
 public:
  ScopedContext(const Driver& driver, Context ctx);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  const Driver& driver_;
  Context saved_ = nullptr;
  bool switched_ = false;
};

// A FIFO ring that reuses its storage: the pending list is pushed and popped on every free and
// allocation, and std::deque would allocate and free a block whenever it crosses one.
template <class T>
class Ring {
 public:
  bool empty() const { return size_ == 0; }
  std::size_t size() const { return size_; }
  T& front() { return buf_[head_]; }
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

// The pending list of one device: frees wait here, in FIFO order, until the events recorded for
// them have completed. Entries are released oldest first, so a slow entry holds back later ones
// (they only wait longer; none is released early). Not thread-safe: the backend's device lock
// guards it, and the device's context must be current when defer/poll/drain are called.
class DeferredFrees {
 public:
  DeferredFrees(const Driver& driver, const StreamTracker* streams, int device);
  // Returns the events of entries still queued to the pool; the owner drains first if it wants the
  // blocks back.
  ~DeferredFrees();
  DeferredFrees(const DeferredFrees&) = delete;
  DeferredFrees& operator=(const DeferredFrees&) = delete;

  // `barrier`: records events on the legacy stream and on every live non-blocking stream of the
  // device, then queues `f`. On error nothing is queued and the caller must make the free safe
  // another way (synchronize the context).
  Result defer_barrier(const PendingFree& f);
  // cuMemFreeAsync on `stream`: one event on that stream.
  Result defer_after(const PendingFree& f, Stream stream);

  // Releases, oldest first, entries whose events have all completed, at most `max_entries` of them;
  // stops at the first entry still pending. Never blocks. release(const PendingFree&) is called for
  // each. Returns how many were released.
  template <class F>
  std::size_t poll(std::size_t max_entries, F&& release) {
    return advance(max_entries, false, release);
  }
  // Memory is short: waits for every pending entry and releases them all.
  template <class F>
  std::size_t drain(F&& release) {
    return advance(~std::size_t{0}, true, release);
  }

  bool empty() const { return entries_.empty(); }
  // The context was destroyed with the events (and the blocks pending on them): forgets both, so
  // that destroying this object touches no dead handle.
  void abandon();
  std::size_t pending() const { return entries_.size(); }
  std::size_t pending_bytes() const { return bytes_; }
  std::size_t events_created() const { return events_pool_.created(); }

 private:
  struct Entry {
    PendingFree free;
    std::uint32_t events;  // its events, still at the front of events_ when it is the head
  };
  Result record(Stream stream);  // one event on `stream`, appended to events_
  void unwind(std::size_t recorded);
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
  EventPool events_pool_;
  Ring<Entry> entries_;
  Ring<Event> events_;
  std::vector<Stream> scratch_;  // snapshot of the live non-blocking streams
  std::size_t bytes_ = 0;
};

// How many pending entries an allocation or free examines on the hot path. Small: each costs an
// event query, and entries complete roughly in order, so a few per call keep up with the frees.
inline constexpr std::size_t kPollBudget = 8;

}  // namespace allocshim
