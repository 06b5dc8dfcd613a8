// The exit summary (human) and the stats file (JSON). Both are built once at exit, off the hot path,
// from the statistics the backends keep.
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <string>

#include "core/core.h"

namespace allocshim {
namespace {

std::string human_bytes(std::uint64_t b) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string human_ns(double ns) {
  char buf[32];
  if (ns < 1e3) std::snprintf(buf, sizeof buf, "%.0f ns", ns);
  else if (ns < 1e6) std::snprintf(buf, sizeof buf, "%.1f us", ns / 1e3);
  else if (ns < 1e9) std::snprintf(buf, sizeof buf, "%.1f ms", ns / 1e6);
  else std::snprintf(buf, sizeof buf, "%.2f s", ns / 1e9);
  return buf;
}

// The upper edge of the log2 bucket below which `fraction` of the calls fall: a latency quantile
// to within a factor of two, which is what a log2 histogram can tell.
double quantile_ns(const DeviceStats& d, double fraction) {
  std::uint64_t total = 0;
  for (int i = 0; i < kLatencyBuckets; ++i) total += d.latency_bucket(i);
  if (total == 0) return 0;
  std::uint64_t seen = 0;
  for (int i = 0; i < kLatencyBuckets; ++i) {
    seen += d.latency_bucket(i);
    if (static_cast<double>(seen) >= fraction * static_cast<double>(total)) return static_cast<double>(2ull << i);
  }
  return static_cast<double>(1ull << kLatencyBuckets);
}

void append_row(std::string& out, const std::string& label, int device, const DeviceStats& d) {
  const std::uint64_t timed = d.timed_calls();  // the calls time_ns covers (all of them, or scaled samples)
  const std::uint64_t lookups = d.hits() + d.misses();
  char hit[16] = "-";
  if (lookups) std::snprintf(hit, sizeof hit, "%.0f%%", 100.0 * static_cast<double>(d.hits()) / static_cast<double>(lookups));
  // "<" appended rather than `"<" + human_ns(...)`, which trips GCC 12's false -Wrestrict at -O3.
  std::string p99 = "<";
  if (timed) p99 += human_ns(quantile_ns(d, 0.99));
  char line[320];
  std::snprintf(line, sizeof line,
                "  %-22s %6d %8" PRIu64 " %8" PRIu64 " %6" PRIu64 " %11s %11s %11s %5s %10s %9s %9s\n",
                label.c_str(), device, d.allocs(), d.frees(), d.failures(),
                human_bytes(d.bytes_allocated()).c_str(), human_bytes(d.peak_bytes()).c_str(),
                d.peak_reserved_bytes() ? human_bytes(d.peak_reserved_bytes()).c_str() : "-", hit,
                human_ns(static_cast<double>(d.time_ns())).c_str(),
                timed ? human_ns(static_cast<double>(d.time_ns()) / static_cast<double>(timed)).c_str() : "-",
                timed ? p99.c_str() : "-");
  out += line;
}

void append_json_devices(std::string& out, const BackendStats& s, bool sampled) {
  out += std::string("\"latency_sampled\":") + (sampled ? "true" : "false") + ",\"devices\":[";
  bool first = true;
  for (int dev = 0; dev < static_cast<int>(kMaxDevices); ++dev) {
    const DeviceStats& d = s.device(dev);
    if (d.allocs() == 0 && d.frees() == 0 && d.failures() == 0) continue;
    char buf[768];
    std::snprintf(buf, sizeof buf,
                  "%s{\"device\":%d,\"allocs\":%" PRIu64 ",\"frees\":%" PRIu64 ",\"failures\":%" PRIu64
                  ",\"bytes\":%" PRIu64 ",\"peak\":%" PRIu64 ",\"live\":%" PRIu64 ",\"time_ns\":%" PRIu64
                  ",\"hits\":%" PRIu64 ",\"misses\":%" PRIu64 ",\"reserved\":%" PRIu64
                  ",\"peak_reserved\":%" PRIu64 ",\"untimed\":%" PRIu64 ",\"latency_log2_ns\":[",
                  first ? "" : ",", dev, d.allocs(), d.frees(), d.failures(), d.bytes_allocated(),
                  d.peak_bytes(), d.live_bytes(), d.time_ns(), d.hits(), d.misses(), d.reserved_bytes(),
                  d.peak_reserved_bytes(), d.untimed());
    out += buf;
    for (int i = 0; i < kLatencyBuckets; ++i) {
      std::snprintf(buf, sizeof buf, "%s%" PRIu64, i ? "," : "", d.latency_bucket(i));
      out += buf;
    }
    out += "]}";
    first = false;
  }
  out += "]";
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

}  // namespace

std::string Core::summary() const {
  std::string out = "allocshim: pid " + std::to_string(getpid()) + ", policy " + policy().source + "\n";
  if (!error_.empty()) out += "  (served natively: " + error_ + ")\n";
  char head[256];
  std::snprintf(head, sizeof head, "  %-22s %6s %8s %8s %6s %11s %11s %11s %5s %10s %9s %9s\n", "backend",
                "device", "allocs", "frees", "failed", "bytes", "peak live", "peak rsvd", "hits", "time",
                "mean", "p99");
  out += head;
  std::uint64_t by_api[kApiCount] = {};
  bool any = false;
  std::string sampled;  // backends whose time and latency are scaled from samples
  for (std::size_t bi = 0; bi < backend_count(); ++bi) {
    const auto& b = backends_[bi];
    for (int a = 0; a < kApiCount; ++a) by_api[a] += b->stats().api_calls(static_cast<Api>(a));
    bool shown = false;
    for (int dev = 0; dev < static_cast<int>(kMaxDevices); ++dev) {
      const DeviceStats& d = b->stats().device(dev);
      if (d.allocs() == 0 && d.failures() == 0 && d.frees() == 0) continue;
      append_row(out, b->name() + " (" + backend_kind_name(b->kind()) + ")", dev, d);
      any = shown = true;
    }
    if (shown && b->timing_sampled()) sampled += (sampled.empty() ? "" : ", ") + b->name();
  }
  if (host_stats_.device(0).allocs() != 0) append_row(out, "pinned host", -1, host_stats_.device(0));
  for (int dev = 0; dev < static_cast<int>(kMaxDevices); ++dev)
    if (created_stats_.device(dev).allocs() != 0)
      append_row(out, "program cuMemCreate", dev, created_stats_.device(dev));
  if (!any) out += "  (no device allocations)\n";
  if (!sampled.empty())
    out += "  time, mean and p99 of " + sampled + ": about 1 call in " + std::to_string(kSampleMean) +
           " per thread is timed, scaled to all calls\n";
  by_api[static_cast<int>(Api::host)] += host_stats_.api_calls(Api::host);
  by_api[static_cast<int>(Api::create)] += created_stats_.api_calls(Api::create);
  out += "  by api:";
  for (int a = 0; a < kApiCount; ++a)
    out += std::string(a ? ", " : " ") + api_name(static_cast<Api>(a)) + " " + std::to_string(by_api[a]);
  out += "\n";
  if (unknown_frees() != 0)
    out += "  frees forwarded for pointers the shim did not allocate: " + std::to_string(unknown_frees()) + "\n";
  out += budget_.summary();
  return out;
}

std::string Core::stats_json() const {
  std::string out = "{\"pid\":" + std::to_string(getpid()) + ",\"policy\":\"" + json_escape(policy().source) +
                    "\",\"error\":\"" + json_escape(error_) + "\",\"backends\":[";
  std::uint64_t by_api[kApiCount] = {};
  for (std::size_t i = 0; i < backend_count(); ++i) {
    const Backend& b = *backends_[i];
    for (int a = 0; a < kApiCount; ++a) by_api[a] += b.stats().api_calls(static_cast<Api>(a));
    out += std::string(i ? "," : "") + "{\"name\":\"" + json_escape(b.name()) + "\",\"kind\":\"" +
           backend_kind_name(b.kind()) + "\",";
    append_json_devices(out, b.stats(), b.timing_sampled());
    out += "}";
  }
  by_api[static_cast<int>(Api::host)] += host_stats_.api_calls(Api::host);
  by_api[static_cast<int>(Api::create)] += created_stats_.api_calls(Api::create);
  out += "],\"host\":{";
  append_json_devices(out, host_stats_, false);
  out += "},\"created\":{";
  append_json_devices(out, created_stats_, false);
  out += "},\"api\":{";
  for (int a = 0; a < kApiCount; ++a)
    out += std::string(a ? "," : "") + "\"" + api_name(static_cast<Api>(a)) + "\":" + std::to_string(by_api[a]);
  out += "},\"unknown_frees\":" + std::to_string(unknown_frees()) + budget_.json() + "}\n";
  return out;
}

}  // namespace allocshim
