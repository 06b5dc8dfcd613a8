// Reading allocshim traces (shim/trace/format.h) into memory: events sorted by time, the stack
// trie, modules, Python functions, backends and the process description.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "trace/format.h"

namespace allocshim::trace {

enum class EventKind : std::uint8_t { alloc, free, alloc_fail, migrate, oom, reload };
const char* event_kind_name(EventKind kind);

struct Event {
  std::uint64_t time_ns = 0;  // CLOCK_MONOTONIC
  std::uint64_t size = 0;
  std::uint64_t addr = 0;
  std::uint64_t dur_ns = 0;   // time inside the allocation call
  std::uint64_t budget = 0;   // oom: the device budget; migrate: unused
  std::uint64_t reserved = 0; // oom: bytes reserved on the device when it hit the budget
  std::uint32_t tid = 0;
  std::uint32_t stack = 0;    // leaf node id; 0: none
  std::uint32_t flags = 0;
  std::uint32_t process = 0;  // index of the trace in a TraceSet
  std::int32_t backend = -1;  // migrate: the source backend
  std::int32_t to_backend = -1;
  std::int32_t result = 0;    // alloc_fail: the driver's CUresult; reload: 1 if it succeeded
  std::int16_t device = 0;
  std::uint8_t api = 0;
  EventKind kind = EventKind::alloc;
};

struct StackNode {
  std::uint32_t parent = 0;
  std::uint64_t frame = 0;
};

struct PyFunction {
  std::uint32_t first_line = 0;
  std::string name, file;
};

struct ModuleRecord {
  std::uint32_t id = 0;
  std::uint64_t bias = 0, start = 0, end = 0;
  std::string path, build_id;
};

struct BackendRecord {
  std::string name;
  std::uint8_t kind = 0;  // BackendKind
};

struct ProcessRecord {
  std::uint32_t pid = 0, ppid = 0;
  StackMode stacks = StackMode::off;
  std::uint32_t sample = 1;
  std::string exe;
  std::vector<std::string> argv;
};

struct Trace {
  std::string path;
  FileHeader header;
  ProcessRecord process;
  std::vector<Event> events;  // sorted by time; per-thread order is kept
  std::unordered_map<std::uint32_t, StackNode> nodes;
  std::unordered_map<std::uint32_t, PyFunction> functions;
  std::vector<ModuleRecord> modules;  // in load order
  std::map<int, BackendRecord> backends;
  std::vector<std::string> reload_sources;  // reload events point here through `addr`
  bool complete = false;        // the end record was found (clean shutdown)
  std::uint64_t lost = 0;       // events the writer dropped
  std::vector<std::string> warnings;

  // Frame values of a stack, innermost first (empty for stack 0 or an unknown id).
  std::vector<std::uint64_t> frames(std::uint32_t stack) const;
  std::string backend_name(int index) const;
};

// Called with (bytes read, total bytes) as chunks are decoded.
using Progress = std::function<void(std::size_t done, std::size_t total)>;

// Parses a trace held in memory. Returns false with `error` set for data that is not a trace, is of
// an unsupported version, or is damaged (a chunk that fails its checksum, a malformed record, a
// reference to an undefined stack). A file cut short (an abrupt exit) is not an error: everything
// up to the last complete chunk is kept and a warning says where it ended.
bool parse_trace(const unsigned char* data, std::size_t n, Trace& out, std::string& error,
                 const Progress& progress = {});
// Reads and parses a file; errors are prefixed with its path.
bool read_trace(const std::string& path, Trace& out, std::string& error,
                const Progress& progress = {});

}  // namespace allocshim::trace
