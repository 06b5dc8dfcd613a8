#include "backends/free_sync.h"

#include "base/scoped_context.h"

namespace allocshim {

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

DeferredFrees::DeferredFrees(const Driver& driver, const StreamTracker* streams, int device,
                             Context ctx, SyncCounters* counters)
    : driver_(driver),
      streams_(streams),
      device_(device),
      ctx_(ctx),
      events_pool_(driver),
      counters_(counters) {}

std::size_t DeferredFrees::tracked_streams() {
  if (streams_ == nullptr) return 0;
  streams_->non_blocking(device_, scratch_);
  return scratch_.size();
}

DeferredFrees::~DeferredFrees() {
  while (!events_.empty()) {
    events_pool_.release(events_.front());
    events_.pop_front();
  }
}

void DeferredFrees::abandon() {
  while (!open_.empty()) open_.pop_front();
  open_bytes_ = 0;
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

void DeferredFrees::defer_barrier(const PendingFree& f, std::uint64_t now) {
  if (open_.empty()) opened_ = now;
  // A context synchronization numbered above `sync` began after this read, so after this thread
  // issued the kernels that may use the block; one at or below it is not trusted for this free.
  const std::uint64_t sync = streams_ != nullptr ? streams_->context_syncs() : 0;
  open_.push_back(Open{f, sync});
  open_bytes_ += f.size;
}

Result DeferredFrees::close_epoch(Stream also) {
  // A thread may allocate with another context of the device current: the legacy stream there
  // would not order after this context's streams.
  ScopedContext scope(driver_, ctx_);
  const std::uint64_t t0 = counters_ != nullptr ? clock::ticks() : 0;
  Result r = record(kStreamLegacy);
  std::uint32_t recorded = r == res::ok ? 1 : 0;
  std::size_t queried = 0;
  if (r == res::ok) {
    scratch_.clear();
    if (streams_ != nullptr) streams_->non_blocking(device_, scratch_);
    if (also != nullptr) scratch_.push_back(also);
    for (Stream s : scratch_) {
      // An idle stream has finished everything issued to it before this point, the epoch's frees
      // included: no event needed (a query costs less than a record and the query of it later).
      ++queried;
      if (driver_.stream_query(s) == res::ok) continue;
      // A stream destroyed since the snapshot fails here; its work still runs to completion, so
      // the epoch cannot be made safe by events.
      r = record(s);
      if (r != res::ok) break;
      ++recorded;
    }
  }
  if (counters_ != nullptr) {
    counters_->add(counters_->queries, queried);
    counters_->add(counters_->events, recorded);
    counters_->add(counters_->close_ns, clock::to_ns(clock::ticks() - t0));
  }
  if (r != res::ok) {
    unwind(recorded);
    driver_.ctx_synchronize();  // an error too means the context's work is over (it is gone)
    return r;
  }
  bool first = true;
  while (!open_.empty()) {
    const PendingFree f = pop_open();
    entries_.push_back(Entry{f, first ? recorded : 0});
    bytes_ += f.size;
    first = false;
  }
  ++epochs_;
  if (counters_ != nullptr) counters_->add(counters_->epochs);
  return res::ok;
}

Result DeferredFrees::defer_after(const PendingFree& f, Stream stream) {
  const Result r = record(stream);
  if (r != res::ok) return r;
  entries_.push_back(Entry{f, 1});
  bytes_ += f.size;
  return res::ok;
}

bool DeferredFrees::holds(DevPtr ptr) const {
  for (std::size_t i = 0; i < open_.size(); ++i)
    if (open_[i].free.ptr == ptr) return true;
  for (std::size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].free.ptr == ptr) return true;
  return false;
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
