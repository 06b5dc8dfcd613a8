// JSON outputs: the plain report, speedscope profiles, and Chrome/Perfetto trace events.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>

#include "analysis/report.h"

namespace allocshim::analysis {

using Json = nlohmann::ordered_json;

namespace {

// A migrate record's endpoint: a backend index, or a placement of the budget's spill target.
std::string endpoint(std::int32_t b) {
  return b == trace::kPlacementDevice ? "device"
         : b == trace::kPlacementHost ? "host"
                                      : "backend " + std::to_string(b);
}

Json frame_json(const Frame& f) {
  Json j;
  j["function"] = f.function;
  if (!f.file.empty()) j["file"] = f.file;
  if (f.line > 0) j["line"] = f.line;
  if (!f.module.empty()) j["module"] = f.module;
  if (f.inlined) j["inlined"] = true;
  if (f.python) j["python"] = true;
  return j;
}

Json site_json(const Site& s) {
  Json j;
  j["calls"] = s.calls;
  j["bytes"] = s.bytes;
  j["held_at_peak"] = s.held_at_peak;
  j["time_ns"] = s.time_ns;
  j["temporaries"] = s.temporaries;
  j["temporary_bytes"] = s.temporary_bytes;
  j["failures"] = s.failures;
  j["leaked"] = s.leaked;
  j["leaked_bytes"] = s.leaked_bytes;
  j["min_size"] = s.min_size == UINT64_MAX ? 0 : s.min_size;
  j["max_size"] = s.max_size;
  j["mean_lifetime_ns"] = s.freed ? s.lifetime_ns / s.freed : 0;
  j["frames"] = Json::array();
  for (const Frame& f : s.frames) j["frames"].push_back(frame_json(f));
  return j;
}

Json totals_json(const Analysis& a) {
  const Totals& t = a.totals;
  Json j;
  j["allocs"] = t.allocs;
  j["frees"] = t.frees;
  j["bytes"] = t.bytes;
  j["failures"] = t.failures;
  j["ooms"] = t.ooms;
  j["migrations"] = t.migrations;
  j["spills"] = t.spills;
  j["reloads"] = t.reloads;
  j["temporaries"] = t.temporaries;
  j["unmatched_frees"] = t.unmatched_frees;
  j["lost"] = t.lost;
  j["alloc_time_ns"] = t.alloc_time_ns;
  j["free_time_ns"] = t.free_time_ns;
  j["peak_live"] = t.peak_live;
  j["peak_time_ns"] = t.peak_t_ns;
  j["duration_ns"] = t.duration_ns;
  j["sample"] = t.sample;
  return j;
}

Json processes_json(const Analysis& a) {
  Json arr = Json::array();
  for (const Trace& t : a.traces) {
    Json p;
    p["path"] = t.path;
    p["pid"] = t.process.pid ? t.process.pid : t.header.pid;
    p["exe"] = t.process.exe;
    p["argv"] = t.process.argv;
    p["complete"] = t.complete;
    arr.push_back(p);
  }
  return arr;
}

}  // namespace

void write_json(const Analysis& a, const ReportOptions& o, std::ostream& out) {
  Json j;
  j["allocshim_report"] = 1;
  j["processes"] = processes_json(a);
  j["warnings"] = a.warnings;
  j["totals"] = totals_json(a);
  Json hot;
  for (Metric m : {Metric::bytes, Metric::calls, Metric::peak, Metric::time, Metric::temporary}) {
    if (o.sorted && m != o.sort) continue;
    Json list = Json::array();
    for (const Site* s : a.top(m, o.top)) list.push_back(site_json(*s));
    hot[metric_name(m)] = list;
  }
  j["hot_spots"] = hot;
  Json series = Json::array();
  for (const Series& s : a.series) {
    Json js;
    js["pid"] = a.traces[s.process].process.pid;
    js["device"] = s.device;
    js["backend"] = s.backend_name;
    js["peak"] = s.peak;
    Json pts = Json::array();
    for (const Point& p : s.points) pts.push_back(Json::array({p.t_ns, p.bytes}));
    js["points"] = pts;
    series.push_back(js);
  }
  j["memory"] = series;
  out << j.dump(1, ' ', false, Json::error_handler_t::replace) << "\n";
}

// https://www.speedscope.app/file-format-schema.json: one "sampled" profile whose samples are the
// sites' stacks (root first) weighted by the chosen metric.
void write_speedscope(const Analysis& a, const ReportOptions& o, std::ostream& out) {
  Json frames = Json::array();
  std::map<std::string, std::size_t> index;
  Json samples = Json::array(), weights = Json::array();
  std::uint64_t total = 0;
  for (const Site* s : a.top(o.sort, 0)) {
    Json stack = Json::array();
    for (auto it = s->frames.rbegin(); it != s->frames.rend(); ++it) {
      const std::string name = it->label();
      auto [pos, inserted] = index.emplace(name, frames.size());
      if (inserted) {
        Json f;
        f["name"] = it->function;
        if (!it->file.empty()) f["file"] = it->file;
        if (it->line > 0) f["line"] = it->line;
        frames.push_back(f);
      }
      stack.push_back(pos->second);
    }
    samples.push_back(stack);
    const std::uint64_t w = metric_value(*s, o.sort);
    weights.push_back(w);
    total += w;
  }
  const bool bytes = o.sort == Metric::bytes || o.sort == Metric::peak;
  Json profile;
  profile["type"] = "sampled";
  profile["name"] = std::string("allocshim: ") + metric_name(o.sort);
  profile["unit"] = bytes ? "bytes" : o.sort == Metric::time ? "nanoseconds" : "none";
  profile["startValue"] = 0;
  profile["endValue"] = total;
  profile["samples"] = samples;
  profile["weights"] = weights;
  Json j;
  j["$schema"] = "https://www.speedscope.app/file-format-schema.json";
  j["shared"]["frames"] = frames;
  j["profiles"] = Json::array({profile});
  j["name"] = "allocshim report";
  j["activeProfileIndex"] = 0;
  j["exporter"] = "allocshim";
  out << j.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
}

// Chrome trace event format (loads in Perfetto and chrome://tracing): one counter track per
// process and device whose series are the backends' live bytes; an async slice per kept allocation
// (Analysis::allocations) from its allocation to its free, named by its site, with its size, backend
// and stack in the arguments; and instant events for failures, out-of-memory, migrations and reloads.
void write_perfetto(const Analysis& a, const ReportOptions&, std::ostream& out) {
  // Written event by event: a long trace has many slices, and a document of them all would hold
  // hundreds of megabytes.
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  const auto emit = [&](const Json& j) {
    out << (first ? "" : ",\n") << j.dump(-1, ' ', false, Json::error_handler_t::replace);
    first = false;
  };
  for (std::uint32_t p = 0; p < a.traces.size(); ++p) {
    const Trace& t = a.traces[p];
    Json m;
    m["name"] = "process_name";
    m["ph"] = "M";
    m["pid"] = t.process.pid;
    m["args"]["name"] = t.process.exe.empty() ? t.path : t.process.exe;
    emit(m);
  }
  // Per (process, device): merge the backends' points into one counter track with a value per
  // backend, as Perfetto stacks the args of one counter.
  std::map<std::pair<std::uint32_t, int>, std::vector<const Series*>> tracks;
  for (const Series& s : a.series) tracks[{s.process, s.device}].push_back(&s);
  for (const auto& [key, list] : tracks) {
    std::map<std::uint64_t, std::map<std::string, std::uint64_t>> at;  // time -> backend -> bytes
    for (const Series* s : list)
      for (const Point& pt : s->points) at[pt.t_ns][s->backend_name] = pt.bytes;
    std::map<std::string, std::uint64_t> current;
    for (const Series* s : list) current[s->backend_name] = 0;
    for (const auto& [t, values] : at) {
      for (const auto& [b, v] : values) current[b] = v;
      Json c;
      c["name"] = "device " + std::to_string(key.second) + " memory";
      c["ph"] = "C";
      c["ts"] = static_cast<double>(t) / 1000.0;
      c["pid"] = a.traces[key.first].process.pid;
      for (const auto& [b, v] : current) c["args"][b] = v;
      emit(c);
    }
  }
  for (std::size_t n = 0; n < a.allocations.size(); ++n) {
    const Allocation& al = a.allocations[n];
    const Series& s = a.series[al.series];
    Json b;
    b["name"] = al.site < 0 ? std::string("[stack not sampled]")
                : a.sites[static_cast<std::size_t>(al.site)].frames.empty()
                    ? std::string("[no stack]")
                    : a.sites[static_cast<std::size_t>(al.site)].frames[0].label();
    b["cat"] = "allocation";
    b["ph"] = "b";
    b["id"] = n;
    b["ts"] = static_cast<double>(al.alloc_ns) / 1000.0;
    b["pid"] = a.traces[s.process].process.pid;
    Json& args = b["args"];
    args["size"] = al.size;
    args["device"] = s.device;
    args["backend"] = s.backend_name;
    if (al.spilled) args["spilled"] = true;
    if (al.migrations) args["migrated_bytes"] = al.migrated_bytes;
    if (al.free_ns == Allocation::kLive) args["never_freed"] = true;
    if (al.site >= 0) {
      std::string stack;
      for (const Frame& f : a.sites[static_cast<std::size_t>(al.site)].frames)
        stack += f.label() + "\n";
      args["stack"] = stack;
    }
    Json e;
    e["name"] = b["name"];
    e["cat"] = "allocation";
    e["ph"] = "e";
    e["id"] = n;
    e["ts"] =
        static_cast<double>(al.free_ns == Allocation::kLive ? a.totals.duration_ns : al.free_ns) /
        1000.0;
    e["pid"] = b["pid"];
    emit(b);
    emit(e);
  }
  for (const Event* e : a.notable) {
    const Trace& t = a.traces[e->process];
    Json i;
    i["name"] = e->kind == EventKind::alloc_fail ? "allocation failed"
                : e->kind == EventKind::oom      ? "out of memory"
                : e->kind == EventKind::migrate  ? "migration"
                                                 : "policy reload";
    // A move is recorded when it ends and says how long it took: a slice, so that a timeline shows
    // what the moves cost; the other events are instants.
    const std::uint64_t took =
        e->kind == EventKind::migrate ? std::min(e->dur_ns, e->time_ns - a.start_ns) : 0;
    if (took > 0) {
      i["ph"] = "X";
      i["dur"] = static_cast<double>(took) / 1000.0;
    } else {
      i["ph"] = "i";
      i["s"] = "p";
    }
    i["ts"] = static_cast<double>(e->time_ns - took - a.start_ns) / 1000.0;
    i["pid"] = t.process.pid;
    i["tid"] = e->tid;
    i["args"]["device"] = e->device;
    i["args"]["size"] = e->size;
    if (e->kind == EventKind::alloc_fail) i["args"]["result"] = e->result;
    if (e->kind == EventKind::oom) i["args"]["budget"] = e->budget;
    if (e->kind == EventKind::migrate) {
      i["args"]["from"] = endpoint(e->backend);
      i["args"]["to"] = endpoint(e->to_backend);
    }
    emit(i);
  }
  out << "\n]}\n";
}

}  // namespace allocshim::analysis
