// Replaying traces against a policy (see replay.h).
#include "analysis/replay.h"

#include <time.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <ostream>
#include <unordered_map>

#include "core/core.h"
#include "base/human.h"
#include "base/clock.h"

namespace allocshim::analysis {
namespace {}  // namespace

double ReplayResult::fragmentation() const {
  if (peak_reserved == 0) return 0;
  return 1.0 - static_cast<double>(std::min(live_at_peak_reserved, peak_reserved)) /
                   static_cast<double>(peak_reserved);
}

void Durations::add(std::uint32_t ns) {
  ++count;
  sum += ns;
  if (samples.size() < kMaxSamples) {
    samples.push_back(ns);
    return;
  }
  // Reservoir sampling: each operation so far stays in the sample with the same probability.
  rng += 0x9e3779b97f4a7c15ull;
  std::uint64_t z = rng;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const std::uint64_t j = z % count;
  if (j < kMaxSamples) samples[static_cast<std::size_t>(j)] = ns;
}

std::uint32_t Durations::percentile(double p) const {
  if (samples.empty()) return 0;
  std::vector<std::uint32_t> v = samples;
  const auto at = v.begin() + static_cast<std::ptrdiff_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), at, v.end());
  return *at;
}

Replayer::Replayer(const Driver& driver, const policy::Policy& policy, std::size_t max_live)
    : driver_(driver), max_live_(max_live) {
  r_.policy_source = policy.source;
  driver.init(0);
  if (driver.device_get_count(&devices_) != res::ok || devices_ < 1) devices_ = 1;
  contexts_.assign(static_cast<std::size_t>(devices_), nullptr);
  for (int d = 0; d < devices_; ++d)
    driver.primary_ctx_retain(&contexts_[static_cast<std::size_t>(d)], d);
  driver.ctx_set_current(contexts_[0]);
  core_ = std::make_unique<Core>(driver, policy);
  r_.error = core_->error();
  t_start_ = clock::now_ns();
}

Replayer::~Replayer() = default;

void Replayer::step(const Event& e) {
  if (!stopped_.empty()) return;
  if (e.kind != EventKind::alloc && e.kind != EventKind::alloc_fail && e.kind != EventKind::free)
    return;
  Core& core = *core_;
  const int device = e.device >= 0 && e.device < devices_ ? e.device : 0;
  if (device != current_) {
    driver_.ctx_set_current(contexts_[static_cast<std::size_t>(device)]);
    current_ = device;
  }
  const std::uint64_t key = (static_cast<std::uint64_t>(e.process) << 52) ^ e.addr;
  if (e.kind == EventKind::free) {
    auto it = live_.find(key);
    if (it == live_.end()) return;  // allocated before tracing started, or failed in replay
    FreeRequest fr;
    fr.async = e.flags & trace::kFreeAsync;
    const std::uint64_t t0 = clock::now_ns();
    core.free(it->second.first, fr);
    r_.free_ns.add(
        static_cast<std::uint32_t>(std::min<std::uint64_t>(clock::now_ns() - t0, UINT32_MAX)));
    ++r_.frees;
    live_bytes_ -= it->second.second;
    live_.erase(it);
    return;
  }
  if (live_.size() >= max_live_) {
    stopped_ = "more than " + std::to_string(max_live_) +
               " allocations live at once, at the allocation of " + std::to_string(e.size) +
               " bytes at " + std::to_string(e.time_ns) +
               " ns (trace clock): replay keeps each live allocation in memory; stopped there "
               "(--max-live raises the limit)";
    stopped_process_ = e.process;
    return;
  }
  if (e.kind == EventKind::alloc_fail) ++r_.trace_failures;
  AllocRequest req;
  req.size = e.size;
  req.api = static_cast<Api>(e.api < kApiCount ? e.api : 0);
  if (req.api == Api::host || req.api == Api::create || req.api == Api::pitch) req.api = Api::alloc;
  DevPtr ptr = 0;
  const std::uint64_t t0 = clock::now_ns();
  const Result res = core.alloc(req, &ptr);
  r_.alloc_ns.add(
      static_cast<std::uint32_t>(std::min<std::uint64_t>(clock::now_ns() - t0, UINT32_MAX)));
  ++r_.allocs;
  if (res != res::ok) {
    ++r_.failures;
    return;
  }
  if (e.kind == EventKind::alloc_fail) ++r_.recovered;
  // A block that failed in the trace has no free there: it stays until the end.
  const std::uint64_t k = e.kind == EventKind::alloc ? key : (1ull << 63) | ++synthetic_;
  live_[k] = {ptr, e.size};
  live_bytes_ += e.size;
  r_.peak_live = std::max(r_.peak_live, live_bytes_);
  std::uint64_t reserved = 0;
  for (std::size_t b = 0; b < core.backend_count(); ++b)
    for (int d = 0; d < devices_; ++d) reserved += core.backend(b).reserved(d);
  if (reserved > r_.peak_reserved) {
    r_.peak_reserved = reserved;
    r_.live_at_peak_reserved = live_bytes_;
  }
}

ReplayResult Replayer::finish() {
  r_.wall_ns = clock::now_ns() - t_start_;
  for (const auto& [k, v] : live_) core_->free(v.first, FreeRequest{});
  live_.clear();
  driver_.ctx_synchronize();
  return std::move(r_);
}

ReplayResult replay(const std::vector<Trace>& traces, const Driver& driver,
                    const policy::Policy& policy) {
  std::vector<Event> events;
  for (std::uint32_t p = 0; p < traces.size(); ++p)
    for (Event e : traces[p].events) {
      e.process = p;
      events.push_back(e);
    }
  std::stable_sort(events.begin(), events.end(),
                   [](const Event& a, const Event& b) { return a.time_ns < b.time_ns; });
  Replayer replayer(driver, policy);
  for (const Event& e : events) replayer.step(e);
  ReplayResult r = replayer.finish();
  if (!replayer.stopped().empty()) r.error = replayer.stopped();
  return r;
}

void write_replay_text(const ReplayResult& r, std::ostream& out) {
  out << "replay against " << r.policy_source << "\n";
  if (!r.error.empty()) out << "warning: " << r.error << "\n";
  out << "allocations: " << r.allocs << ", frees: " << r.frees << ", failed: " << r.failures
      << " (the trace had " << r.trace_failures << "; " << r.recovered << " of those served now)\n";
  out << "alloc: median " << format_ns(r.alloc_ns.percentile(0.5)) << ", p99 "
      << format_ns(r.alloc_ns.percentile(0.99)) << ", mean "
      << format_ns(static_cast<std::uint64_t>(r.alloc_ns.mean())) << "\n";
  out << "free:  median " << format_ns(r.free_ns.percentile(0.5)) << ", p99 "
      << format_ns(r.free_ns.percentile(0.99)) << ", mean "
      << format_ns(static_cast<std::uint64_t>(r.free_ns.mean())) << "\n";
  char frag[16];
  std::snprintf(frag, sizeof frag, "%.1f%%", 100.0 * r.fragmentation());
  out << "peak reserved: " << human_bytes(r.peak_reserved) << " (program's peak "
      << human_bytes(r.peak_live) << "; fragmentation at peak reserved " << frag << ")\n";
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
  j["alloc_ns"] = {{"median", r.alloc_ns.percentile(0.5)},
                   {"p99", r.alloc_ns.percentile(0.99)},
                   {"mean", r.alloc_ns.mean()}};
  j["free_ns"] = {{"median", r.free_ns.percentile(0.5)},
                  {"p99", r.free_ns.percentile(0.99)},
                  {"mean", r.free_ns.mean()}};
  j["peak_reserved"] = r.peak_reserved;
  j["peak_live"] = r.peak_live;
  j["fragmentation"] = r.fragmentation();
  j["wall_ns"] = r.wall_ns;
  out << j.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
}

}  // namespace allocshim::analysis
