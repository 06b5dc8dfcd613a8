// Replaying traces against a policy (see replay.h).
#include "trace/replay.h"

#include <time.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <ostream>
#include <unordered_map>

#include "core/core.h"
#include "core/human.h"

namespace allocshim::trace {
namespace {

std::uint64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

std::uint32_t percentile(std::vector<std::uint32_t> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

double mean(const std::vector<std::uint32_t>& v) {
  double s = 0;
  for (std::uint32_t x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

}  // namespace

double ReplayResult::fragmentation() const {
  if (peak_reserved == 0) return 0;
  return 1.0 - static_cast<double>(std::min(live_at_peak_reserved, peak_reserved)) /
                   static_cast<double>(peak_reserved);
}

ReplayResult replay(const std::vector<Trace>& traces, const Driver& driver, const policy::Policy& policy) {
  ReplayResult r;
  r.policy_source = policy.source;
  driver.init(0);
  int devices = 1;
  if (driver.device_get_count(&devices) != res::ok || devices < 1) devices = 1;
  std::vector<Context> contexts(static_cast<std::size_t>(devices), nullptr);
  for (int d = 0; d < devices; ++d) driver.primary_ctx_retain(&contexts[static_cast<std::size_t>(d)], d);
  int current = 0;
  driver.ctx_set_current(contexts[0]);

  Core core(driver, policy);
  r.error = core.error();

  struct Step {
    const Event* e;
    std::uint32_t process;  // traces of several processes: their addresses are separate spaces
  };
  std::vector<Step> events;
  for (std::uint32_t p = 0; p < traces.size(); ++p)
    for (const Event& e : traces[p].events) events.push_back({&e, p});
  std::stable_sort(events.begin(), events.end(),
                   [](const Step& a, const Step& b) { return a.e->time_ns < b.e->time_ns; });

  // (process, address in the trace) -> (address now, size)
  std::unordered_map<std::uint64_t, std::pair<DevPtr, std::uint64_t>> live;
  std::uint64_t live_bytes = 0, synthetic = 0;
  auto key = [](const Step& s) { return (static_cast<std::uint64_t>(s.process) << 52) ^ s.e->addr; };
  const std::uint64_t t_start = mono_ns();
  for (const Step& step : events) {
    const Event& e = *step.e;
    if (e.kind != EventKind::alloc && e.kind != EventKind::alloc_fail && e.kind != EventKind::free) continue;
    const int device = e.device >= 0 && e.device < devices ? e.device : 0;
    if (device != current) {
      driver.ctx_set_current(contexts[static_cast<std::size_t>(device)]);
      current = device;
    }
    if (e.kind == EventKind::free) {
      auto it = live.find(key(step));
      if (it == live.end()) continue;  // allocated before tracing started, or failed in replay
      FreeRequest fr;
      fr.async = e.flags & kFreeAsync;
      const std::uint64_t t0 = mono_ns();
      core.free(it->second.first, fr);
      r.free_ns.push_back(static_cast<std::uint32_t>(std::min<std::uint64_t>(mono_ns() - t0, UINT32_MAX)));
      ++r.frees;
      live_bytes -= it->second.second;
      live.erase(it);
      continue;
    }
    if (e.kind == EventKind::alloc_fail) ++r.trace_failures;
    AllocRequest req;
    req.size = e.size;
    req.api = static_cast<Api>(e.api < kApiCount ? e.api : 0);
    if (req.api == Api::host || req.api == Api::create || req.api == Api::pitch) req.api = Api::alloc;
    DevPtr ptr = 0;
    const std::uint64_t t0 = mono_ns();
    const Result res = core.alloc(req, &ptr);
    r.alloc_ns.push_back(static_cast<std::uint32_t>(std::min<std::uint64_t>(mono_ns() - t0, UINT32_MAX)));
    ++r.allocs;
    if (res != res::ok) {
      ++r.failures;
      continue;
    }
    if (e.kind == EventKind::alloc_fail) ++r.recovered;
    // A block that failed in the trace has no free there: it stays until the end.
    const std::uint64_t k = e.kind == EventKind::alloc ? key(step) : (1ull << 63) | ++synthetic;
    live[k] = {ptr, e.size};
    live_bytes += e.size;
    r.peak_live = std::max(r.peak_live, live_bytes);
    std::uint64_t reserved = 0;
    for (std::size_t b = 0; b < core.backend_count(); ++b)
      for (int d = 0; d < devices; ++d) reserved += core.backend(b).reserved(d);
    if (reserved > r.peak_reserved) {
      r.peak_reserved = reserved;
      r.live_at_peak_reserved = live_bytes;
    }
  }
  r.wall_ns = mono_ns() - t_start;
  for (const auto& [k, v] : live) core.free(v.first, FreeRequest{});
  driver.ctx_synchronize();
  return r;
}

void write_replay_text(const ReplayResult& r, std::ostream& out) {
  out << "replay against " << r.policy_source << "\n";
  if (!r.error.empty()) out << "warning: " << r.error << "\n";
  out << "allocations: " << r.allocs << ", frees: " << r.frees << ", failed: " << r.failures
      << " (the trace had " << r.trace_failures << "; " << r.recovered << " of those served now)\n";
  out << "alloc: median " << format_ns(percentile(r.alloc_ns, 0.5)) << ", p99 "
      << format_ns(percentile(r.alloc_ns, 0.99)) << ", mean "
      << format_ns(static_cast<std::uint64_t>(mean(r.alloc_ns))) << "\n";
  out << "free:  median " << format_ns(percentile(r.free_ns, 0.5)) << ", p99 "
      << format_ns(percentile(r.free_ns, 0.99)) << ", mean "
      << format_ns(static_cast<std::uint64_t>(mean(r.free_ns))) << "\n";
  char frag[16];
  std::snprintf(frag, sizeof frag, "%.1f%%", 100.0 * r.fragmentation());
  out << "peak reserved: " << human_bytes(r.peak_reserved) << " (program's peak " << human_bytes(r.peak_live)
      << "; fragmentation at peak reserved " << frag << ")\n";
  out << "replay time: " << format_ns(r.wall_ns) << "\n";
}

void write_replay_json(const ReplayResult& r, std::ostream& out) {
  nlohmann::ordered_json j;
  j["policy"] = r.policy_source;
  j["error"] = r.error;
  j["allocs"] = r.allocs;
  j["frees"] = r.frees;
  j["failures"] = r.failures;
  j["trace_failures"] = r.trace_failures;
  j["recovered"] = r.recovered;
  j["alloc_ns"] = {{"median", percentile(r.alloc_ns, 0.5)}, {"p99", percentile(r.alloc_ns, 0.99)}, {"mean", mean(r.alloc_ns)}};
  j["free_ns"] = {{"median", percentile(r.free_ns, 0.5)}, {"p99", percentile(r.free_ns, 0.99)}, {"mean", mean(r.free_ns)}};
  j["peak_reserved"] = r.peak_reserved;
  j["peak_live"] = r.peak_live;
  j["fragmentation"] = r.fragmentation();
  j["wall_ns"] = r.wall_ns;
  out << j.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
}

}  // namespace allocshim::trace
