// The table report and collapsed stacks (see report.h).
#include <algorithm>
#include <cstdio>
#include <set>

#include "base/human.h"
#include "analysis/report.h"

namespace allocshim::analysis {
namespace {

std::string rpad(const std::string& s, std::size_t w) {
  return s.size() >= w ? s : std::string(w - s.size(), ' ') + s;
}
std::string percent(std::uint64_t part, std::uint64_t whole) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%",
                whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
  return buf;
}

const char* section_title(Metric m) {
  switch (m) {
    case Metric::bytes: return "bytes allocated";
    case Metric::calls: return "allocation calls";
    case Metric::peak: return "bytes held at the peak";
    case Metric::time: return "time inside allocation calls";
    case Metric::temporary:
      return "temporary allocations (freed before the thread's next allocation)";
  }
  return "";
}

void header(const Analysis& a, std::ostream& out) {
  const Totals& t = a.totals;
  std::set<std::uint32_t> pids;
  for (const Trace& tr : a.traces) pids.insert(tr.process.pid ? tr.process.pid : tr.header.pid);
  out << "allocshim report: " << a.traces.size() << (a.traces.size() == 1 ? " trace" : " traces")
      << " (pid";
  if (pids.size() > 1) out << "s";
  bool first = true;
  for (std::uint32_t p : pids) out << (first ? " " : ", ") << p, first = false;
  out << "), " << format_ns(t.duration_ns) << "\n";
  for (const std::string& w : a.warnings) out << "warning: " << w << "\n";
  out << "allocations: " << t.allocs << " (" << human_bytes(t.bytes) << "), frees: " << t.frees
      << ", failed: " << t.failures << ", out of memory: " << t.ooms
      << ", migrations: " << t.migrations << ", spilled: " << t.spills << "\n";
  out << "peak live: " << human_bytes(t.peak_live) << " at " << format_ns(t.peak_t_ns) << "\n";
  out << "time in allocation calls: " << format_ns(t.alloc_time_ns);
  if (t.allocs) out << " (" << format_ns(t.alloc_time_ns / t.allocs) << " per call)";
  out << ", in frees: " << format_ns(t.free_time_ns) << "\n";
  out << "temporary allocations: " << t.temporaries << " (" << percent(t.temporaries, t.allocs)
      << " of allocations)\n";
  if (t.sample > 1)
    out << "stacks sampled 1 in " << t.sample << ": per-site figures are scaled estimates\n";
  if (t.unmatched_frees)
    out << "frees of allocations made before tracing started: " << t.unmatched_frees << "\n";
}

void section(const Analysis& a, const ReportOptions& o, Metric m, std::ostream& out) {
  const std::vector<const Site*> sites = a.top(m, o.top);
  out << "\nTop " << sites.size() << " sites by " << section_title(m) << ":\n";
  if (sites.empty()) {
    out << "  (none)\n";
    return;
  }
  out << "  " << rpad("#", 3) << "  " << rpad("bytes", 10) << "  " << rpad("calls", 8) << "  "
      << rpad("at peak", 10) << "  " << rpad("call time", 10) << "  " << rpad("temporary", 9)
      << "  sizes\n";
  std::size_t n = 0;
  for (const Site* s : sites) {
    const std::string sizes = s->min_size == UINT64_MAX ? "-"
                              : s->min_size == s->max_size
                                  ? human_bytes(s->min_size)
                                  : human_bytes(s->min_size) + " .. " + human_bytes(s->max_size);
    out << "  " << rpad(std::to_string(++n), 3) << "  " << rpad(human_bytes(s->bytes), 10) << "  "
        << rpad(std::to_string(s->calls), 8) << "  " << rpad(human_bytes(s->held_at_peak), 10)
        << "  " << rpad(format_ns(s->time_ns), 10) << "  "
        << rpad(std::to_string(s->temporaries), 9) << "  " << sizes;
    if (s->failures) out << "  failed: " << s->failures;
    out << "\n";
    if (s->frames.empty()) out << "       [no stack]\n";
    for (std::size_t i = 0; i < s->frames.size() && i < o.frames; ++i)
      out << "       " << (i == 0 ? "at " : "by ") << s->frames[i].label()
          << (s->frames[i].inlined ? " [inlined]" : "") << "\n";
    if (s->frames.size() > o.frames)
      out << "       ... " << (s->frames.size() - o.frames) << " more frames\n";
  }
}

}  // namespace

bool parse_format(const std::string& s, Format& out) {
  static const std::pair<const char*, Format> kNames[] = {
      {"table", Format::table},
      {"collapsed", Format::collapsed},
      {"speedscope", Format::speedscope},
      {"perfetto", Format::perfetto},
      {"chrome", Format::perfetto},
      {"json", Format::json},
      {"html", Format::html},
      {"memory-snapshot", Format::memory_snapshot}};
  for (const auto& [name, f] : kNames)
    if (s == name) return out = f, true;
  return false;
}

std::string valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = byte(i);
    // Length of the sequence `c` starts, and the range its second byte must be in (which excludes
    // overlong forms, surrogates and code points above U+10FFFF).
    std::size_t n = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c < 0x80)
      n = 1;
    else if (c >= 0xc2 && c <= 0xdf)
      n = 2;
    else if (c >= 0xe0 && c <= 0xef)
      n = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4)
      n = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    bool ok = n > 0 && i + n <= s.size();
    for (std::size_t k = 1; ok && k < n; ++k) {
      const unsigned char b = byte(i + k);
      ok = k == 1 ? b >= lo && b <= hi : b >= 0x80 && b <= 0xbf;
    }
    if (ok) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xef\xbf\xbd";  // U+FFFD
      ++i;
    }
  }
  return out;
}

void write_table(const Analysis& a, const ReportOptions& o, std::ostream& out) {
  header(a, out);
  if (o.sorted) {
    section(a, o, o.sort, out);
    return;
  }
  for (Metric m : {Metric::bytes, Metric::calls, Metric::peak, Metric::time, Metric::temporary})
    section(a, o, m, out);
}

// flamegraph.pl input: root;...;leaf weight. ';' inside names would split frames: replaced.
void write_collapsed(const Analysis& a, const ReportOptions& o, std::ostream& out) {
  for (const Site* s : a.top(o.sort, 0)) {
    std::string line;
    for (auto it = s->frames.rbegin(); it != s->frames.rend(); ++it) {
      std::string name = it->label();
      std::replace(name.begin(), name.end(), ';', ':');
      line += (line.empty() ? "" : ";") + name;
    }
    if (line.empty()) line = "[no stack]";
    out << line << " " << metric_value(*s, o.sort) << "\n";
  }
}

void write_report(Format f, const Analysis& a, const ReportOptions& o, std::ostream& out) {
  switch (f) {
    case Format::table: return write_table(a, o, out);
    case Format::collapsed: return write_collapsed(a, o, out);
    case Format::speedscope: return write_speedscope(a, o, out);
    case Format::perfetto: return write_perfetto(a, o, out);
    case Format::json: return write_json(a, o, out);
    case Format::html: return write_html(a, o, out);
    case Format::memory_snapshot: return write_memory_snapshot(a, o, out);
  }
}

}  // namespace allocshim::analysis
