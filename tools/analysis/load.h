// Loading several traces for the commands, with progress on a terminal.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "analysis/analysis.h"
#include "analysis/reader.h"

namespace allocshim::analysis {

// The events of several traces in one timeline (time, then process, then file order), read in two
// passes so that a trace never has to fit in memory: open() reads every file's definitions and
// where its chunks are; run() decodes chunks again and hands each event on in order.
class EventStream {
 public:
  // Decoded events held at most, beyond one chunk's (about 80 bytes each).
  static constexpr std::size_t kMaxHeldEvents = std::size_t{4} << 20;

  // `max_held`: the bound on decoded events held (tests use a small one).
  explicit EventStream(std::size_t max_held = kMaxHeldEvents);
  ~EventStream();
  EventStream(const EventStream&) = delete;
  EventStream& operator=(const EventStream&) = delete;

  // Progress on stderr when it is a terminal; false with `error` set when a file cannot be read.
  bool open(const std::vector<std::string>& paths, std::string& error);
  // Each trace's definitions (events empty), in the order of the paths. They may be moved out (a
  // moved vector keeps its elements, which the files still refer to).
  std::vector<Trace>& traces() { return traces_; }
  std::uint64_t start_ns() const { return start_; }
  std::uint64_t end_ns() const { return end_; }
  // Calls `each` for every event in order (e.process: the index of its path); false with `error` set
  // when a chunk cannot be read again.
  bool run(const std::function<void(const Event&)>& each, std::string& error,
           const Progress& progress = {});
  // Said once run() has returned, each prefixed with its file.
  const std::vector<std::string>& warnings() const { return warnings_; }
  // The most decoded events held at once during run().
  std::size_t peak_held() const { return peak_held_; }

 private:
  using Key = std::tuple<std::uint64_t, std::uint32_t, std::uint64_t>;
  struct ChunkRef {
    Key first;  // a lower bound of the keys of its events
    std::uint32_t process;
    std::size_t chunk;
  };
  std::size_t max_held_;
  std::size_t peak_held_ = 0;
  std::vector<Trace> traces_;
  std::vector<std::unique_ptr<TraceFile>> files_;
  std::vector<ChunkRef> order_;
  std::uint64_t start_ = UINT64_MAX, end_ = 0;
  std::vector<std::string> warnings_;
};

// Reads every trace (progress on stderr when it is a terminal) and analyzes them together. Null
// with `error` set when a file cannot be read.
std::unique_ptr<Analysis> load_and_analyze(const std::vector<std::string>& paths,
                                           const AnalyzeOptions& options, std::string& error);
// Reads the traces whole (tests; the commands stream with EventStream).
bool load_traces(const std::vector<std::string>& paths, std::vector<Trace>& out,
                 std::string& error);

}  // namespace allocshim::analysis
