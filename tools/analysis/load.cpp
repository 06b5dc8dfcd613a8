// Loading traces for the commands (see load.h).
#include "analysis/load.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <queue>
#include <tuple>

namespace allocshim::analysis {
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

bool load_traces(const std::vector<std::string>& paths, std::vector<Trace>& out,
                 std::string& error) {
  ProgressLine line;
  for (const std::string& path : paths) {
    Trace t;
    if (!read_trace(path, t, error, line.for_phase("reading " + path))) return false;
    out.push_back(std::move(t));
  }
  return true;
}

EventStream::EventStream(std::size_t max_held) : max_held_(max_held) {}
EventStream::~EventStream() = default;

bool EventStream::open(const std::vector<std::string>& paths, std::string& error) {
  ProgressLine line;
  traces_.resize(paths.size());
  for (std::uint32_t p = 0; p < paths.size(); ++p) {
    files_.push_back(std::make_unique<TraceFile>());
    if (!files_[p]->open(paths[p], traces_[p], error, line.for_phase("reading " + paths[p])))
      return false;
    const auto& chunks = files_[p]->chunks();
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      order_.push_back({{chunks[c].min_time, p, chunks[c].first_seq}, p, c});
      start_ = std::min(start_, chunks[c].min_time);
      end_ = std::max(end_, chunks[c].max_time);
    }
  }
  if (start_ == UINT64_MAX) start_ = end_ = 0;
  std::sort(order_.begin(), order_.end(),
            [](const ChunkRef& a, const ChunkRef& b) { return a.first < b.first; });
  return true;
}

// The second pass decodes chunks in the order of their first event and hands events on once no
// chunk still to be decoded can hold an earlier one. Memory holds the chunks whose time ranges
// overlap: in a writer's trace, those of a few flush intervals. A trace whose chunks overlap more
// than max_held_ events' worth (a crafted or damaged one) is not held whole: the oldest events go on
// early, with a warning that the order may be off.
bool EventStream::run(const std::function<void(const Event&)>& each, std::string& error,
                      const Progress& progress) {
  std::size_t held =
      0;  // events of decoded chunks still alive (declared first: the runs release them)
  const auto release = [&held](std::vector<Event>* v) {
    held -= v->capacity();
    delete v;
  };
  std::priority_queue<Run, std::vector<Run>, LaterRun> runs;
  std::vector<std::uint32_t> starts;
  const Key last{UINT64_MAX, UINT32_MAX, UINT64_MAX};
  for (std::size_t k = 0; k < order_.size(); ++k) {
    const ChunkRef& ref = order_[k];
    {
      std::shared_ptr<std::vector<Event>> events(new std::vector<Event>, release);
      if (!files_[ref.process]->events(ref.chunk, *events, starts, error)) return false;
      held += events->capacity();
      peak_held_ = std::max(peak_held_, held);
      for (Event& e : *events) e.process = ref.process;
      const std::uint64_t first_seq = files_[ref.process]->chunks()[ref.chunk].first_seq;
      for (std::size_t r = 0; r < starts.size(); ++r) {
        const std::uint32_t to =
            r + 1 < starts.size() ? starts[r + 1] : static_cast<std::uint32_t>(events->size());
        if (starts[r] < to) runs.push(Run{events, starts[r], to, ref.process, first_seq});
      }
    }
    // Past the bound, events go on before chunks still to come that may hold earlier ones.
    const bool over = held > max_held_;
    if (over && warnings_.empty())
      warnings_.push_back(
          files_[ref.process]->path() +
          ": chunks overlap in time far more than a trace writer's do (damaged or crafted?): "
          "events after byte " +
          std::to_string(files_[ref.process]->chunks()[ref.chunk].offset) +
          " may be taken out of time order");
    const Key limit = over ? last : k + 1 < order_.size() ? order_[k + 1].first : last;
    while (!runs.empty()) {
      Run run = runs.top();
      if (over ? held <= max_held_ / 2 : !(run.key() < limit)) break;
      runs.pop();
      // Take this run's events while they stay ahead of every other run and of the limit.
      const Key other = runs.empty() ? limit : std::min(limit, runs.top().key());
      do {
        each((*run.events)[run.pos]);
        ++run.pos;
      } while (run.pos < run.end && run.key() < other);
      if (run.pos < run.end) runs.push(std::move(run));
    }
    if (progress) progress(k + 1, order_.size());
  }
  return true;
}

std::unique_ptr<Analysis> load_and_analyze(const std::vector<std::string>& paths,
                                           const AnalyzeOptions& options, std::string& error) {
  EventStream stream;
  if (!stream.open(paths, error)) return nullptr;
  // The builder takes the definitions; the files keep pointing at them (a moved vector keeps its
  // elements where they are).
  AnalysisBuilder builder(std::move(stream.traces()), options, stream.start_ns(), stream.end_ns());
  ProgressLine line;
  if (!stream.run([&](const Event& e) { builder.add(e); }, error,
                  line.for_phase("analyzing (and symbolizing)")))
    return nullptr;
  line.clear();
  std::unique_ptr<Analysis> a = builder.finish();
  a->warnings.insert(a->warnings.end(), stream.warnings().begin(), stream.warnings().end());
  return a;
}

}  // namespace allocshim::analysis
