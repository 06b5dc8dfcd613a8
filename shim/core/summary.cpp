// The exit summary (human) and the stats file (JSON). Both are built once at exit, off the hot path,
// from the statistics the backends keep.
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "core/core.h"
#include "base/clock.h"
#include "base/human.h"

namespace allocshim {
namespace {

std::string human_ns(double ns) {
  char buf[32];
  if (ns < 1e3)
    std::snprintf(buf, sizeof buf, "%.0f ns", ns);
  else if (ns < 1e6)
    std::snprintf(buf, sizeof buf, "%.1f us", ns / 1e3);
  else if (ns < 1e9)
    std::snprintf(buf, sizeof buf, "%.1f ms", ns / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.2f s", ns / 1e9);
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
    if (static_cast<double>(seen) >= fraction * static_cast<double>(total))
      return static_cast<double>(2ull << i);
  }
  return static_cast<double>(1ull << kLatencyBuckets);
}

void append_row(std::string& out, const std::string& label, int device, const DeviceStats& d) {
  const std::uint64_t timed =
      d.timed_calls();  // the calls time_ns covers (all of them, or scaled samples)
  const std::uint64_t lookups = d.hits() + d.misses();
  char hit[16] = "-";
  if (lookups)
    std::snprintf(hit, sizeof hit, "%.0f%%",
                  100.0 * static_cast<double>(d.hits()) / static_cast<double>(lookups));
  // "<" appended rather than `"<" + human_ns(...)`, which trips GCC 12's false -Wrestrict at -O3.
  std::string p99 = "<";
  if (timed) p99 += human_ns(quantile_ns(d, 0.99));
  char line[320];
  std::snprintf(
      line, sizeof line,
      "  %-22s %6d %8" PRIu64 " %8" PRIu64 " %6" PRIu64 " %11s %11s %11s %5s %10s %9s %9s\n",
      label.c_str(), device, d.allocs(), d.frees(), d.failures(),
      human_bytes(d.bytes_allocated()).c_str(), human_bytes(d.peak_bytes()).c_str(),
      d.peak_reserved_bytes() ? human_bytes(d.peak_reserved_bytes()).c_str() : "-", hit,
      human_ns(static_cast<double>(d.time_ns())).c_str(),
      timed ? human_ns(static_cast<double>(d.time_ns()) / static_cast<double>(timed)).c_str() : "-",
      timed ? p99.c_str() : "-");
  out += line;
}

using Json = nlohmann::ordered_json;

Json json_devices(const BackendStats& s) {
  Json devices = Json::array();
  for (int dev = 0; dev < static_cast<int>(kMaxDevices); ++dev) {
    const DeviceStats& d = s.device(dev);
    if (d.allocs() == 0 && d.frees() == 0 && d.failures() == 0) continue;
    Json buckets = Json::array();
    for (int i = 0; i < kLatencyBuckets; ++i) buckets.push_back(d.latency_bucket(i));
    Json device{{"device", dev},
                {"allocs", d.allocs()},
                {"frees", d.frees()},
                {"failures", d.failures()},
                {"bytes", d.bytes_allocated()},
                {"peak", d.peak_bytes()},
                {"live", d.live_bytes()},
                {"time_ns", d.time_ns()},
                {"hits", d.hits()},
                {"misses", d.misses()},
                {"reserved", d.reserved_bytes()},
                {"peak_reserved", d.peak_reserved_bytes()},
                {"untimed", d.untimed()},
                {"latency_log2_ns", std::move(buckets)}};
    // What `barrier` frees cost (backends/free_sync.h), where the device had any.
    if (const SyncCounters& c = d.sync();
        c.epochs.load() + c.kept_open.load() + c.drains.load() != 0)
      device["free_sync"] =
          Json{{"epochs", c.epochs.load()},          {"shortage_closes", c.shortage.load()},
               {"kept_open", c.kept_open.load()},    {"events", c.events.load()},
               {"stream_queries", c.queries.load()}, {"close_ns", c.close_ns.load()},
               {"drains", c.drains.load()}};
    devices.push_back(std::move(device));
  }
  return devices;
}

Json json_budget(const Budget& budget) {
  Json out = Json::array();
  for (int dev = 0; dev < static_cast<int>(kMaxDevices); ++dev) {
    const Budget::DeviceReport r = budget.device_report(dev);
    if (r.limit == policy::kUnlimited && r.spilled_allocs == 0 && r.refused == 0) continue;
    out.push_back(Json{{"device", dev},
                       {"limit", r.limit == policy::kUnlimited ? 0 : r.limit},
                       {"peak_backed", r.peak_backed},
                       {"spilled_allocs", r.spilled_allocs},
                       {"spilled_bytes", r.spilled_bytes},
                       {"promoted_bytes", r.promoted_bytes},
                       {"promotions", r.promotions},
                       {"demoted_bytes", r.demoted_bytes},
                       {"demotions", r.demotions},
                       {"migrate_ns", r.migrate_ns},
                       {"move_failures", r.move_failures},
                       {"shim_syncs", r.shim_syncs},
                       {"skipped_busy", r.skipped_busy},
                       {"reserve_bytes", r.reserve_bytes},
                       {"reserve_peak", r.reserve_peak},
                       {"reserve_hits", r.reserve_hits},
                       {"reserve_misses", r.reserve_misses},
                       {"ahead_bytes", r.ahead_bytes},
                       {"ahead_peak", r.ahead_peak},
                       {"ahead_pinned", r.ahead_pinned},
                       {"ahead_used", r.ahead_used},
                       {"ahead_returned", r.ahead_returned},
                       {"refused", r.refused}});
  }
  return out;
}

// Every movable allocation, in allocation order: [device, base, device bytes, host bytes, seq,
// uses, epochs used in, last epoch, rate x16, share rate, host cost (HostCost::kPrior: one
// crossing of the link per use; 0: never timed), and in the learned step: uses, first and last
// position, longest idle stretch's start and length, place over the step
// (Migration::place_over_step)].
Json json_movable(const Migration& m) {
  Json out = Json::array();
  for (int dev = 0; dev < static_cast<int>(kMaxDevices); ++dev) {
    std::vector<Migration::Listed> v = m.listing(dev);
    std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.seq < y.seq; });
    for (const Migration::Listed& l : v)
      out.push_back(Json::array(
          {dev, l.base, l.device_bytes, l.host_bytes, l.seq, l.uses, l.epochs, l.last_epoch, l.rate,
           l.share_rate, l.cost, l.step_uses, l.step_first, l.step_last, l.idle_from, l.idle_len,
           Migration::place_over_step(l.step_bins, l.device_bytes, l.host_bytes)}));
  }
  return out;
}

// The learned step (placement/step.h); `epoch` 0: no recording ended yet.
Json json_step(const Migration& m) {
  std::uint64_t epoch = 0;
  const LearnedStep s = m.learned_step(&epoch);
  return Json{{"epoch", epoch},
              {"repeats", s.repeats},
              {"submissions", s.launches},
              {"synchronizations", s.safe_points},
              {"steps_recorded", s.steps},
              {"match_permille", s.match},
              {"submitted_ns", clock::to_ns(s.ticks)},
              {"allocations_named", s.profiles.size()}};
}

// Launch-aware migration (placement/migration.h): the gate, the scans, the decisions.
Json json_migration(const Migration& m) {
  const Migration::Counts c = m.counts();
  return Json{{"submissions", c.gate.submissions},
              {"gate_waits", c.gate.waits},
              {"gate_closes", c.gate.closes},
              {"gate_timeouts", c.gate_timeouts + c.gate.close_timeouts},
              {"launches_scanned", c.uses.launches},
              {"unknown_layouts", c.uses.unknown_layout},
              {"functions", c.uses.functions},
              {"layout_misses", c.uses.layout_misses},
              {"epoch", c.epoch},
              {"rebalances", c.rebalances},
              {"rebalance_bytes", c.rebalance_bytes},
              {"regrets", c.regrets},
              {"swap_factor", c.factor},
              {"ahead", c.ahead},
              {"ahead_bytes", c.ahead_bytes},
              {"ahead_declined", c.ahead_declined},
              {"trials", c.trials},
              {"trials_explored", c.explored},
              {"trials_kept", c.kept},
              {"trials_undone", c.undone},
              {"trials_abandoned", c.abandoned},
              {"trial_bytes", c.trial_bytes},
              {"launches_timed", c.host_cost.timed},
              {"launches_measured", c.host_cost.measured},
              {"step", json_step(m)},
              {"allocations", json_movable(m)}};
}

// The shared budget's side of this process (docs/oversubscription.md, "One budget per GPU across
// processes").
Json json_node(const NodeBudget& node) {
  Json devices = Json::array();
  for (const NodeBudget::DeviceReport& r : node.device_reports())
    devices.push_back(Json{{"device", r.device},
                           {"lease", r.lease},
                           {"peak_lease", r.peak_lease},
                           {"grows", r.grows},
                           {"asks", r.asks},
                           {"waits", r.waits},
                           {"wait_ns", r.wait_ns},
                           {"timeouts", r.timeouts},
                           {"requests", r.requests},
                           {"given_bytes", r.given_bytes},
                           {"pieces_sent_bytes", r.pieces_sent},
                           {"pieces_received_bytes", r.pieces_received}});
  return Json{{"share", node.share_name()},
              {"joined", node.joined()},
              {"reclaimed_processes", node.reclaimed_processes()},
              {"reclaimed_bytes", node.reclaimed_bytes()},
              {"lock_timeouts", node.lock_timeouts()},
              {"damaged", node.damaged()},
              {"devices", std::move(devices)}};
}

const char* priority_name(policy::Compute::Priority p) {
  switch (p) {
    case policy::Compute::Priority::low: return "low";
    case policy::Compute::Priority::normal: return "normal";
    case policy::Compute::Priority::high: return "high";
  }
  return "?";
}

// GPU time slices ([compute], node/compute_share.h).
Json json_compute(const policy::Compute& c, const ComputeShare::Report& r) {
  return Json{{"share_permille", c.share_permille},
              {"priority", priority_name(c.priority)},
              {"period_ms", c.period_ms},
              {"active", r.active},
              {"region", r.region},
              {"slices", r.slices},
              {"used_ns", r.used_ns},
              {"waited_ns", r.waited_ns},
              {"drain_overruns", r.drain_overruns},
              {"taken_over", r.taken_over}};
}

std::string compute_summary(const policy::Compute& c, const ComputeShare::Report& r) {
  char line[320];
  if (!r.active) {
    std::snprintf(line, sizeof line, "  compute: share %.1f%%, priority %s: no slices taken\n",
                  c.share_permille / 10.0, priority_name(c.priority));
    return line;
  }
  std::snprintf(line, sizeof line,
                "  compute: share %.1f%%, priority %s: %llu slices, %.2f s in them, work waited "
                "%.2f s; %llu drains past a period, %llu slices taken over\n",
                c.share_permille / 10.0, priority_name(c.priority),
                static_cast<unsigned long long>(r.slices), static_cast<double>(r.used_ns) / 1e9,
                static_cast<double>(r.waited_ns) / 1e9,
                static_cast<unsigned long long>(r.drain_overruns),
                static_cast<unsigned long long>(r.taken_over));
  return line;
}

}  // namespace

std::string Core::summary() const {
  std::string out = "allocshim: pid " + std::to_string(getpid()) + ", policy " + policy().source;
  if (!policy().overrides.empty()) out += ", overridden by " + policy().overrides;
  out += "\n";
  if (!error_.empty()) out += "  (served natively: " + error_ + ")\n";
  char head[256];
  std::snprintf(head, sizeof head, "  %-22s %6s %8s %8s %6s %11s %11s %11s %5s %10s %9s %9s\n",
                "backend", "device", "allocs", "frees", "failed", "bytes", "peak live", "peak rsvd",
                "hits", "time", "mean", "p99");
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
  if (host_stats_.device(0).allocs() != 0)
    append_row(out, "pinned host", -1, host_stats_.device(0));
  for (int dev = 0; dev < static_cast<int>(kMaxDevices); ++dev)
    if (created_stats_.device(dev).allocs() != 0 || created_stats_.device(dev).failures() != 0)
      append_row(out, "program cuMemCreate", dev, created_stats_.device(dev));
  if (!any) out += "  (no device allocations)\n";
  if (!sampled.empty())
    out += "  time, mean and p99 of " + sampled + ": about 1 call in " +
           std::to_string(kSampleMean) + " per thread is timed, scaled to all calls\n";
  by_api[static_cast<int>(Api::host)] += host_stats_.api_calls(Api::host);
  by_api[static_cast<int>(Api::create)] += created_stats_.api_calls(Api::create);
  out += "  by api:";
  for (int a = 0; a < kApiCount; ++a)
    out += std::string(a ? ", " : " ") + api_name(static_cast<Api>(a)) + " " +
           std::to_string(by_api[a]);
  out += "\n";
  if (unknown_frees() != 0)
    out += "  frees forwarded for pointers the shim did not allocate: " +
           std::to_string(unknown_frees()) + "\n";
  out += budget_.summary();
  if (policy().compute.enabled) out += compute_summary(policy().compute, compute_.report());
  return out;
}

// Built with nlohmann-json at exit only (never on an allocation path); strings such as the policy
// path may hold any bytes, so invalid UTF-8 is replaced rather than thrown about.
std::string Core::stats_json() const {
  Json out{{"pid", getpid()},
           {"policy", policy().source},
           {"overrides", policy().overrides},
           {"error", error_}};
  std::uint64_t by_api[kApiCount] = {};
  Json backends = Json::array();
  for (std::size_t i = 0; i < backend_count(); ++i) {
    const Backend& b = *backends_[i];
    for (int a = 0; a < kApiCount; ++a) by_api[a] += b.stats().api_calls(static_cast<Api>(a));
    backends.push_back(Json{{"name", b.name()},
                            {"kind", backend_kind_name(b.kind())},
                            {"latency_sampled", b.timing_sampled()},
                            {"devices", json_devices(b.stats())}});
  }
  out["backends"] = std::move(backends);
  by_api[static_cast<int>(Api::host)] += host_stats_.api_calls(Api::host);
  by_api[static_cast<int>(Api::create)] += created_stats_.api_calls(Api::create);
  out["host"] = Json{{"latency_sampled", false}, {"devices", json_devices(host_stats_)}};
  out["created"] = Json{{"latency_sampled", false}, {"devices", json_devices(created_stats_)}};
  Json api = Json::object();
  for (int a = 0; a < kApiCount; ++a) api[api_name(static_cast<Api>(a))] = by_api[a];
  out["api"] = std::move(api);
  out["unknown_frees"] = unknown_frees();
  if (Json budget = json_budget(budget_); !budget.empty()) out["budget"] = std::move(budget);
  if (budget_.migration().active()) out["migration"] = json_migration(budget_.migration());
  if (budget_.node().shared()) out["node"] = json_node(budget_.node());
  if (policy().compute.enabled) out["compute"] = json_compute(policy().compute, compute_.report());
  return out.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace allocshim
