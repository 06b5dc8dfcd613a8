// Tracing capture: the recorder is the core's event sink (base/events.h); it appends a record of
// each event to a per-thread buffer that a writer thread compresses into the trace file (format.h).
//
// With tracing on, an allocation costs a native unwind (libunwind, per-thread cache), a lookup of
// the stack in a per-thread cache of interned stacks, and a short varint record appended under the
// thread's own (uncontended) spin lock. New stacks, modules and Python functions are defined once,
// off that fast path. Nothing here ever waits for the writer: when it falls behind, events are
// counted as lost instead of blocking the program.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/events.h"
#include "base/types.h"
#include "policy/policy.h"
#include "trace/format.h"

namespace allocshim::trace {

static_assert(kAllocSpilled == event::kAllocSpilled && kFreeAsync == event::kFreeAsync &&
                  kPlacementDevice == event::kPlacementDevice &&
                  kPlacementHost == event::kPlacementHost,
              "the core's event flags are written to the trace as they are");

struct Config {
  std::string path;  // may contain %p (the pid); empty: tracing off
  StackMode stacks = StackMode::native;
  std::uint32_t sample = 1;      // record the stack of one allocation in N (frees are always kept)
  int max_depth = 64;            // native frames per stack
  std::uint32_t flush_ms = 200;  // the writer hands partial buffers to disk at least this often
};

// The policy's [trace] table with the environment on top: ALLOCSHIM_TRACE (path; set by
// `allocshim run --trace`), ALLOCSHIM_TRACE_STACKS (off|native|python|both),
// ALLOCSHIM_TRACE_SAMPLE (N) and ALLOCSHIM_TRACE_DEPTH (frames). False with `error` set when a
// variable has a value we do not understand (tracing then stays at the policy's settings).
bool config_from(const policy::Trace& policy_trace, Config& out, std::string& error);

class Recorder;

// Starts tracing for this process when the policy's [trace] table or ALLOCSHIM_TRACE asks for it.
// Null when tracing is off or could not start (then `error` says why).
Recorder* start_from_policy(const policy::Policy& policy, std::string& error);

// The process's recorder, or null when tracing is off.
inline Recorder* recorder();

class Recorder final : public EventSink {
 public:
  // Opens the trace file (mode 0600, %p expanded) and starts the writer; installs the recorder
  // returned by recorder(). Null with `error` set when the file cannot be created. Calling it when a
  // recorder is running returns the running one. In a forked child of a traced process it starts
  // the child's own trace when the parent's path has %p, and nothing (null, no error) for the
  // parent's own path without %p: that file is the parent's.
  static Recorder* start(const Config& config, std::string& error);
  // Writes everything still buffered and an end record, closes the file and uninstalls the recorder.
  // Runs by itself when the process exits (after atexit handlers); events racing with it are
  // dropped, never crash.
  static void stop();

  // Names a backend of the core (index -> name, kind), so the trace is readable without the
  // policy. Called for each backend at start and after each reload.
  void describe_backend(int index, BackendKind kind, std::string_view name) override;

  // Those that record a stack are never inlined: the stack starts where they return to.
  __attribute__((noinline)) void on_alloc(DevPtr ptr, std::size_t size, int device, int backend,
                                          Api api, std::uint64_t ns,
                                          std::uint32_t flags = 0) override;
  void on_free(DevPtr ptr, std::size_t size, int device, int backend, std::uint64_t ns,
               std::uint32_t flags = 0) override;
  __attribute__((noinline)) void on_alloc_failed(std::size_t size, int device, int backend, Api api,
                                                 Result result, std::uint64_t ns) override;
  void on_migrate(DevPtr ptr, std::size_t size, int device, int from_backend, int to_backend,
                  std::uint64_t ns) override;
  __attribute__((noinline)) void on_oom(std::size_t size, int device, std::uint64_t budget,
                                        std::uint64_t reserved) override;
  void on_reload(std::string_view source, bool ok) override;
  // In a forked child of a process tracing to a path with %p the parent's recorder stays installed,
  // tagged: the fork handler may only do async-signal-safe work, so the child's own trace (file,
  // module map, writer thread) starts at its first event, here.
  EventSink* in_forked_child() override;

  // Blocks until every event recorded before the call is in the file (tests and benchmarks).
  void flush();

  const std::string& path() const;
  const Config& config() const;
  // The native unwinder in use (NativeUnwinder::init's description); empty without native stacks.
  const std::string& unwinder() const;
  // Events recorded and lost (writer behind) so far.
  std::uint64_t events() const;
  std::uint64_t lost() const;

  struct Impl;
  ~Recorder();

 private:
  static Recorder* start_locked(const Config& config, std::string& error);
  friend struct Retired;  // keeps stopped recorders reachable (recorder.cpp)
  explicit Recorder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The recorder is the only event sink the shim installs.
inline Recorder* recorder() { return static_cast<Recorder*>(event_sink()); }

}  // namespace allocshim::trace
