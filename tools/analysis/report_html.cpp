// The self-contained HTML report: one file with its script, style and data inline (no network, no
// library). This side writes the summary, the warnings and the sites table as HTML, and the data the
// script draws from (report_html.js): the timeline of live memory, the flame graph and the site
// detail.
#include <nlohmann/json.hpp>

#include <sstream>

#include "base/human.h"
#include "policy/types.h"
#include "analysis/report.h"
#include "analysis/report_html_assets.h"

namespace allocshim::analysis {
namespace {

using Json = nlohmann::ordered_json;

std::string esc(const std::string& raw) {
  const std::string s = valid_utf8(raw);
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

// JSON inside <script>: "</" and "<!--" must not appear in it.
std::string script_safe(std::string s) {
  for (std::size_t i = 0; (i = s.find('<', i)) != std::string::npos; i += 6)
    s.replace(i, 1, "\\u003c");
  return s;
}

const char* placement(std::uint8_t backend_kind) {
  switch (static_cast<BackendKind>(backend_kind)) {
    case BackendKind::host: return "host";
    case BackendKind::managed: return "managed";
    default: return "device";
  }
}

std::uint32_t pid_of(const Trace& t) { return t.process.pid ? t.process.pid : t.header.pid; }

const char* event_name(EventKind k) {
  switch (k) {
    case EventKind::alloc_fail: return "allocation failed";
    case EventKind::oom: return "out of memory";
    case EventKind::migrate: return "migration";
    case EventKind::reload: return "policy reload";
    default: return "?";
  }
}

// What the script draws: sites (in Analysis::sites order: the table's rows refer to them by index),
// series, the kept allocations and the notable events.
Json page_data(const Analysis& a, const ReportOptions& o) {
  Json j;
  j["processes"] = Json::array();
  for (const Trace& t : a.traces)
    j["processes"].push_back(
        {{"pid", pid_of(t)}, {"exe", t.process.exe.empty() ? t.path : t.process.exe}});
  j["duration_ns"] = a.totals.duration_ns;
  j["peak_live"] = a.totals.peak_live;
  j["peak_ns"] = a.totals.peak_t_ns;
  j["peak_text"] = human_bytes(a.totals.peak_live) + " at " +
                   format_ns(a.totals.peak_t_ns);  // as the summary says
  j["metric"] = metric_name(o.sort);
  j["weight_format"] = o.sort == Metric::bytes || o.sort == Metric::peak ? "bytes" : "count";
  Json sites = Json::array();
  for (const Site& s : a.sites) {
    Json js;
    Json frames = Json::array();
    for (const Frame& f : s.frames) frames.push_back(f.label());
    js["frames"] = frames;
    js["bytes"] = s.bytes;
    js["calls"] = s.calls;
    js["held_at_peak"] = s.held_at_peak;
    js["temporaries"] = s.temporaries;
    js["leaked_bytes"] = s.leaked_bytes;
    js["failures"] = s.failures;
    js["weight"] = metric_value(s, o.sort);
    sites.push_back(js);
  }
  j["sites"] = sites;
  Json series = Json::array();
  for (const Series& s : a.series) {
    Json pts = Json::array();
    for (const Point& p : s.points) pts.push_back(Json::array({p.t_ns, p.bytes}));
    series.push_back({{"pid", pid_of(a.traces[s.process])},
                      {"device", s.device},
                      {"backend", s.backend_name},
                      {"placement", placement(s.backend_kind)},
                      {"peak", s.peak},
                      {"points", pts}});
  }
  j["series"] = series;
  Json total = Json::array();
  for (const Point& p : a.total.points) total.push_back(Json::array({p.t_ns, p.bytes}));
  j["total"] = total;
  // [alloc_ns, free_ns (-1: never freed), size, site (-1: not sampled), series, spilled, migrated bytes]
  Json allocs = Json::array();
  for (const Allocation& al : a.allocations)
    allocs.push_back(Json::array(
        {al.alloc_ns, al.free_ns == Allocation::kLive ? -1 : static_cast<std::int64_t>(al.free_ns),
         al.size, al.site, al.series, al.spilled ? 1 : 0, al.migrated_bytes}));
  j["allocations"] = allocs;
  j["allocations_omitted"] = a.allocations_omitted;
  Json events = Json::array();
  for (const Event* e : a.notable)
    events.push_back(Json::array({e->time_ns - a.start_ns, event_name(e->kind),
                                  pid_of(a.traces[e->process]), e->device, e->size}));
  j["events"] = events;
  return j;
}

void summary(const Analysis& a, std::ostream& out) {
  const Totals& t = a.totals;
  out << "<p id=\"summary\">" << t.allocs << " allocations (" << esc(human_bytes(t.bytes)) << "), "
      << t.frees << " frees, " << t.failures << " failed, " << t.ooms << " out of memory; peak "
      << esc(human_bytes(t.peak_live)) << " live at " << esc(format_ns(t.peak_t_ns)) << " of "
      << esc(format_ns(t.duration_ns)) << "; " << t.temporaries << " temporary";
  if (t.spills || t.migrations)
    out << "; " << t.spills << " spilled, " << t.migrations << " migrations";
  out << "</p>\n";
  if (t.sample > 1)
    out << "<p class=\"muted\">Stacks sampled 1 in " << t.sample
        << ": per-site figures are scaled estimates.</p>\n";
  if (a.allocations_omitted)
    out << "<p class=\"muted\">The timeline by site draws the " << a.allocations.size()
        << " allocations that held the most memory over time (size &times; lifetime); the other "
        << a.allocations_omitted
        << " are one layer of their own there, and count everywhere else.</p>\n";
}

void sites_table(const Analysis& a, const ReportOptions& o, std::ostream& out) {
  out << "<table id=\"sites\"><thead><tr><th>#</th><th>bytes</th><th>calls</th><th>held at peak</th>"
         "<th>call time</th><th>temporary</th><th>never freed</th><th>site</th></tr></thead><tbody>\n";
  std::size_t n = 0;
  for (const Site* s : a.top(o.sort, o.top)) {
    out << "<tr data-site=\"" << (s - a.sites.data()) << "\"><td>" << ++n << "</td><td data-v=\""
        << s->bytes << "\">" << esc(human_bytes(s->bytes)) << "</td><td data-v=\"" << s->calls
        << "\">" << s->calls << "</td><td data-v=\"" << s->held_at_peak << "\">"
        << esc(human_bytes(s->held_at_peak)) << "</td><td data-v=\"" << s->time_ns << "\">"
        << esc(format_ns(s->time_ns)) << "</td><td data-v=\"" << s->temporaries << "\">"
        << s->temporaries << "</td><td data-v=\"" << s->leaked_bytes << "\">"
        << esc(human_bytes(s->leaked_bytes)) << "</td><td class=\"site\">";
    if (s->frames.empty()) out << "[no stack]";
    for (std::size_t i = 0; i < s->frames.size() && i < o.frames; ++i)
      out << (i ? "<br>" : "") << esc(s->frames[i].label());
    if (s->frames.size() > o.frames)
      out << "<br>&hellip; " << s->frames.size() - o.frames << " more";
    out << "</td></tr>\n";
  }
  out << "</tbody></table>\n";
}

}  // namespace

void write_html(const Analysis& a, const ReportOptions& o, std::ostream& out) {
  out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>allocshim report</title>\n<style>"
      << html_assets::kStyle
      << "</style></head><body>\n<h1>allocshim report</h1>\n<p id=\"processes\">";
  for (const Trace& t : a.traces)
    out << "pid " << pid_of(t) << ": " << esc(t.process.exe.empty() ? t.path : t.process.exe)
        << "<br>";
  out << "</p>\n";
  summary(a, out);
  for (const std::string& w : a.warnings)
    out << "<p class=\"warning\">warning: " << esc(w) << "</p>\n";
  out << "<h2>Live memory over time</h2>\n<div class=\"controls\">stack by "
         "<label><input type=\"radio\" name=\"stack-by\" value=\"backend\" checked> backend</label>"
         "<label><input type=\"radio\" name=\"stack-by\" value=\"site\"> site</label>"
         "<span class=\"muted\">hover: what is live and where it was allocated; drag or wheel: zoom; "
         "double-click: all; click a site: select it</span> <span id=\"zoom-state\" class=\"muted\"></span></div>\n"
         "<div id=\"timeline\"><canvas id=\"timeline-canvas\"></canvas><div id=\"zoom-box\"></div></div>\n"
         "<div id=\"timeline-legend\"></div>\n";
  out << "<h2>Top sites by " << metric_name(o.sort)
      << "</h2>\n<p class=\"muted\">Click a row to see its whole "
         "stack and its memory in the timeline; click a heading to sort.</p>\n";
  sites_table(a, o, out);
  out << "<div id=\"site-detail\"></div>\n";
  out << "<h2>Flame graph (" << metric_name(o.sort)
      << ")</h2>\n<p class=\"muted\">Callers above callees; "
         "click a frame to zoom into it, click it again to zoom out.</p>\n<div id=\"flame\"></div>\n"
         "<div id=\"tooltip\"></div>\n";
  out << "<script type=\"application/json\" id=\"report-data\">"
      << script_safe(page_data(a, o).dump(-1, ' ', false, Json::error_handler_t::replace))
      << "</script>\n<script>" << html_assets::kScript << "</script>\n</body></html>\n";
}

}  // namespace allocshim::analysis
