// What the report, advise and the exporters compute from one or more traces: per call-site
// statistics (bytes, calls, held at peak, time in allocation calls, temporaries, failures), totals,
// and memory over time per process, device and backend. Several traces (one per process) merge
// into one analysis on their common CLOCK_MONOTONIC timeline.
//
// The analysis is one pass over the events in time order that holds the live allocations, not the
// events: load_and_analyze (load.h) streams files of any length through it, chunk by chunk.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "analysis/reader.h"
#include "analysis/symbolize.h"

namespace allocshim::analysis {

// A call site: one distinct stack (merged across processes when their symbolized stacks are equal).
struct Site {
  std::vector<Frame> frames;  // innermost first, the shim's and CUDA's own frames removed
  std::string key;            // the frames' labels, joined: identity across processes
  std::uint64_t calls = 0, bytes = 0;
  std::uint64_t held_at_peak = 0;  // bytes allocated here and still live at the overall peak
  std::uint64_t time_ns = 0;       // inside allocation calls
  std::uint64_t temporaries = 0;   // freed before the same thread allocated again
  std::uint64_t temporary_bytes = 0;
  std::uint64_t failures = 0;
  std::uint64_t leaked = 0, leaked_bytes = 0;  // still live when the trace ended
  std::uint64_t min_size = UINT64_MAX, max_size = 0;
  std::uint64_t lifetime_ns = 0;  // summed over freed allocations
  std::uint64_t freed = 0;
};

enum class Metric { bytes, calls, peak, time, temporary };
bool parse_metric(const std::string& s, Metric& out);
const char* metric_name(Metric m);
std::uint64_t metric_value(const Site& s, Metric m);

struct Point {
  std::uint64_t t_ns;  // since the analysis start
  std::uint64_t bytes;
};
struct Series {
  std::uint32_t process = 0;
  int device = 0;
  int backend = 0;
  std::string backend_name;
  std::uint8_t backend_kind =
      0;                      // BackendKind: where the memory lives (host, managed: not the device)
  std::vector<Point> points;  // live bytes after each change (downsampled)
  std::uint64_t peak = 0;
};

// One allocation of the timeline. Only those that held the most memory over time (size x lifetime)
// are kept (AnalyzeOptions::max_allocations), so a long trace costs bounded memory; the series still
// count every byte.
struct Allocation {
  static constexpr std::uint64_t kLive = UINT64_MAX;
  std::uint64_t alloc_ns = 0, free_ns = kLive;  // since the analysis start; kLive: never freed
  std::uint64_t size = 0, addr = 0;
  std::uint64_t migrated_bytes = 0;  // moved to another backend while live (promotion)
  std::int64_t site = -1;            // index into Analysis::sites; -1: stack not sampled
  std::uint32_t series = 0;          // index into Analysis::series (process, device, backend)
  std::uint32_t migrations = 0;
  bool spilled = false;  // served by the budget's spill target
};

struct Totals {
  std::uint64_t allocs = 0, frees = 0, bytes = 0, failures = 0, ooms = 0, migrations = 0;
  std::uint64_t reloads = 0, spills = 0, temporaries = 0, unmatched_frees = 0, lost = 0;
  std::uint64_t alloc_time_ns = 0, free_time_ns = 0;
  std::uint64_t peak_live = 0, peak_t_ns = 0;  // all processes and devices together
  std::uint64_t duration_ns = 0;
  std::uint32_t sample = 1;  // largest sampling period among the traces (>1: site figures scaled)
};

struct Analysis {
  std::vector<Trace> traces;  // owned: sites refer to their stacks
  std::uint64_t start_ns = 0;
  Totals totals;
  std::vector<Site> sites;
  std::vector<Series> series;
  // Every process, device and backend together. Its points are downsampled on the same grid as the
  // series' (the highest value in each stretch), so where they are it is the true envelope of the
  // stack, which the series' own maxima, summed, can exceed.
  Series total;
  std::vector<Allocation> allocations;    // the kept ones (see Allocation), by allocation time
  std::uint64_t allocations_omitted = 0;  // the others
  std::vector<const Event*> notable;      // failures, out-of-memory, reloads, migrations (timeline)
  std::deque<Event> notable_events;       // what `notable` points to
  std::vector<std::string> warnings;

  // Sites sorted by `m`, largest first, at most `top` (0: all).
  std::vector<const Site*> top(Metric m, std::size_t top) const;
};

struct AnalyzeOptions {
  std::size_t max_points = 2000;        // per series, for the timeline outputs
  std::size_t max_allocations = 50000;  // kept individually for the timeline outputs
  bool keep_runtime_frames = false;
  // Python sites start at the program's own Python frame (native frames below the Python code and
  // framework frames it called are left out, further framework frames folded: frameworks.h);
  // true keeps every frame.
  bool native_frames = false;
  SymbolOptions symbols;
};

// Takes ownership of the traces (read whole, with their events); symbolizes every stack that has
// an event.
std::unique_ptr<Analysis> analyze(std::vector<Trace> traces, const AnalyzeOptions& options = {});

// The analysis of events fed one at a time, in time order across every process; equal times in
// process order, then in the order of each file (what read_trace's stable sort gives).
class AnalysisBuilder {
 public:
  // The traces' definitions (their events are not used); [start_ns, end_ns]: the first and last
  // event times over all of them.
  AnalysisBuilder(std::vector<Trace> traces, const AnalyzeOptions& options, std::uint64_t start_ns,
                  std::uint64_t end_ns);
  ~AnalysisBuilder();
  AnalysisBuilder(const AnalysisBuilder&) = delete;
  AnalysisBuilder& operator=(const AnalysisBuilder&) = delete;
  void add(const Event& e);  // e.process: the index of its trace
  std::unique_ptr<Analysis> finish();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

std::string format_ns(std::uint64_t ns);

}  // namespace allocshim::analysis
