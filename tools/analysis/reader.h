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

namespace allocshim::analysis {

enum class EventKind : std::uint8_t { alloc, free, alloc_fail, migrate, oom, reload };
const char* event_kind_name(EventKind kind);

struct Event {
  std::uint64_t time_ns = 0;  // CLOCK_MONOTONIC
  std::uint64_t size = 0;
  std::uint64_t addr = 0;
  std::uint64_t dur_ns = 0;    // time inside the allocation call (migrate: the move)
  std::uint64_t budget = 0;    // oom: the device budget; migrate: unused
  std::uint64_t reserved = 0;  // oom: bytes reserved on the device when it hit the budget
  std::uint32_t tid = 0;
  std::uint32_t stack = 0;  // leaf node id; 0: none
  std::uint32_t flags = 0;
  std::uint32_t process = 0;  // index of the trace in a TraceSet
  std::int32_t backend = -1;  // migrate: the source backend
  std::int32_t to_backend = -1;
  std::int32_t result = 0;  // alloc_fail: the driver's CUresult; reload: 1 if it succeeded
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
  trace::StackMode stacks = trace::StackMode::off;
  std::uint32_t sample = 1;
  std::string exe;
  std::vector<std::string> argv;
};

struct Trace {
  std::string path;
  trace::FileHeader header;
  ProcessRecord process;
  std::vector<Event> events;  // sorted by time; per-thread order is kept
  std::unordered_map<std::uint32_t, StackNode> nodes;
  std::unordered_map<std::uint32_t, PyFunction> functions;
  std::vector<ModuleRecord> modules;  // in load order
  std::map<int, BackendRecord> backends;
  std::vector<std::string> reload_sources;  // reload events point here through `addr`
  bool complete = false;                    // the end record was found (clean shutdown)
  std::uint64_t lost = 0;                   // events the writer dropped
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

// A trace read in two passes, for traces too large to hold: open() reads every definition into a
// Trace (whose `events` stay empty) and notes each chunk's place and time range; events() then
// decodes one chunk's events again, so a reader can merge chunks in time order holding only the
// chunks whose times overlap (analysis.cpp). The same checks and warnings as read_trace.
class TraceFile {
 public:
  struct Chunk {
    std::uint64_t offset = 0;  // of its chunk header in the file
    std::uint32_t compressed = 0, raw = 0;
    std::uint32_t events = 0;        // chunks without events are not listed
    std::uint64_t first_seq = 0;     // events of the file before this chunk
    std::uint64_t first_reload = 0;  // reload sources before this chunk
    std::uint64_t min_time = 0, max_time = 0;
  };

  TraceFile() = default;
  ~TraceFile();
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;

  // The first pass. `out` must outlive this object (events() numbers reloads against it). A pipe or
  // FIFO is read to its end into an unnamed temporary file first; a FIFO without a writer reads as
  // empty (an error), never waited on.
  bool open(const std::string& path, Trace& out, std::string& error, const Progress& progress = {});
  const std::vector<Chunk>& chunks() const { return chunks_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Chunk i's events in file order; runs[k] is where its k-th thread segment starts (each segment
  // is in time order).
  bool events(std::size_t i, std::vector<Event>& out, std::vector<std::uint32_t>& runs,
              std::string& error);

 private:
  int fd_ = -1;
  std::size_t size_ = 0;
  std::string path_;
  Trace* trace_ = nullptr;
  std::vector<Chunk> chunks_;
  trace::ChunkDecompressor decompressor_;
};

}  // namespace allocshim::analysis
