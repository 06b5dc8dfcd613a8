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

DeferredFrees::DeferredFrees(const Driver& driver, const StreamTracker* streams, int device, Context ctx,
                             SyncCounters* counters)
    : driver_(driver), streams_(streams), device_(device), ctx_(ctx), events_pool_(driver), counters_(counters) {}

std::size_t DeferredFrees::tracked_streams() {
  if (streams_ == nullptr) return 0;
  streams_->non_blocking(device_, scratch_);
  return scratch_.size();
}

DeferredFrees::~DeferredFrees() {
  // The owner settled any batch; a recording thread would still use its events.
  while (phase_.load(std::memory_order_acquire) == Phase::recording) std::this_thread::yield();
  return_batch_events(0);
  while (!events_.empty()) {
    events_pool_.release(events_.front());
    events_.pop_front();
  }
}

void DeferredFrees::abandon() {
  while (phase_.load(std::memory_order_acquire) == Phase::recording) std::this_thread::yield();
  phase_.store(Phase::idle, std::memory_order_relaxed);
  while (!open_.empty()) open_.pop_front();
  open_bytes_ = 0;
  while (!batch_.empty()) batch_.pop_front();
  batch_bytes_ = 0;
  batch_events_.clear();
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

void DeferredFrees::defer_barrier(const PendingFree& f, std::uint64_t now) {
  if (open_.empty()) opened_ = now;
  // A context synchronization numbered above `sync` began after this read, so after this thread
  // issued the kernels that may use the block; one at or below it is not trusted for this free.
  const std::uint64_t sync = streams_ != nullptr ? streams_->context_syncs() : 0;
  open_.push_back(Open{f, sync});
  open_bytes_ += f.size;
}

bool DeferredFrees::begin_close(Stream also) {
  if (open_.empty() || phase_.load(std::memory_order_relaxed) != Phase::idle) return false;
  batch_streams_.clear();
  if (streams_ != nullptr) streams_->non_blocking(device_, batch_streams_);
  if (also != nullptr) batch_streams_.push_back(also);
  // Taken here, under the lock: the pool is not thread-safe. Events are created only on first
  // need; a failure leaves fewer than needed, and the recording then falls back to a sync.
  batch_events_.clear();
  for (std::size_t i = 0; i < batch_streams_.size() + 1; ++i) {
    Event e = nullptr;
    if (events_pool_.acquire(&e) != res::ok) break;
    batch_events_.push_back(e);
  }
  while (!open_.empty()) {
    batch_.push_back(open_.front());
    open_.pop_front();
  }
  batch_bytes_ = open_bytes_;
  open_bytes_ = 0;
  batch_recorded_ = 0;
  batch_result_ = res::ok;
  phase_.store(Phase::begun, std::memory_order_relaxed);
  return true;
}

void DeferredFrees::record_close() {
  // A thread may allocate with another context of the device current: the legacy stream there
  // would not order after this context's streams.
  ScopedContext scope(driver_, ctx_);
  const std::uint64_t t0 = counters_ != nullptr ? clock::ticks() : 0;
  Result r = batch_events_.empty() ? res::out_of_memory : driver_.event_record(batch_events_[0], kStreamLegacy);
  std::size_t recorded = r == res::ok ? 1 : 0;
  std::size_t queried = 0;
  for (std::size_t i = 0; r == res::ok && i < batch_streams_.size(); ++i) {
    // An idle stream has finished everything issued to it before this point, the epoch's frees
    // included: no event needed (a query costs less than a record and the query of it later).
    ++queried;
    if (driver_.stream_query(batch_streams_[i]) == res::ok) continue;
    // A stream destroyed since the snapshot fails here; its work still runs to completion, so
    // the epoch cannot be made safe by events.
    r = recorded < batch_events_.size() ? driver_.event_record(batch_events_[recorded], batch_streams_[i])
                                        : res::out_of_memory;
    if (r == res::ok) ++recorded;
  }
  if (r != res::ok) driver_.ctx_synchronize();  // an error too means the context's work is over (it is gone)
  if (counters_ != nullptr) {
    counters_->add(counters_->queries, queried);
    counters_->add(counters_->events, recorded);
    counters_->add(counters_->close_ns, clock::to_ns(clock::ticks() - t0));
  }
  batch_recorded_ = recorded;
  batch_result_ = r;
  phase_.store(Phase::recorded, std::memory_order_release);
}

void DeferredFrees::finish_batch() {
  for (std::size_t i = 0; i < batch_recorded_; ++i) events_.push_back(batch_events_[i]);
  return_batch_events(batch_recorded_);
  bool first = true;
  while (!batch_.empty()) {
    const PendingFree f = batch_.front().free;
    batch_.pop_front();
    entries_.push_back(Entry{f, first ? static_cast<std::uint32_t>(batch_recorded_) : 0});
    bytes_ += f.size;
    first = false;
  }
  batch_bytes_ = 0;
  ++epochs_;
  if (counters_ != nullptr) counters_->add(counters_->epochs);
}

void DeferredFrees::return_batch_events(std::size_t from) {
  for (std::size_t i = from; i < batch_events_.size(); ++i) events_pool_.release(batch_events_[i]);
  batch_events_.clear();
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
  for (std::size_t i = 0; i < batch_.size(); ++i)
    if (batch_[i].free.ptr == ptr) return true;
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
