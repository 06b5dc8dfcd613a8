#include "backends/free_sync.h"

namespace allocshim {

ScopedContext::ScopedContext(const Driver& driver, Context ctx) : driver_(driver) {
  if (ctx == nullptr) return;
  Context current = nullptr;
  if (driver_.ctx_get_current(&current) != res::ok || current == ctx) return;
  if (driver_.ctx_set_current(ctx) == res::ok) {
    saved_ = current;
    switched_ = true;
  }
}

ScopedContext::~ScopedContext() {
  if (switched_) driver_.ctx_set_current(saved_);
}

EventPool::~EventPool() {
  // Errors are ignored: at process exit the driver may already be gone, and then so are the events.
  for (Event e : free_) driver_.event_destroy(e);
}

Result EventPool::acquire(Event* out) {
  if (!free_.empty()) {
    *out = free_.back();
    free_.pop_back();
    return res::ok;
  }
  // Timing off: a timing event costs more to record, and these only ever order work.
  const Result r = driver_.event_create(out, kEventDisableTiming);
  if (r == res::ok) ++created_;
  return r;
}

DeferredFrees::DeferredFrees(const Driver& driver, const StreamTracker* streams, int device)
    : driver_(driver), streams_(streams), device_(device), events_pool_(driver) {}

DeferredFrees::~DeferredFrees() {
  while (!events_.empty()) {
    events_pool_.release(events_.front());
    events_.pop_front();
  }
}

void DeferredFrees::abandon() {
  while (!entries_.empty()) entries_.pop_front();
  while (!events_.empty()) events_.pop_front();
  events_pool_.abandon();
  bytes_ = 0;
}

Result DeferredFrees::record(Stream stream) {
  Event e = nullptr;
  Result r = events_pool_.acquire(&e);
  if (r != res::ok) return r;
  r = driver_.event_record(e, stream);
  if (r != res::ok) {
    events_pool_.release(e);
    return r;
  }
  events_.push_back(e);
  return res::ok;
}

// Takes back the last `recorded` events after a failed defer. They were appended after every queued
// entry's events, so they are the newest; the ring has no pop_back, so rotate the older ones past.
void DeferredFrees::unwind(std::size_t recorded) {
  const std::size_t keep = events_.size() - recorded;
  for (std::size_t i = 0; i < keep; ++i) {
    events_.push_back(events_.front());
    events_.pop_front();
  }
  for (std::size_t i = 0; i < recorded; ++i) {
    events_pool_.release(events_.front());
    events_.pop_front();
  }
}

Result DeferredFrees::defer_barrier(const PendingFree& f) {
  Result r = record(kStreamLegacy);
  if (r != res::ok) return r;
  std::uint32_t recorded = 1;
  if (streams_ != nullptr) streams_->non_blocking(device_, scratch_);
  for (Stream s : scratch_) {
    // A stream destroyed since the snapshot fails here; its work still runs to completion, so the
    // free cannot be made safe by events: the caller synchronizes instead.
    r = record(s);
    if (r != res::ok) {
      unwind(recorded);
      return r;
    }
    ++recorded;
  }
  entries_.push_back(Entry{f, recorded});
  bytes_ += f.size;
  return res::ok;
}

Result DeferredFrees::defer_after(const PendingFree& f, Stream stream) {
  const Result r = record(stream);
  if (r != res::ok) return r;
  entries_.push_back(Entry{f, 1});
  bytes_ += f.size;
  return res::ok;
}

bool DeferredFrees::head_complete(bool wait) {
  Entry& head = entries_.front();
  while (head.events > 0) {
    Event e = events_.front();
    const Result r = wait ? driver_.event_synchronize(e) : driver_.event_query(e);
    // Any answer but "not ready" ends the wait: an error means the context (and its work) is gone.
    if (r == res::not_ready) return false;
    events_.pop_front();
    events_pool_.release(e);
    --head.events;
  }
  return true;
}

}  // namespace allocshim
