// Trace analysis (see analysis.h).
#include "analysis/analysis.h"

#include "analysis/frameworks.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <unordered_map>
#include <utility>

namespace allocshim::analysis {
namespace {

struct Live {
  std::uint64_t size;
  std::uint64_t time;
  std::uint64_t addr;
  std::int64_t site;  // -1: unsampled
  std::uint32_t tid;
  int series;
  bool spilled;
  std::uint32_t migrations = 0;
  std::uint64_t migrated = 0;  // bytes now counted in `moved_to` instead of `series`
  int moved_to = -1;
};

// The allocations that held the most memory over time (size x lifetime: the area they take in a
// timeline), in bounded memory: a min-heap whose top is the one to drop next. Equal areas (the
// same size and lifetime, as in a loop) are told apart by a hash of the address and time, so the
// kept ones are spread over the trace rather than all from its start.
class LargestAllocations {
 public:
  explicit LargestAllocations(std::size_t max) : max_(max) {}
  void add(const Allocation& a, std::uint64_t end_ns) {
    if (max_ == 0) return void(++omitted_);
    const double area = static_cast<double>(a.size) *
                        static_cast<double>(std::max<std::uint64_t>(
                            (a.free_ns == Allocation::kLive ? end_ns : a.free_ns) - a.alloc_ns, 1));
    Entry e{area, mix(a.addr ^ (a.alloc_ns * 0x9e3779b97f4a7c15ull) ^ a.series), a};
    if (heap_.size() == max_) {
      if (!kept_longer(e, heap_.front())) return void(++omitted_);
      std::pop_heap(heap_.begin(), heap_.end(), kept_longer);
      heap_.pop_back();
      ++omitted_;
    }
    heap_.push_back(e);
    std::push_heap(heap_.begin(), heap_.end(), kept_longer);
  }
  std::vector<Allocation> take(std::uint64_t& omitted) {
    std::vector<Allocation> out;
    out.reserve(heap_.size());
    for (const Entry& e : heap_) out.push_back(e.a);
    std::sort(out.begin(), out.end(), [](const Allocation& x, const Allocation& y) {
      if (x.alloc_ns != y.alloc_ns) return x.alloc_ns < y.alloc_ns;
      return x.series != y.series ? x.series < y.series : x.addr < y.addr;
    });
    omitted = omitted_;
    return out;
  }

 private:
  struct Entry {
    double area;
    std::uint64_t tie;
    Allocation a;
  };
  static std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  static bool kept_longer(const Entry& x, const Entry& y) {
    if (x.area != y.area) return x.area > y.area;
    if (x.tie != y.tie) return x.tie < y.tie;
    return x.a.addr < y.a.addr;
  }
  std::size_t max_;
  std::vector<Entry> heap_;
  std::uint64_t omitted_ = 0;
};

std::uint64_t key_of(std::uint32_t process, std::uint64_t addr) {
  // Processes have separate address spaces; user-space addresses use the low 48 bits.
  return (static_cast<std::uint64_t>(process) << 52) ^ addr;
}

// Memory series in bounded memory: all points while there are at most `max`; past that, buckets of
// equal time over the whole analysis keep their first point at the bucket's highest level, so peaks
// survive. Bucketing by absolute time makes compacting in steps equal to compacting once.
void compact(std::vector<Point>& pts, std::size_t max, std::uint64_t span) {
  std::vector<Point> out;
  std::size_t bucket = SIZE_MAX;
  for (const Point& p : pts) {
    const std::size_t b = static_cast<std::size_t>(p.t_ns * (max - 1) / span);
    if (b != bucket) {
      out.push_back(p);
      bucket = b;
    } else if (p.bytes > out.back().bytes) {
      out.back().bytes = p.bytes;
    }
  }
  pts.swap(out);
}

struct SeriesState {
  std::uint64_t live = 0;
  Point last{};
  bool compacted = false;
};

// Per site: weighted bytes live now, and what they were at the latest overall peak. A site's value
// at the peak is saved the first time it changes after that peak (`epoch` counts peaks), so the
// peak costs O(1) however many sites there are, and no second pass over the events is needed.
struct SitePeak {
  std::uint64_t live = 0, at_peak = 0, epoch = 0;
};

}  // namespace

bool parse_metric(const std::string& s, Metric& out) {
  static const std::pair<const char*, Metric> kNames[] = {{"bytes", Metric::bytes},
                                                          {"calls", Metric::calls},
                                                          {"peak", Metric::peak},
                                                          {"time", Metric::time},
                                                          {"temporary", Metric::temporary}};
  for (const auto& [name, m] : kNames)
    if (s == name) return out = m, true;
  return false;
}

const char* metric_name(Metric m) {
  switch (m) {
    case Metric::bytes: return "bytes";
    case Metric::calls: return "calls";
    case Metric::peak: return "peak";
    case Metric::time: return "time";
    case Metric::temporary: return "temporary";
  }
  return "?";
}

std::uint64_t metric_value(const Site& s, Metric m) {
  switch (m) {
    case Metric::bytes: return s.bytes;
    case Metric::calls: return s.calls;
    case Metric::peak: return s.held_at_peak;
    case Metric::time: return s.time_ns;
    case Metric::temporary: return s.temporaries;
  }
  return 0;
}

std::vector<const Site*> Analysis::top(Metric m, std::size_t n) const {
  std::vector<const Site*> out;
  for (const Site& s : sites)
    if (metric_value(s, m) > 0) out.push_back(&s);
  std::stable_sort(out.begin(), out.end(), [m](const Site* a, const Site* b) {
    const std::uint64_t va = metric_value(*a, m), vb = metric_value(*b, m);
    return va != vb ? va > vb : a->key < b->key;
  });
  if (n && out.size() > n) out.resize(n);
  return out;
}

class AnalysisBuilder::Impl {
 public:
  Impl(std::vector<Trace> traces, const AnalyzeOptions& options, std::uint64_t start_ns,
       std::uint64_t end_ns)
      : a_(std::make_unique<Analysis>()), options_(options), largest_(options.max_allocations) {
    a_->traces = std::move(traces);
    a_->start_ns = start_ns;
    span_ = std::max<std::uint64_t>(end_ns - start_ns, 1);
    Totals& tot = a_->totals;
    tot.duration_ns = end_ns - start_ns;
    for (std::uint32_t p = 0; p < a_->traces.size(); ++p) {
      const Trace& t = a_->traces[p];
      tot.lost += t.lost;
      tot.sample = std::max(tot.sample, t.process.sample);
      for (const std::string& w : t.warnings) a_->warnings.push_back(t.path + ": " + w);
      symbolizers_.push_back(std::make_unique<Symbolizer>(t, options.symbols));
      std::uint32_t max_node = 0;
      for (const auto& [id, node] : t.nodes) max_node = std::max(max_node, id);
      site_of_.emplace_back(static_cast<std::size_t>(max_node) + 1, kUnknown);
      weight_.push_back(t.process.sample);
    }
    live_.reserve(1 << 16);
  }

  void add(const Event& e) {
    Totals& tot = a_->totals;
    const std::uint64_t t = e.time_ns - a_->start_ns;
    switch (e.kind) {
      case EventKind::alloc: {
        ++tot.allocs;
        tot.bytes += e.size;
        tot.alloc_time_ns += e.dur_ns;
        if (e.flags & trace::kAllocSpilled) ++tot.spills;
        const std::int64_t s = site_for(e);
        const std::uint64_t w = weight_[e.process];
        if (s >= 0) {
          Site& site = a_->sites[static_cast<std::size_t>(s)];
          site.calls += w;
          site.bytes += e.size * w;
          site.time_ns += e.dur_ns * w;
          site.min_size = std::min(site.min_size, e.size);
          site.max_size = std::max(site.max_size, e.size);
          site_change(s, static_cast<std::int64_t>(e.size * w));
        }
        const std::uint64_t k = key_of(e.process, e.addr);
        const int si = series_for(e);
        auto [it, inserted] = live_.try_emplace(k);
        if (!inserted) {
          // Reused before its free was seen (a free lost with a dropped buffer): retire it.
          retire(it->second, e.process, t);
        }
        it->second =
            Live{e.size, e.time_ns, e.addr, s, e.tid, si, (e.flags & trace::kAllocSpilled) != 0};
        last_alloc_[thread_key(e)] = e.addr;
        live_total_ += e.size;
        series_[static_cast<std::size_t>(si)].live += e.size;
        point(static_cast<std::size_t>(si), t);
        if (live_total_ > tot.peak_live) {
          tot.peak_live = live_total_;
          tot.peak_t_ns = t;
          ++epoch_;
        }
        break;
      }
      case EventKind::free: {
        ++tot.frees;
        tot.free_time_ns += e.dur_ns;
        auto it = live_.find(key_of(e.process, e.addr));
        if (it == live_.end()) {
          ++tot.unmatched_frees;
          break;
        }
        const Live l = it->second;
        live_.erase(it);
        retire(l, e.process, t);
        const std::uint64_t tk = thread_key(e);
        const bool temporary = l.tid == e.tid && last_alloc_[tk] == e.addr;
        if (temporary) {
          ++tot.temporaries;
          last_alloc_[tk] = 0;
        }
        if (l.site >= 0) {
          Site& site = a_->sites[static_cast<std::size_t>(l.site)];
          const std::uint64_t w = weight_[e.process];
          site.freed += w;
          site.lifetime_ns += (e.time_ns - l.time) * w;
          if (temporary) {
            site.temporaries += w;
            site.temporary_bytes += l.size * w;
          }
        }
        break;
      }
      case EventKind::alloc_fail: {
        ++tot.failures;
        const std::int64_t s = site_for(e);
        if (s >= 0) a_->sites[static_cast<std::size_t>(s)].failures += 1;
        notable(e);
        break;
      }
      case EventKind::oom:
        ++tot.ooms;
        notable(e);
        break;
      case EventKind::migrate: {
        ++tot.migrations;
        notable(e);
        // A move between device and host pieces of the budget's spill target (trace::kPlacementDevice,
        // trace::kPlacementHost) keeps the bytes in the same backend's series.
        if (e.backend < 0 || e.to_backend < 0) break;
        // Promotion moves part of a live allocation (a chunk at the same address) to another
        // backend: its bytes count there from now on.
        Live* l = nullptr;
        if (auto it = live_.find(key_of(e.process, e.addr)); it != live_.end()) {
          l = &it->second;
        } else {  // a chunk inside the allocation: rare enough for a scan
          for (auto& [k, v] : live_)
            if (a_->series[static_cast<std::size_t>(v.series)].process == e.process &&
                e.addr > v.addr && e.addr < v.addr + v.size) {
              l = &v;
              break;
            }
        }
        if (!l || l->migrated + e.size > l->size) break;
        Event to = e;
        to.backend = e.to_backend;
        const int ti = series_for(to);
        if (l->moved_to >= 0 && l->moved_to != ti) break;  // one destination per allocation
        l->moved_to = ti;
        l->migrated += e.size;
        ++l->migrations;
        const std::size_t si = static_cast<std::size_t>(l->series),
                          di = static_cast<std::size_t>(ti);
        series_[si].live -= e.size;
        series_[di].live += e.size;
        point(si, t);
        point(di, t);
        break;
      }
      case EventKind::reload:
        ++tot.reloads;
        notable(e);
        break;
    }
  }

  std::unique_ptr<Analysis> finish() {
    for (const auto& [k, l] : live_) {
      largest_.add(record(l, Allocation::kLive), a_->totals.duration_ns);
      if (l.site < 0) continue;
      Site& site = a_->sites[static_cast<std::size_t>(l.site)];
      site.leaked += 1;
      site.leaked_bytes += l.size;
    }
    a_->allocations = largest_.take(a_->allocations_omitted);
    if (epoch_ > 0)
      for (std::size_t i = 0; i < a_->sites.size(); ++i)
        a_->sites[i].held_at_peak = peaks_[i].epoch == epoch_ ? peaks_[i].at_peak : peaks_[i].live;
    const auto finish_points = [&](Series& s, const SeriesState& st) {
      if (st.compacted || (options_.max_points && s.points.size() > options_.max_points)) {
        compact(s.points, options_.max_points, span_);
        s.points.push_back(st.last);  // where the series ends
      }
    };
    for (std::size_t i = 0; i < a_->series.size(); ++i) finish_points(a_->series[i], series_[i]);
    a_->total.backend_name = "all";
    finish_points(a_->total, total_);
    // The hint names the modules whose frames the report shows unnamed (not those only below a
    // Python site's leading line).
    std::vector<std::string> missing, unresolved;
    for (const auto& sym : symbolizers_)
      for (const std::string& m : sym->unresolved_modules()) missing.push_back(m);
    for (const Site& site : a_->sites)
      for (const Frame& f : site.frames)
        if (!f.resolved && std::find(missing.begin(), missing.end(), f.module) != missing.end() &&
            std::find(unresolved.begin(), unresolved.end(), f.module) == unresolved.end())
          unresolved.push_back(f.module);
    if (!unresolved.empty()) a_->warnings.push_back(missing_symbols_hint(unresolved));
    for (std::string& note : framework_notes(*a_)) a_->warnings.push_back(std::move(note));
    return std::move(a_);
  }

 private:
  static constexpr std::int64_t kUnknown = -2;

  static std::uint64_t thread_key(const Event& e) {
    return (static_cast<std::uint64_t>(e.process) << 32) | e.tid;
  }

  // Symbolizes each (process, stack) once and merges equal symbolized stacks.
  std::int64_t site_for(const Event& e) {
    if (e.flags & trace::kAllocUnsampled && e.kind == EventKind::alloc) return -1;
    std::vector<std::int64_t>& of = site_of_[e.process];
    std::int64_t* slot =
        e.stack < of.size() ? &of[e.stack] : nullptr;  // else: undefined (cut short)
    if (slot && *slot != kUnknown) return *slot;
    std::vector<Frame> frames;
    if (e.stack != 0) {
      frames = symbolizers_[e.process]->stack(e.stack);
      if (!options_.keep_runtime_frames) {
        // The stack starts where the program called into CUDA: drop the runtime's frames above.
        std::size_t first = 0;
        for (std::size_t i = 0; i < frames.size(); ++i)
          if (Symbolizer::is_runtime(frames[i])) first = i + 1;
        if (first < frames.size())
          frames.erase(frames.begin(), frames.begin() + static_cast<std::ptrdiff_t>(first));
      }
      std::size_t hidden = 0;
      if (!options_.native_frames) frames = python_first(std::move(frames), hidden);
    }
    std::string key;
    for (const Frame& f : frames) key += f.label() + "\n";
    if (key.empty()) key = "[no stack]";
    auto [kit, inserted] = by_key_.emplace(key, a_->sites.size());
    if (inserted) {
      Site s;
      s.frames = std::move(frames);
      s.key = key;
      a_->sites.push_back(std::move(s));
      peaks_.emplace_back();
    }
    const auto index = static_cast<std::int64_t>(kit->second);
    if (slot) *slot = index;
    return index;
  }

  int series_for(const Event& e) {
    const std::uint64_t k =
        (static_cast<std::uint64_t>(e.process) << 32) |
        (static_cast<std::uint64_t>(static_cast<std::uint16_t>(e.device)) << 16) |
        static_cast<std::uint16_t>(e.backend);
    auto [it, inserted] = series_index_.emplace(k, static_cast<int>(a_->series.size()));
    if (inserted) {
      Series s;
      s.process = e.process;
      s.device = e.device;
      s.backend = e.backend;
      s.backend_name = a_->traces[e.process].backend_name(e.backend);
      const auto& backends = a_->traces[e.process].backends;
      if (auto b = backends.find(e.backend); b != backends.end()) s.backend_kind = b->second.kind;
      a_->series.push_back(std::move(s));
      series_.emplace_back();
    }
    return it->second;
  }

  void site_change(std::int64_t s, std::int64_t delta) {
    SitePeak& p = peaks_[static_cast<std::size_t>(s)];
    if (p.epoch != epoch_) {
      p.at_peak = p.live;
      p.epoch = epoch_;
    }
    p.live = static_cast<std::uint64_t>(static_cast<std::int64_t>(p.live) + delta);
  }

  void point(std::size_t si, std::uint64_t t) {
    total_.live = live_total_;
    add_point(a_->total, total_, t);
    add_point(a_->series[si], series_[si], t);
  }
  void add_point(Series& s, SeriesState& st, std::uint64_t t) {
    st.last = {t, st.live};
    s.peak = std::max(s.peak, st.live);
    s.points.push_back(st.last);
    if (options_.max_points && s.points.size() >= 2 * options_.max_points + 2) {
      compact(s.points, options_.max_points, span_);
      st.compacted = true;
    }
  }

  Allocation record(const Live& l, std::uint64_t free_ns) const {
    return Allocation{l.time - a_->start_ns,
                      free_ns,
                      l.size,
                      l.addr,
                      l.migrated,
                      l.site,
                      static_cast<std::uint32_t>(l.series),
                      l.migrations,
                      l.spilled};
  }

  // Retires a live allocation at `t` (its free, or its address allocated again).
  void retire(const Live& l, std::uint32_t process, std::uint64_t t) {
    live_total_ -= l.size;
    if (l.site >= 0) site_change(l.site, -static_cast<std::int64_t>(l.size * weight_[process]));
    const std::size_t si = static_cast<std::size_t>(l.series);
    series_[si].live -= l.size - l.migrated;
    point(si, t);
    if (l.moved_to >= 0) {
      series_[static_cast<std::size_t>(l.moved_to)].live -= l.migrated;
      point(static_cast<std::size_t>(l.moved_to), t);
    }
    largest_.add(record(l, t), 0);
  }

  void notable(const Event& e) {
    a_->notable_events.push_back(e);
    a_->notable.push_back(&a_->notable_events.back());
  }

  std::unique_ptr<Analysis> a_;
  AnalyzeOptions options_;
  std::uint64_t span_ = 1;
  std::vector<std::unique_ptr<Symbolizer>> symbolizers_;
  std::vector<std::vector<std::int64_t>> site_of_;  // per process: stack id -> site
  std::vector<std::uint64_t> weight_;               // per process: its sampling period
  std::map<std::string, std::size_t> by_key_;
  std::vector<SitePeak> peaks_;  // per site
  std::unordered_map<std::uint64_t, int> series_index_;
  std::vector<SeriesState> series_;
  std::unordered_map<std::uint64_t, Live> live_;
  std::unordered_map<std::uint64_t, std::uint64_t> last_alloc_;  // (process, tid) -> address
  std::uint64_t live_total_ = 0;
  std::uint64_t epoch_ = 0;  // peaks so far
  LargestAllocations largest_;
  SeriesState total_;
};

AnalysisBuilder::AnalysisBuilder(std::vector<Trace> traces, const AnalyzeOptions& options,
                                 std::uint64_t start_ns, std::uint64_t end_ns)
    : impl_(std::make_unique<Impl>(std::move(traces), options, start_ns, end_ns)) {}
AnalysisBuilder::~AnalysisBuilder() = default;
void AnalysisBuilder::add(const Event& e) { impl_->add(e); }
std::unique_ptr<Analysis> AnalysisBuilder::finish() { return impl_->finish(); }

std::unique_ptr<Analysis> analyze(std::vector<Trace> traces, const AnalyzeOptions& options) {
  // Each trace's events are in time order: merge them, equal times in process order.
  std::uint64_t start = UINT64_MAX, end = 0;
  for (const Trace& t : traces)
    if (!t.events.empty()) {
      start = std::min(start, t.events.front().time_ns);
      end = std::max(end, t.events.back().time_ns);
    }
  if (start == UINT64_MAX) start = 0;
  std::vector<std::vector<Event>> events;
  for (Trace& t : traces) events.push_back(std::move(t.events));
  AnalysisBuilder b(std::move(traces), options, start, end);
  std::vector<std::size_t> next(events.size(), 0);
  for (;;) {
    std::size_t best = SIZE_MAX;
    for (std::size_t p = 0; p < events.size(); ++p)
      if (next[p] < events[p].size() &&
          (best == SIZE_MAX || events[p][next[p]].time_ns < events[best][next[best]].time_ns))
        best = p;
    if (best == SIZE_MAX) break;
    Event& e = events[best][next[best]++];
    e.process = static_cast<std::uint32_t>(best);
    b.add(e);
  }
  return b.finish();
}

std::string format_ns(std::uint64_t ns) {
  char buf[32];
  if (ns < 1000)
    std::snprintf(buf, sizeof buf, "%llu ns", static_cast<unsigned long long>(ns));
  else if (ns < 1000000)
    std::snprintf(buf, sizeof buf, "%.1f us", static_cast<double>(ns) / 1e3);
  else if (ns < 1000000000)
    std::snprintf(buf, sizeof buf, "%.1f ms", static_cast<double>(ns) / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.2f s", static_cast<double>(ns) / 1e9);
  return buf;
}

}  // namespace allocshim::analysis
