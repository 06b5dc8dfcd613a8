// What the core reports as it serves requests, to an observer above it (the trace recorder,
// shim/trace). The core defines the interface so that it never includes the layer that records.
//
// The core's side is two lines per event:
//     if (EventSink* s = event_sink()) s->on_alloc(ptr, size, device, backend, api, ns);
// event_sink() is one relaxed load and an unlikely branch: with no observer nothing else runs.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/types.h"

namespace allocshim {

namespace event {
// Flags of on_alloc and on_free, and the placements on_migrate reports for a piece of the budget's
// spill target; they are the trace format's values (trace/recorder.h checks that they agree).
inline constexpr std::uint32_t kAllocSpilled = 1;  // served by the budget's spill target
inline constexpr std::uint32_t kFreeAsync = 1;     // cuMemFreeAsync
inline constexpr int kPlacementDevice = -2;
inline constexpr int kPlacementHost = -3;
}  // namespace event

class EventSink {
 public:
  // Names a backend of the core (index -> name, kind); called for each at start and after a reload.
  virtual void describe_backend(int index, BackendKind kind, std::string_view name) = 0;
  virtual void on_alloc(DevPtr ptr, std::size_t size, int device, int backend, Api api,
                        std::uint64_t ns, std::uint32_t flags = 0) = 0;
  virtual void on_free(DevPtr ptr, std::size_t size, int device, int backend, std::uint64_t ns,
                       std::uint32_t flags = 0) = 0;
  virtual void on_alloc_failed(std::size_t size, int device, int backend, Api api, Result result,
                               std::uint64_t ns) = 0;
  virtual void on_migrate(DevPtr ptr, std::size_t size, int device, int from_backend,
                          int to_backend, std::uint64_t ns) = 0;
  virtual void on_oom(std::size_t size, int device, std::uint64_t budget,
                      std::uint64_t reserved) = 0;
  virtual void on_reload(std::string_view source, bool ok) = 0;
  // Called on the sink a forked child inherited, tagged (kForkedTag), at the child's first event:
  // the fork handler may only store, so the child's own observer starts here; null: none.
  virtual EventSink* in_forked_child() = 0;

 protected:
  ~EventSink() = default;  // sinks are never deleted through this interface
};

namespace detail {
extern std::atomic<EventSink*> g_event_sink;
inline constexpr std::uintptr_t kForkedTag = 1;
}  // namespace detail

// The installed observer, or null when none is.
inline EventSink* event_sink() {
  EventSink* s = detail::g_event_sink.load(std::memory_order_relaxed);
  if (__builtin_expect(s == nullptr, 1)) return nullptr;
  if (__builtin_expect((reinterpret_cast<std::uintptr_t>(s) & detail::kForkedTag) != 0, 0))
    return reinterpret_cast<EventSink*>(reinterpret_cast<std::uintptr_t>(s) & ~detail::kForkedTag)
        ->in_forked_child();
  return s;
}

}  // namespace allocshim
