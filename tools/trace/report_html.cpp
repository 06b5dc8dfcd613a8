// The self-contained HTML report: memory over time, top sites and a flame graph, drawn as inline
// SVG on this side so the page needs no network, no library and (for its content) no script. A
// short script adds the summary line from the embedded JSON and click-to-zoom on the flame graph.
#include <algorithm>
#include <map>
#include <sstream>

#include "trace/report.h"

namespace allocshim::trace {
namespace {

std::string esc(const std::string& s) {
  std::string o;
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

// JSON embedded in <script>: "</" must not appear inside it.
std::string script_safe(std::string s) {
  for (std::size_t i = 0; (i = s.find("</", i)) != std::string::npos; i += 3) s.replace(i, 2, "<\\/");
  return s;
}

const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                          "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

void memory_chart(const Analysis& a, std::ostream& out) {
  constexpr int W = 900, H = 260, L = 70, B = 30;
  std::uint64_t tmax = std::max<std::uint64_t>(a.totals.duration_ns, 1), ymax = 1;
  for (const Series& s : a.series) ymax = std::max(ymax, s.peak);
  out << "<svg id=\"memory\" width=\"" << W << "\" height=\"" << H << "\" role=\"img\">\n";
  out << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W << "\" y2=\"" << H - B
      << "\" stroke=\"#888\"/><line x1=\"" << L << "\" y1=\"0\" x2=\"" << L << "\" y2=\"" << H - B
      << "\" stroke=\"#888\"/>\n";
  out << "<text x=\"2\" y=\"12\" class=\"axis\">" << esc(format_bytes(ymax)) << "</text>";
  out << "<text x=\"" << W - 80 << "\" y=\"" << H - 8 << "\" class=\"axis\">" << esc(format_ns(tmax))
      << "</text>\n";
  int i = 0;
  for (const Series& s : a.series) {
    const char* color = kPalette[i++ % 10];
    out << "<polyline class=\"series\" fill=\"none\" stroke=\"" << color << "\" points=\"";
    std::uint64_t prev = 0;
    bool first = true;
    for (const Point& p : s.points) {
      const double x = L + static_cast<double>(p.t_ns) * (W - L) / static_cast<double>(tmax);
      const double y0 = (H - B) - static_cast<double>(prev) * (H - B - 10) / static_cast<double>(ymax);
      const double y = (H - B) - static_cast<double>(p.bytes) * (H - B - 10) / static_cast<double>(ymax);
      if (!first) out << x << "," << y0 << " ";  // steps: the level holds until the next event
      out << x << "," << y << " ";
      prev = p.bytes;
      first = false;
    }
    const std::string label = "pid " + std::to_string(a.traces[s.process].process.pid) + " device " +
                              std::to_string(s.device) + " " + s.backend_name;
    out << "\"><title>" << esc(label) << " (peak " << esc(format_bytes(s.peak)) << ")</title></polyline>\n";
    out << "<text x=\"" << L + 10 << "\" y=\"" << 14 * i << "\" fill=\"" << color
        << "\" class=\"legend\">" << esc(label) << "</text>\n";
  }
  out << "</svg>\n";
}

struct Node {
  std::string name;
  std::uint64_t value = 0;
  std::map<std::string, Node> children;
};

void flame_rects(const Node& n, double x, int depth, double scale, std::ostream& out, int& count) {
  constexpr int kRow = 18;
  const double w = static_cast<double>(n.value) * scale;
  if (w < 0.5) return;
  if (depth >= 0) {
    const std::size_t h = std::hash<std::string>{}(n.name);
    out << "<g class=\"frame\"><title>" << esc(n.name) << " (" << n.value << ")</title><rect x=\"" << x
        << "\" y=\"" << depth * kRow << "\" width=\"" << w << "\" height=\"" << kRow - 1
        << "\" fill=\"hsl(" << (h % 50) + 10 << ",80%," << 55 + (h >> 8) % 15 << "%)\"/>";
    if (w > 40)
      out << "<text x=\"" << x + 3 << "\" y=\"" << depth * kRow + 13 << "\">"
          << esc(n.name.substr(0, static_cast<std::size_t>(w / 7))) << "</text>";
    out << "</g>\n";
    ++count;
  }
  for (const auto& [name, child] : n.children) {
    flame_rects(child, x, depth + 1, scale, out, count);
    x += static_cast<double>(child.value) * scale;
  }
}

int depth_of(const Node& n) {
  int d = 0;
  for (const auto& [k, c] : n.children) d = std::max(d, depth_of(c));
  return d + 1;
}

void flame_graph(const Analysis& a, const ReportOptions& o, std::ostream& out) {
  Node root;
  for (const Site* s : a.top(o.sort, 0)) {
    const std::uint64_t v = metric_value(*s, o.sort);
    root.value += v;
    Node* n = &root;
    if (s->frames.empty()) {
      n = &n->children["[no stack]"];
      n->name = "[no stack]";
      n->value += v;
    }
    for (auto it = s->frames.rbegin(); it != s->frames.rend(); ++it) {
      const std::string name = it->label();
      n = &n->children[name];
      n->name = name;
      n->value += v;
    }
  }
  constexpr int W = 1200;
  const int rows = depth_of(root);
  out << "<svg id=\"flame\" width=\"" << W << "\" height=\"" << rows * 18 << "\">\n";
  int count = 0;
  if (root.value) flame_rects(root, 0, -1, static_cast<double>(W) / static_cast<double>(root.value), out, count);
  out << "</svg>\n";
}

void sites_table(const Analysis& a, const ReportOptions& o, std::ostream& out) {
  out << "<table id=\"sites\"><thead><tr><th>#</th><th>bytes</th><th>calls</th><th>held at peak</th>"
         "<th>call time</th><th>temporary</th><th>site</th></tr></thead><tbody>\n";
  std::size_t n = 0;
  for (const Site* s : a.top(o.sort, o.top)) {
    out << "<tr><td>" << ++n << "</td><td data-v=\"" << s->bytes << "\">" << esc(format_bytes(s->bytes))
        << "</td><td data-v=\"" << s->calls << "\">" << s->calls << "</td><td data-v=\"" << s->held_at_peak
        << "\">" << esc(format_bytes(s->held_at_peak)) << "</td><td data-v=\"" << s->time_ns << "\">"
        << esc(format_ns(s->time_ns)) << "</td><td data-v=\"" << s->temporaries << "\">" << s->temporaries
        << "</td><td class=\"site\">";
    if (s->frames.empty()) out << "[no stack]";
    for (std::size_t i = 0; i < s->frames.size() && i < o.frames; ++i)
      out << (i ? "<br>" : "") << esc(s->frames[i].label());
    out << "</td></tr>\n";
  }
  out << "</tbody></table>\n";
}

const char* kStyle = R"(body{font-family:sans-serif;margin:20px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ccc;padding:3px 6px;vertical-align:top}
th{background:#f0f0f0;cursor:pointer}td.site{font-family:monospace}
.axis,.legend{font-size:11px}#flame text{font-size:11px;font-family:monospace;pointer-events:none}
.warning{color:#a00})";

const char* kScript = R"(
(function () {
  var data = JSON.parse(document.getElementById('report-data').textContent);
  var t = data.totals;
  function bytes(b) { var u = ['B','KiB','MiB','GiB','TiB'], i = 0;
    while (b >= 1024 && i < 4) { b /= 1024; i++; } return (i ? b.toFixed(1) : b) + ' ' + u[i]; }
  document.getElementById('summary').textContent =
    t.allocs + ' allocations (' + bytes(t.bytes) + '), ' + t.frees + ' frees, ' + t.failures +
    ' failed; peak ' + bytes(t.peak_live) + '; ' + t.temporaries + ' temporary';
  // Sort the table by a column on click.
  document.querySelectorAll('#sites th').forEach(function (th, col) {
    th.addEventListener('click', function () {
      var body = document.querySelector('#sites tbody');
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) { return (+b.cells[col].dataset.v || 0) - (+a.cells[col].dataset.v || 0); });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
  document.body.setAttribute('data-ready', 'yes');
})();
)";

}  // namespace

void write_html(const Analysis& a, const ReportOptions& o, std::ostream& out) {
  std::ostringstream json;
  write_json(a, o, json);
  out << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>allocshim report</title>\n<style>"
      << kStyle << "</style></head><body>\n<h1>allocshim report</h1>\n";
  out << "<p id=\"processes\">";
  for (const Trace& t : a.traces)
    out << "pid " << t.process.pid << ": " << esc(t.process.exe.empty() ? t.path : t.process.exe) << "<br>";
  out << "</p>\n<p id=\"summary\"></p>\n";
  for (const std::string& w : a.warnings) out << "<p class=\"warning\">warning: " << esc(w) << "</p>\n";
  out << "<h2>Memory over time</h2>\n";
  memory_chart(a, out);
  out << "<h2>Top sites by " << metric_name(o.sort) << "</h2>\n";
  sites_table(a, o, out);
  out << "<h2>Flame graph (" << metric_name(o.sort) << ")</h2>\n";
  flame_graph(a, o, out);
  out << "<script type=\"application/json\" id=\"report-data\">" << script_safe(json.str())
      << "</script>\n<script>" << kScript << "</script>\n</body></html>\n";
}

}  // namespace allocshim::trace
