// Trace analysis (see analysis.h).
#include "trace/analysis.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <unordered_map>

namespace allocshim::trace {
namespace {

struct Live {
  std::uint64_t size;
  std::uint64_t time;
  std::int64_t site;  // -1: unsampled
  std::uint32_t tid;
  int series;
};

std::uint64_t key_of(std::uint32_t process, std::uint64_t addr) {
  // Processes have separate address spaces; user-space addresses use the low 48 bits.
  return (static_cast<std::uint64_t>(process) << 52) ^ addr;
}

// Keeps at most `max` points, keeping each bucket's maximum so peaks survive.
void downsample(std::vector<Point>& pts, std::size_t max) {
  if (max == 0 || pts.size() <= max) return;
  const std::uint64_t t0 = pts.front().t_ns, t1 = pts.back().t_ns;
  const std::uint64_t span = std::max<std::uint64_t>(t1 - t0, 1);
  std::vector<Point> out;
  std::size_t bucket = SIZE_MAX;
  for (const Point& p : pts) {
    const std::size_t b = static_cast<std::size_t>((p.t_ns - t0) * (max - 1) / span);
    if (b != bucket) {
      out.push_back(p);
      bucket = b;
    } else if (p.bytes > out.back().bytes) {
      out.back().bytes = p.bytes;
    }
  }
  out.push_back(pts.back());
  pts.swap(out);
}

}  // namespace

bool parse_metric(const std::string& s, Metric& out) {
  static const std::pair<const char*, Metric> kNames[] = {
      {"bytes", Metric::bytes}, {"calls", Metric::calls}, {"peak", Metric::peak},
      {"time", Metric::time}, {"temporary", Metric::temporary}};
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

std::unique_ptr<Analysis> analyze(std::vector<Trace> traces, const AnalyzeOptions& options) {
  auto a = std::make_unique<Analysis>();
  a->traces = std::move(traces);
  Totals& tot = a->totals;

  // One timeline over every process.
  std::vector<const Event*> events;
  for (std::uint32_t p = 0; p < a->traces.size(); ++p) {
    Trace& t = a->traces[p];
    for (Event& e : t.events) e.process = p;
    for (const Event& e : t.events) events.push_back(&e);
    tot.lost += t.lost;
    tot.sample = std::max(tot.sample, t.process.sample);
    for (const std::string& w : t.warnings) a->warnings.push_back(t.path + ": " + w);
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const Event* x, const Event* y) { return x->time_ns < y->time_ns; });
  if (!events.empty()) {
    a->start_ns = events.front()->time_ns;
    tot.duration_ns = events.back()->time_ns - a->start_ns;
  }

  // Sites: symbolize each (process, stack) once and merge equal symbolized stacks.
  std::vector<std::unique_ptr<Symbolizer>> symbolizers;
  for (const Trace& t : a->traces)
    symbolizers.push_back(std::make_unique<Symbolizer>(t, options.symbols));
  std::unordered_map<std::uint64_t, std::int64_t> site_of;  // (process, stack) -> index
  std::map<std::string, std::size_t> by_key;
  auto site_for = [&](const Event& e) -> std::int64_t {
    if (e.flags & kAllocUnsampled && e.kind == EventKind::alloc) return -1;
    const std::uint64_t k = (static_cast<std::uint64_t>(e.process) << 32) | e.stack;
    auto it = site_of.find(k);
    if (it != site_of.end()) return it->second;
    std::vector<Frame> frames;
    if (e.stack != 0) {
      frames = symbolizers[e.process]->stack(e.stack);
      if (!options.keep_runtime_frames) {
        // The stack starts where the program called into CUDA: drop the runtime's frames above.
        std::size_t first = 0;
        for (std::size_t i = 0; i < frames.size(); ++i)
          if (Symbolizer::is_runtime(frames[i])) first = i + 1;
        if (first < frames.size()) frames.erase(frames.begin(), frames.begin() + static_cast<std::ptrdiff_t>(first));
      }
    }
    std::string key;
    for (const Frame& f : frames) key += f.label() + "\n";
    if (key.empty()) key = "[no stack]";
    auto [kit, inserted] = by_key.emplace(key, a->sites.size());
    if (inserted) {
      Site s;
      s.frames = std::move(frames);
      s.key = key;
      a->sites.push_back(std::move(s));
    }
    site_of[k] = static_cast<std::int64_t>(kit->second);
    return static_cast<std::int64_t>(kit->second);
  };

  std::map<std::tuple<std::uint32_t, int, int>, int> series_index;
  std::vector<std::uint64_t> series_live;
  auto series_for = [&](const Event& e) {
    const auto k = std::make_tuple(e.process, static_cast<int>(e.device), static_cast<int>(e.backend));
    auto [it, inserted] = series_index.emplace(k, static_cast<int>(a->series.size()));
    if (inserted) {
      Series s;
      s.process = e.process;
      s.device = e.device;
      s.backend = e.backend;
      s.backend_name = a->traces[e.process].backend_name(e.backend);
      a->series.push_back(std::move(s));
      series_live.push_back(0);
    }
    return it->second;
  };

  // Pass 1: counters, lifetimes, temporaries, timeline and the time of the peak.
  std::unordered_map<std::uint64_t, Live> live;
  std::unordered_map<std::uint64_t, std::uint64_t> last_alloc;  // (process, tid) -> address
  std::uint64_t live_total = 0;
  std::size_t peak_index = 0;
  std::vector<std::int64_t> alloc_site(events.size(), -1);
  const auto weight = [&](const Event& e) -> std::uint64_t {
    return a->traces[e.process].process.sample;
  };
  for (std::size_t i = 0; i < events.size(); ++i) {
    const Event& e = *events[i];
    const std::uint64_t t = e.time_ns - a->start_ns;
    switch (e.kind) {
      case EventKind::alloc: {
        ++tot.allocs;
        tot.bytes += e.size;
        tot.alloc_time_ns += e.dur_ns;
        if (e.flags & kAllocSpilled) ++tot.spills;
        const std::int64_t s = site_for(e);
        alloc_site[i] = s;
        if (s >= 0) {
          Site& site = a->sites[static_cast<std::size_t>(s)];
          const std::uint64_t w = weight(e);
          site.calls += w;
          site.bytes += e.size * w;
          site.time_ns += e.dur_ns * w;
          site.min_size = std::min(site.min_size, e.size);
          site.max_size = std::max(site.max_size, e.size);
        }
        const std::uint64_t k = key_of(e.process, e.addr);
        const int si = series_for(e);
        if (auto old = live.find(k); old != live.end()) {
          // Reused before its free was seen (a free lost with a dropped buffer): retire it.
          live_total -= old->second.size;
          series_live[static_cast<std::size_t>(old->second.series)] -= old->second.size;
          live.erase(old);
        }
        live[k] = Live{e.size, e.time_ns, s, e.tid, si};
        last_alloc[(static_cast<std::uint64_t>(e.process) << 32) | e.tid] = e.addr;
        live_total += e.size;
        series_live[static_cast<std::size_t>(si)] += e.size;
        a->series[static_cast<std::size_t>(si)].points.push_back({t, series_live[static_cast<std::size_t>(si)]});
        if (live_total > tot.peak_live) {
          tot.peak_live = live_total;
          tot.peak_t_ns = t;
          peak_index = i;
        }
        break;
      }
      case EventKind::free: {
        ++tot.frees;
        tot.free_time_ns += e.dur_ns;
        auto it = live.find(key_of(e.process, e.addr));
        if (it == live.end()) {
          ++tot.unmatched_frees;
          break;
        }
        const Live l = it->second;
        live.erase(it);
        live_total -= l.size;
        const std::size_t si = static_cast<std::size_t>(l.series);
        series_live[si] -= l.size;
        a->series[si].points.push_back({t, series_live[si]});
        const std::uint64_t tk = (static_cast<std::uint64_t>(e.process) << 32) | e.tid;
        const bool temporary = l.tid == e.tid && last_alloc[tk] == e.addr;
        if (temporary) {
          ++tot.temporaries;
          last_alloc[tk] = 0;
        }
        if (l.site >= 0) {
          Site& site = a->sites[static_cast<std::size_t>(l.site)];
          const std::uint64_t w = weight(e);
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
        if (s >= 0) a->sites[static_cast<std::size_t>(s)].failures += 1;
        a->notable.push_back(&e);
        break;
      }
      case EventKind::oom: ++tot.ooms; a->notable.push_back(&e); break;
      case EventKind::migrate: ++tot.migrations; a->notable.push_back(&e); break;
      case EventKind::reload: ++tot.reloads; a->notable.push_back(&e); break;
    }
  }
  std::vector<std::string> unresolved;
  for (const auto& sym : symbolizers)
    for (const std::string& m : sym->unresolved_modules())
      if (std::find(unresolved.begin(), unresolved.end(), m) == unresolved.end()) unresolved.push_back(m);
  if (!unresolved.empty()) a->warnings.push_back(missing_symbols_hint(unresolved));
  for (const auto& [k, l] : live) {
    if (l.site < 0) continue;
    Site& site = a->sites[static_cast<std::size_t>(l.site)];
    site.leaked += 1;
    site.leaked_bytes += l.size;
  }

  // Pass 2: what each site held at the peak.
  if (tot.peak_live > 0) {
    std::unordered_map<std::uint64_t, std::pair<std::uint64_t, std::int64_t>> at_peak;
    for (std::size_t i = 0; i <= peak_index; ++i) {
      const Event& e = *events[i];
      if (e.kind == EventKind::alloc) {
        at_peak[key_of(e.process, e.addr)] = {e.size * weight(e), alloc_site[i]};
      } else if (e.kind == EventKind::free) {
        at_peak.erase(key_of(e.process, e.addr));
      }
    }
    for (const auto& [k, v] : at_peak)
      if (v.second >= 0) a->sites[static_cast<std::size_t>(v.second)].held_at_peak += v.first;
  }

  for (Series& s : a->series) {
    for (const Point& p : s.points) s.peak = std::max(s.peak, p.bytes);
    downsample(s.points, options.max_points);
  }
  return a;
}

std::string format_bytes(std::uint64_t b) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

std::string format_ns(std::uint64_t ns) {
  char buf[32];
  if (ns < 1000) std::snprintf(buf, sizeof buf, "%llu ns", static_cast<unsigned long long>(ns));
  else if (ns < 1000000) std::snprintf(buf, sizeof buf, "%.1f us", static_cast<double>(ns) / 1e3);
  else if (ns < 1000000000) std::snprintf(buf, sizeof buf, "%.1f ms", static_cast<double>(ns) / 1e6);
  else std::snprintf(buf, sizeof buf, "%.2f s", static_cast<double>(ns) / 1e9);
  return buf;
}

}  // namespace allocshim::trace
