// What the report, advise and the exporters compute from one or more traces: per call-site
// statistics (bytes, calls, held at peak, time in allocation calls, temporaries, failures), totals,
// and memory over time per process, device and backend. Several traces (one per process) merge
// into one analysis on their common CLOCK_MONOTONIC timeline.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trace/reader.h"
#include "trace/symbolize.h"

namespace allocshim::trace {

// A call site: one distinct stack (merged across processes when their symbolized stacks are equal).
struct Site {
  std::vector<Frame> frames;  // innermost first, the shim's and CUDA's own frames removed
  std::string key;            // the frames' labels, joined: identity across processes
  std::uint64_t calls = 0, bytes = 0;
  std::uint64_t held_at_peak = 0;    // bytes allocated here and still live at the overall peak
  std::uint64_t time_ns = 0;         // inside allocation calls
  std::uint64_t temporaries = 0;     // freed before the same thread allocated again
  std::uint64_t temporary_bytes = 0;
  std::uint64_t failures = 0;
  std::uint64_t leaked = 0, leaked_bytes = 0;  // still live when the trace ended
  std::uint64_t min_size = UINT64_MAX, max_size = 0;
  std::uint64_t lifetime_ns = 0;     // summed over freed allocations
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
  std::vector<Point> points;  // live bytes after each change (downsampled)
  std::uint64_t peak = 0;
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
  std::vector<const Event*> notable;  // failures, out-of-memory, reloads, migrations (timeline)
  std::vector<std::string> warnings;

  // Sites sorted by `m`, largest first, at most `top` (0: all).
  std::vector<const Site*> top(Metric m, std::size_t top) const;
};

struct AnalyzeOptions {
  std::size_t max_points = 2000;  // per series, for the timeline outputs
  bool keep_runtime_frames = false;
  SymbolOptions symbols;
};

// Takes ownership of the traces; symbolizes every stack that has an event.
std::unique_ptr<Analysis> analyze(std::vector<Trace> traces, const AnalyzeOptions& options = {});

std::string format_bytes(std::uint64_t bytes);
std::string format_ns(std::uint64_t ns);

}  // namespace allocshim::trace
