// Rule matching, on the allocation path: a linear scan with three integer tests per rule, the
// callsite glob only for rules that have one. No allocation, no locks.
#include "policy/glob.h"
#include "policy/policy.h"
#include "policy/size.h"

namespace allocshim::policy {
namespace {

// Why `r` does not match; empty when it does.
std::string mismatch(const Rule& r, std::uint64_t size, Api api, int device,
                     std::string_view callsite) {
  if (size < r.size_min || size > r.size_max) {
    const std::string cond = format_size_range(r.size_min, r.size_max);
    return "size " + format_size(size) + " is not " +
           (cond.find("..") != std::string::npos ? "in " + cond : cond);
  }
  if (!(r.api_mask & (1u << static_cast<unsigned>(api))))
    return std::string("api ") + api_name(api) + " is not listed";
  const bool device_ok =
      r.device_mask == ~0ull ||
      (device >= 0 && device < static_cast<int>(kMaxDevices) && (r.device_mask >> device) & 1);
  if (!device_ok) return "device " + std::to_string(device) + " is not listed";
  if (!r.callsite.empty() && !callsite_match(r.callsite, callsite))
    return callsite.empty() ? "no call stack to match \"" + r.callsite + "\""
                            : "no frame matches \"" + r.callsite + "\"";
  return {};
}

std::string describe(const Rule& r) {
  std::string out;
  auto add = [&](const std::string& s) { out += (out.empty() ? "" : ", ") + s; };
  if (const std::string s = format_size_range(r.size_min, r.size_max); !s.empty()) add("size " + s);
  if (r.api_mask != ~0u) {
    std::string apis;
    for (int a = 0; a < kApiCount; ++a) {
      if (!(r.api_mask & (1u << a))) continue;
      if (!apis.empty()) apis += ',';
      apis += api_name(static_cast<Api>(a));
    }
    add("api " + apis);
  }
  if (r.device_mask != ~0ull) {
    std::string devs;
    for (int d = 0; d < static_cast<int>(kMaxDevices); ++d) {
      if (!((r.device_mask >> d) & 1)) continue;
      if (!devs.empty()) devs += ',';
      devs += std::to_string(d);
    }
    add("device " + devs);
  }
  if (!r.callsite.empty()) add("callsite \"" + r.callsite + "\"");
  return out.empty() ? "matches everything" : out;
}

}  // namespace

namespace {
// The one rule scan. `frames_match(i, rule)` says whether rule i's callsite glob matches the
// allocating stack; it is asked only for rules whose size, api and device already match.
template <class FramesMatch>
Decision scan(const Policy& p, std::uint64_t size, Api api, int device, FramesMatch frames_match) {
  const std::uint32_t api_bit = 1u << static_cast<unsigned>(api);
  // A device id past the mask matches only rules that name no device.
  const std::uint64_t device_bit =
      (device >= 0 && device < static_cast<int>(kMaxDevices)) ? 1ull << device : 0;
  const int n = static_cast<int>(p.rules.size());
  for (int i = 0; i < n; ++i) {
    const Rule& r = p.rules[static_cast<std::size_t>(i)];
    if (size < r.size_min || size > r.size_max) continue;
    if (!(r.api_mask & api_bit)) continue;
    if (!(r.device_mask & device_bit) && r.device_mask != ~0ull) continue;
    if (!r.callsite.empty() && !frames_match(i, r)) [[unlikely]]
      continue;
    return Decision{r.backend >= 0 ? r.backend : p.default_backend,
                    r.free_sync.value_or(p.default_free_sync), i};
  }
  return Decision{p.default_backend, p.default_free_sync, -1};
}
}  // namespace

Decision match(const Policy& p, std::uint64_t size, Api api, int device,
               std::string_view callsite) {
  return scan(p, size, api, device,
              [&](int, const Rule& r) { return callsite_match(r.callsite, callsite); });
}

Decision match_callsite_bits(const Policy& p, std::uint64_t size, Api api, int device,
                             std::uint64_t callsite_bits) {
  return scan(p, size, api, device,
              [&](int i, const Rule&) { return i < 64 && ((callsite_bits >> i) & 1) != 0; });
}

std::string explain(const Policy& p, std::uint64_t size, Api api, int device,
                    std::string_view callsite) {
  const Decision d = match(p, size, api, device, callsite);
  std::string out =
      "size " + format_size(size) + " api " + api_name(api) + " device " + std::to_string(device);
  if (!callsite.empty()) {
    std::string frames(callsite);
    for (std::size_t i = 0; (i = frames.find('\n', i)) != std::string::npos; i += 3)
      frames.replace(i, 1, "\" \"");
    out += " callsite \"" + frames + "\"";
  }
  out += " -> backend ";
  if (d.backend >= 0 && static_cast<std::size_t>(d.backend) < p.backends.size()) {
    const BackendSpec& b = p.backends[static_cast<std::size_t>(d.backend)];
    out += "\"" + b.name + "\" (" + backend_kind_name(b.kind) + ")";
  } else {
    out += '#';
    out += std::to_string(d.backend);
  }
  out += std::string(", free_sync ") + free_sync_name(d.free_sync) + ": ";
  if (d.rule < 0) {
    out += "defaults (no rule matched)";
  } else {
    const Rule& r = p.rules[static_cast<std::size_t>(d.rule)];
    out += "rule " + std::to_string(d.rule + 1) + " at " + p.source + ":" + std::to_string(r.line) +
           ":" + std::to_string(r.column) + " (" + describe(r) + ")";
  }
  out += "\n";
  const std::size_t tried = d.rule < 0 ? p.rules.size() : static_cast<std::size_t>(d.rule);
  for (std::size_t i = 0; i < tried; ++i) {
    const Rule& r = p.rules[i];
    out += "  rule " + std::to_string(i + 1) + " at " + p.source + ":" + std::to_string(r.line) +
           ":" + std::to_string(r.column) +
           " skipped: " + mismatch(r, size, api, device, callsite) + "\n";
  }
  return out;
}

std::uint64_t budget_for(const Budget& b, int device, std::uint64_t device_total) {
  auto share = [&](double percent) {
    return static_cast<std::uint64_t>(static_cast<long double>(device_total) * percent / 100.0L);
  };
  for (const auto& [d, bytes] : b.per_device)
    if (d == device) return bytes;
  for (const auto& [d, percent] : b.per_device_percent)
    if (d == device) return share(percent);
  if (b.percent >= 0) return share(b.percent);
  return b.device;
}

}  // namespace allocshim::policy
