// The normalized TOML form of a policy: every key spelled out with its effective value, in a fixed
// order, so `allocshim check` shows exactly what the shim will do and two policies can be diffed.
// Loading the output gives back the same policy (the tests and the fuzzer check this).
#include "policy/loader.h"
#include "policy/size.h"

namespace allocshim::policy {
namespace {

using detail::toml_quote;

std::string size_or_max(std::uint64_t bytes) {
  return bytes == kUnlimited ? "\"max\"" : toml_quote(format_size(bytes));
}
const char* boolean(bool b) { return b ? "true" : "false"; }

std::string budget_value(std::uint64_t bytes, double percent) {
  if (percent >= 0) return toml_quote(format_percent(percent));
  return bytes == kUnlimited ? "\"unlimited\"" : toml_quote(format_size(bytes));
}

void backend(std::string& out, const BackendSpec& b) {
  out += "\n[backends." + b.name + "]\n";
  out += std::string("kind = \"") + backend_kind_name(b.kind) + "\"\n";
  switch (b.kind) {
    case BackendKind::async_pool:
      out += "release_threshold = " + size_or_max(b.release_threshold) + "\n";
      out += "initial = \"" + format_size(b.initial) + "\"\n";
      if (b.ipc)
        out += std::string("ipc = ") + boolean(*b.ipc) + "\n";  // unset: the device decides
      break;
    case BackendKind::vmm:
      out += "chunk = \"" + format_size(b.chunk) + "\"\n";
      out += "reserve = \"" + format_size(b.reserve) + "\"\n";
      out += "release_threshold = " + size_or_max(b.vmm_release_threshold) + "\n";
      out += "thread_cache = \"" + format_size(b.thread_cache) + "\"\n";
      break;
    case BackendKind::managed: {
      static constexpr const char* kPreferred[] = {"none", "device", "host"};
      out += std::string("read_mostly = ") + boolean(b.read_mostly) + "\n";
      out += std::string("preferred_location = \"") +
             kPreferred[static_cast<int>(b.preferred_location)] + "\"\n";
      out += std::string("accessed_by = ") + boolean(b.accessed_by) + "\n";
      out += std::string("prefetch = ") + boolean(b.prefetch) + "\n";
      out += "stripe = " + (b.stripe == kStripeAuto ? "\"auto\"" : format_float(b.stripe)) + "\n";
      break;
    }
    case BackendKind::host:
      if (b.name != "host") break;  // only [backends.host] takes the spill target's settings
      out += "pin_threads = " + std::to_string(b.pin_threads) + "\n";
      out += "host_reserve = " + toml_quote(format_size(b.host_reserve)) + "\n";
      out += std::string("pin_ahead = ") + boolean(b.pin_ahead) + "\n";
      out += "pin_ahead_idle_ms = " + std::to_string(b.pin_ahead_idle_ms) + "\n";
      break;
    case BackendKind::native: break;
  }
}

void rule(std::string& out, const Policy& p, const Rule& r) {
  out += "\n[[rules]]\n";
  if (const std::string s = format_size_range(r.size_min, r.size_max); !s.empty())
    out += "size = \"" + s + "\"\n";
  if (r.api_mask != ~0u) {
    std::string list;
    for (int a = 0; a < kApiCount; ++a)
      if (r.api_mask & (1u << a))
        list += (list.empty() ? "\"" : ", \"") + std::string(api_name(static_cast<Api>(a))) + "\"";
    out += "api = [" + list + "]\n";
  }
  if (r.device_mask != ~0ull) {
    std::string list;
    for (int d = 0; d < static_cast<int>(kMaxDevices); ++d)
      if ((r.device_mask >> d) & 1) list += (list.empty() ? "" : ", ") + std::to_string(d);
    out += "device = [" + list + "]\n";
  }
  if (!r.callsite.empty()) out += "callsite = " + toml_quote(r.callsite) + "\n";
  if (r.backend >= 0 && static_cast<std::size_t>(r.backend) < p.backends.size())
    out += "backend = " + toml_quote(p.backends[static_cast<std::size_t>(r.backend)].name) + "\n";
  if (r.free_sync) out += std::string("free_sync = \"") + free_sync_name(*r.free_sync) + "\"\n";
}

}  // namespace

std::string to_toml(const Policy& p) {
  static constexpr const char* kSpill[] = {"none", "host", "managed"};
  static constexpr const char* kMigrate[] = {"off", "promote", "auto"};
  static constexpr const char* kShare[] = {"process", "user", "group", "device"};
  static constexpr const char* kPriority[] = {"low", "normal", "high"};
  static constexpr const char* kStacks[] = {"off", "native", "python", "both"};
  static constexpr const char* kLevels[] = {"error", "warn", "info", "debug"};

  std::string source = p.source;
  for (char& c : source)
    if (c == '\n' || c == '\r') c = ' ';
  std::string out = "# allocshim policy, normalized from " + source + "\n";
  out += "version = " + std::to_string(p.version) + "\n";
  out += "\n[defaults]\n";
  if (p.default_backend >= 0 && static_cast<std::size_t>(p.default_backend) < p.backends.size())
    out += "backend = " + toml_quote(p.backends[static_cast<std::size_t>(p.default_backend)].name) +
           "\n";
  out += std::string("free_sync = \"") + free_sync_name(p.default_free_sync) + "\"\n";

  for (const BackendSpec& b : p.backends) backend(out, b);
  for (const Rule& r : p.rules) rule(out, p, r);

  const Budget& b = p.budget;
  out += "\n[budget]\n";
  if (b.per_device.empty() && b.per_device_percent.empty()) {
    out += "device = " + budget_value(b.device, b.percent) + "\n";
  } else {
    out += "device = { default = " + budget_value(b.device, b.percent);
    for (const auto& [d, bytes] : b.per_device)
      out += ", " + std::to_string(d) + " = " + budget_value(bytes, -1.0);
    for (const auto& [d, percent] : b.per_device_percent)
      out += ", " + std::to_string(d) + " = " + budget_value(0, percent);
    out += " }\n";
  }
  out += std::string("spill = \"") + kSpill[static_cast<int>(b.spill)] + "\"\n";
  out += std::string("migrate = \"") + kMigrate[static_cast<int>(b.migrate)] + "\"\n";
  out += std::string("share = \"") + kShare[static_cast<int>(b.share)] + "\"\n";
  out += "share_wait_ms = " + std::to_string(b.share_wait_ms) + "\n";
  out += "idle_sleep_ms = " + std::to_string(b.idle_sleep_ms) + "\n";

  // The section's presence turns slicing on: written only when the policy has it.
  if (const Compute& c = p.compute; c.enabled) {
    out += "\n[compute]\n";
    out += "share = " + toml_quote(format_percent(c.share_permille / 10.0)) + "\n";
    out += std::string("priority = \"") + kPriority[static_cast<int>(c.priority)] + "\"\n";
    out += std::string("scope = \"") + kShare[static_cast<int>(c.scope)] + "\"\n";
    out += "period_ms = " + std::to_string(c.period_ms) + "\n";
  }

  out += "\n[trace]\n";
  out += "path = " + toml_quote(p.trace.path) + "\n";
  out += std::string("stacks = \"") + kStacks[static_cast<int>(p.trace.stacks)] + "\"\n";
  out += "sample = " + std::to_string(p.trace.sample) + "\n";

  out += "\n[log]\n";
  out += std::string("level = \"") + kLevels[static_cast<int>(p.log.level)] + "\"\n";
  out += std::string("summary = ") + boolean(p.log.summary) + "\n";

  out += "\n[reload]\n";
  out += std::string("watch = ") + boolean(p.reload.watch) + "\n";
  out += "interval_ms = " + std::to_string(p.reload.interval_ms) + "\n";
  return out;
}

}  // namespace allocshim::policy
