// Loading traces for the commands (see load.h).
#include "trace/load.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <queue>
#include <tuple>

namespace allocshim::trace {
namespace {

// "PHASE: N%" on one terminal line, rewritten as it advances; nothing when stderr is not a terminal.
class ProgressLine {
 public:
  ProgressLine() : tty_(isatty(2) != 0) {}
  ~ProgressLine() { clear(); }
  void show(const std::string& phase, std::size_t done, std::size_t total) {
    if (!tty_) return;
    const int pct = total ? static_cast<int>(done * 100 / total) : 100;
    if (pct == last_ && phase == phase_) return;
    last_ = pct;
    phase_ = phase;
    std::fprintf(stderr, "\r\033[K%s: %d%%", phase.c_str(), pct);
  }
  void clear() {
    if (tty_ && last_ >= 0) std::fprintf(stderr, "\r\033[K");
    last_ = -1;
  }
  Progress for_phase(const std::string& phase) {
    if (!tty_) return {};
    return [this, phase](std::size_t done, std::size_t total) { show(phase, done, total); };
  }

 private:
  bool tty_;
  int last_ = -1;
  std::string phase_;
};

// Where an event sits in the merged timeline: time, then process, then its place in its file.
using Key = std::tuple<std::uint64_t, std::uint32_t, std::uint64_t>;

// A thread segment of a decoded chunk: its events are in time order.
struct Run {
  std::shared_ptr<std::vector<Event>> events;  // the chunk's, shared by its segments
  std::uint32_t pos, end;
  std::uint32_t process;
  std::uint64_t first_seq;  // of the chunk
  Key key() const { return {(*events)[pos].time_ns, process, first_seq + pos}; }
};
struct LaterRun {
  bool operator()(const Run& a, const Run& b) const { return a.key() > b.key(); }
};

}  // namespace

bool load_traces(const std::vector<std::string>& paths, std::vector<Trace>& out, std::string& error) {
  ProgressLine line;
  for (const std::string& path : paths) {
    Trace t;
    if (!read_trace(path, t, error, line.for_phase("reading " + path))) return false;
    out.push_back(std::move(t));
  }
  return true;
}

// Two passes over each file (TraceFile): the first reads the definitions and each chunk's time
// range; the second decodes chunks in the order of their first event and hands events to the
// analysis once no chunk still to be decoded can hold an earlier one. Memory holds the chunks whose
// time ranges overlap (a thread's partial buffer is flushed within 200 ms), not the trace.
std::unique_ptr<Analysis> load_and_analyze(const std::vector<std::string>& paths,
                                           const AnalyzeOptions& options, std::string& error) {
  ProgressLine line;
  std::vector<Trace> traces(paths.size());
  std::vector<std::unique_ptr<TraceFile>> files;
  struct ChunkRef {
    Key first;  // a lower bound of the keys of its events
    std::uint32_t process;
    std::size_t chunk;
  };
  std::vector<ChunkRef> order;
  std::uint64_t start = UINT64_MAX, end = 0;
  for (std::uint32_t p = 0; p < paths.size(); ++p) {
    files.push_back(std::make_unique<TraceFile>());
    if (!files[p]->open(paths[p], traces[p], error, line.for_phase("reading " + paths[p]))) return nullptr;
    const auto& chunks = files[p]->chunks();
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      order.push_back({{chunks[c].min_time, p, chunks[c].first_seq}, p, c});
      start = std::min(start, chunks[c].min_time);
      end = std::max(end, chunks[c].max_time);
    }
  }
  if (start == UINT64_MAX) start = end = 0;
  std::sort(order.begin(), order.end(), [](const ChunkRef& a, const ChunkRef& b) { return a.first < b.first; });

  AnalysisBuilder builder(std::move(traces), options, start, end);
  std::priority_queue<Run, std::vector<Run>, LaterRun> runs;
  std::vector<std::uint32_t> starts;
  const Progress progress = line.for_phase("analyzing (and symbolizing)");
  for (std::size_t k = 0; k < order.size(); ++k) {
    const ChunkRef& ref = order[k];
    auto events = std::make_shared<std::vector<Event>>();
    if (!files[ref.process]->events(ref.chunk, *events, starts, error)) return nullptr;
    for (Event& e : *events) e.process = ref.process;
    const std::uint64_t first_seq = files[ref.process]->chunks()[ref.chunk].first_seq;
    for (std::size_t r = 0; r < starts.size(); ++r) {
      const std::uint32_t to = r + 1 < starts.size() ? starts[r + 1] : static_cast<std::uint32_t>(events->size());
      if (starts[r] < to) runs.push(Run{events, starts[r], to, ref.process, first_seq});
    }
    const Key limit = k + 1 < order.size() ? order[k + 1].first : Key{UINT64_MAX, UINT32_MAX, UINT64_MAX};
    while (!runs.empty()) {
      Run run = runs.top();
      if (!(run.key() < limit)) break;
      runs.pop();
      // Take this run's events while they stay ahead of every other run and of the limit.
      const Key other = runs.empty() ? limit : std::min(limit, runs.top().key());
      do {
        builder.add((*run.events)[run.pos]);
        ++run.pos;
      } while (run.pos < run.end && run.key() < other);
      if (run.pos < run.end) runs.push(std::move(run));
    }
    if (progress) progress(k + 1, order.size());
  }
  line.clear();
  return builder.finish();
}

}  // namespace allocshim::trace
