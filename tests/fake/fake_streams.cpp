// Streams and events as ticket counters (see StreamState), and the hold/release test controls.
#include <algorithm>

#include "fake_state.h"

namespace allocshim::fake {
namespace detail {

StreamState* State::stream(Stream handle) {
  if (handle == nullptr || handle == kStreamLegacy || handle == kStreamPerThread) {
    const int d = current_device();
    if (d < 0) return nullptr;
    const auto i = static_cast<std::size_t>(d);
    return handle == kStreamPerThread ? per_thread[i] : legacy[i];
  }
  auto it = streams.find(handle);
  if (it != streams.end()) return it->second;
  stale(handle);
  return nullptr;
}

EventState* State::event(Event handle) {
  auto it = events.find(handle);
  if (it != events.end()) return it->second.get();
  stale(handle);
  return nullptr;
}

void State::complete(StreamState& s) {
  if (s.completed < s.submitted) {
    s.completed = s.submitted;
    ++blocking_waits;
  }
}

void State::complete_device(int device) {
  for (const auto& s : all_streams)
    if (s->device == device) complete(*s);
}

bool State::event_ready(const EventState& e) const {
  for (const auto& [s, ticket] : e.deps)
    if (!s->done(ticket)) return false;
  return true;
}

namespace {

// The tickets an event recorded on `s` now waits for. The legacy stream orders after all prior
// work of the blocking streams of its device, so an event there waits for them too.
void record(State& st, EventState& e, StreamState& s) {
  e.deps.clear();
  e.deps.emplace_back(&s, s.submit());
  if (&s != st.legacy[static_cast<std::size_t>(s.device)]) return;
  for (const auto& other : st.all_streams) {
    if (other.get() == &s || !other->live || other->device != s.device) continue;
    if ((other->flags & kStreamNonBlocking) != 0) continue;
    if (other->completed < other->submitted) e.deps.emplace_back(other.get(), other->submitted);
  }
}

Result create(State& s, Stream* stream, unsigned flags) {
  if (stream == nullptr || (flags & ~kStreamNonBlocking) != 0) return res::invalid_value;
  const int d = s.current_device();
  if (d < 0) return res::invalid_context;
  std::lock_guard lock(s.mu);
  auto st = std::make_unique<StreamState>();
  st->flags = flags;
  st->device = d;
  *stream = st.get();
  s.streams.emplace(st.get(), st.get());
  s.all_streams.push_back(std::move(st));
  return res::ok;
}

}  // namespace

namespace impl {

Result stream_create(Stream* stream, unsigned flags) {
  FAKE_ENTRY(stream_create);
  return create(s, stream, flags);
}

Result stream_create_with_priority(Stream* stream, unsigned flags, int priority) {
  FAKE_ENTRY(stream_create_with_priority);
  (void)priority;  // clamped by real drivers; nothing to model
  return create(s, stream, flags);
}

Result stream_destroy(Stream stream) {
  FAKE_ENTRY(stream_destroy);
  std::lock_guard lock(s.mu);
  auto it = s.streams.find(stream);
  if (it == s.streams.end()) {
    s.stale(stream);
    return res::invalid_handle;
  }
  // Like a real stream, pending work still completes later; the state lives on for its events.
  it->second->live = false;
  s.streams.erase(it);
  return res::ok;
}

Result stream_synchronize(Stream stream) {
  FAKE_ENTRY(stream_synchronize);
  std::lock_guard lock(s.mu);
  StreamState* st = s.stream(stream);
  if (st == nullptr) return res::invalid_handle;
  if (st == s.legacy[static_cast<std::size_t>(st->device)]) {
    // The legacy stream's work waited for every blocking stream's earlier work.
    for (const auto& other : s.all_streams)
      if (other->device == st->device && (other->flags & kStreamNonBlocking) == 0)
        s.complete(*other);
  }
  s.complete(*st);
  s.apply_release_thresholds();
  return res::ok;
}

Result stream_query(Stream stream) {
  FAKE_ENTRY(stream_query);
  std::lock_guard lock(s.mu);
  StreamState* st = s.stream(stream);
  if (st == nullptr) return res::invalid_handle;
  return st->done(st->submitted) ? res::ok : res::not_ready;
}

Result stream_is_capturing(Stream stream, bool* capturing) {
  FAKE_ENTRY(stream_is_capturing);
  std::lock_guard lock(s.mu);
  if (s.stream(stream) == nullptr) return res::invalid_handle;
  *capturing = false;  // the fake has no graphs: fail_next stands for a capture
  return res::ok;
}

Result thread_relax_capture() {
  FAKE_ENTRY(thread_relax_capture);
  (void)s;
  return res::ok;  // the fake has no graphs
}

Result stream_wait_event(Stream stream, Event event, unsigned flags) {
  FAKE_ENTRY(stream_wait_event);
  (void)flags;
  std::lock_guard lock(s.mu);
  // Counted only: the fake does not propagate a held stream to the streams that wait for it.
  if (s.stream(stream) == nullptr || s.event(event) == nullptr) return res::invalid_handle;
  return res::ok;
}

Result event_create(Event* event, unsigned flags) {
  FAKE_ENTRY(event_create);
  if (event == nullptr) return res::invalid_value;
  std::lock_guard lock(s.mu);
  auto e = std::make_unique<EventState>();
  e->flags = flags;
  e->device = std::max(0, s.current_device());
  *event = e.get();
  s.events.emplace(e.get(), std::move(e));
  return res::ok;
}

Result event_record(Event event, Stream stream) {
  FAKE_ENTRY(event_record);
  std::lock_guard lock(s.mu);
  EventState* e = s.event(event);
  StreamState* st = s.stream(stream);
  if (e == nullptr || st == nullptr) return res::invalid_handle;
  record(s, *e, *st);
  e->recorded = true;
  e->at_ns = s.clock_ns;
  return res::ok;
}

Result event_query(Event event) {
  FAKE_ENTRY(event_query);
  std::lock_guard lock(s.mu);
  const EventState* e = s.event(event);
  if (e == nullptr) return res::invalid_handle;
  return s.event_ready(*e) ? res::ok : res::not_ready;
}

Result event_synchronize(Event event) {
  FAKE_ENTRY(event_synchronize);
  std::lock_guard lock(s.mu);
  const EventState* e = s.event(event);
  if (e == nullptr) return res::invalid_handle;
  // A real device would block until the held work finished; the fake finishes it (up to the
  // event's tickets, not later work) and counts the wait.
  bool waited = false;
  for (const auto& [st, ticket] : e->deps) {
    if (!st->done(ticket)) {
      st->completed = ticket;
      waited = true;
    }
  }
  if (waited) ++s.blocking_waits;
  s.apply_release_thresholds();
  return res::ok;
}

// As on CUDA: both events recorded and complete, and neither made without timing.
Result event_elapsed_time(float* ms, Event start, Event end) {
  FAKE_ENTRY(event_elapsed_time);
  if (ms == nullptr) return res::invalid_value;
  std::lock_guard lock(s.mu);
  const EventState* a = s.event(start);
  const EventState* b = s.event(end);
  if (a == nullptr || b == nullptr || ((a->flags | b->flags) & kEventDisableTiming) != 0)
    return res::invalid_handle;
  if (!a->recorded || !b->recorded || !s.event_ready(*a) || !s.event_ready(*b))
    return res::not_ready;
  *ms = static_cast<float>(static_cast<double>(b->at_ns) - static_cast<double>(a->at_ns)) / 1e6f;
  return res::ok;
}

Result event_destroy(Event event) {
  FAKE_ENTRY(event_destroy);
  std::lock_guard lock(s.mu);
  if (s.events.erase(event) == 1) return res::ok;
  s.stale(event);
  return res::invalid_handle;
}

}  // namespace impl
}  // namespace detail

// ---- Test controls ----------------------------------------------------------------------------

void FakeDriver::hold_stream(Stream stream) {
  std::lock_guard lock(state_->mu);
  if (detail::StreamState* s = state_->stream(stream)) s->held = true;
}

void FakeDriver::release_stream(Stream stream) {
  std::lock_guard lock(state_->mu);
  if (detail::StreamState* s = state_->stream(stream)) {
    s->held = false;
    s->completed = s->submitted;
  }
}

std::uint64_t FakeDriver::blocking_waits() const {
  std::lock_guard lock(state_->mu);
  return state_->blocking_waits;
}

std::size_t FakeDriver::live_streams() const {
  std::lock_guard lock(state_->mu);
  return state_->streams.size();
}

std::size_t FakeDriver::live_events() const {
  std::lock_guard lock(state_->mu);
  return state_->events.size();
}

void FakeDriver::advance_clock(std::uint64_t ns) {
  std::lock_guard lock(state_->mu);
  state_->clock_ns += ns;
}

bool FakeDriver::event_complete(Event event) const {
  std::lock_guard lock(state_->mu);
  auto it = state_->events.find(event);
  return it != state_->events.end() && state_->event_ready(*it->second);
}

}  // namespace allocshim::fake
