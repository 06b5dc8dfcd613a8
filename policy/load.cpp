// The policy loader: TOML text -> Policy, with every error located. Sections other than
// [backends] and [[rules]] are read here; see load_backends.cpp and load_rules.cpp for those.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>

#include "policy/loader.h"
#include "policy/size.h"
#include "policy/toml_guard.h"

namespace allocshim::policy {
namespace detail {
namespace {

constexpr std::string_view kRootKeys[] = {"version", "defaults", "backends", "rules", "budget",
                                          "compute", "trace",    "log",      "reload"};
constexpr std::string_view kDefaultsKeys[] = {"backend", "free_sync"};
constexpr std::string_view kFreeSync[] = {"device", "barrier", "none"};
// [budget]'s keys, and those it had before they became settings of the host spill target
// ([backends.host]): each of those gets an error that says where it went, and no "unknown key".
constexpr std::string_view kMovedToHost[] = {"pin_threads", "host_reserve", "pin_ahead",
                                             "pin_ahead_idle_ms"};
constexpr std::string_view kBudgetKeysAndMoved[] = {
    "device",        "spill",       "migrate",      "share",     "share_wait_ms",
    "idle_sleep_ms", "pin_threads", "host_reserve", "pin_ahead", "pin_ahead_idle_ms"};
constexpr std::string_view kSpill[] = {"none", "host", "managed"};
constexpr std::string_view kMigrate[] = {"off", "promote", "auto"};
constexpr std::string_view kShare[] = {"process", "user", "group", "device"};
constexpr std::int64_t kMaxShareWaitMs = 60000;
constexpr std::int64_t kMaxIdleSleepMs = 86400000;
constexpr std::string_view kComputeKeys[] = {"share", "priority", "scope", "period_ms"};
constexpr std::string_view kPriority[] = {"low", "normal", "high"};
constexpr std::string_view kComputeScope[] = {"user", "group", "device"};
constexpr std::int64_t kMinPeriodMs = 10;
constexpr std::int64_t kMaxPeriodMs = 10000;
constexpr std::string_view kTraceKeys[] = {"path", "stacks", "sample"};
constexpr std::string_view kStacks[] = {"off", "native", "python", "both"};
constexpr std::string_view kLogKeys[] = {"level", "summary"};
constexpr std::string_view kLevels[] = {"error", "warn", "info", "debug"};
constexpr std::string_view kReloadKeys[] = {"watch", "interval_ms"};
constexpr int kMaxDeviceId = static_cast<int>(kMaxDevices) - 1;

// A device budget: a size, a percentage of the device's memory, or "unlimited".
struct BudgetValue {
  std::uint64_t bytes = kUnlimited;
  double percent = -1.0;
};
std::optional<BudgetValue> get_budget_value(const toml::node& v, const std::string& key,
                                            Loader& L) {
  BudgetValue out;
  if (const auto* s = v.as_string()) {
    const std::string& t = s->get();
    if (iequals(t, "unlimited")) return out;
    if (t.find('%') != std::string::npos) {
      std::string error;
      if (!parse_percent(t, out.percent, error)) {
        L.report.at(v, "bad percentage " + toml_quote(t) + " for \"" + key + "\": " + error);
        return std::nullopt;
      }
      return out;
    }
  } else if (!v.is_integer()) {
    L.report.at(v, "\"" + key + "\" must be a size such as \"40GiB\", a percentage such as " +
                       "\"60%\", or \"unlimited\", not " + type_name(v));
    return std::nullopt;
  }
  const auto bytes = get_size(v, key, L);
  if (!bytes) return std::nullopt;
  out.bytes = *bytes;
  return out;
}

template <typename T>
void set_entry(std::vector<std::pair<int, T>>& list, int device, T value) {
  for (auto& [d, v] : list)
    if (d == device) {
      v = value;
      return;
    }
  list.emplace_back(device, value);
}
template <typename T>
void erase_entry(std::vector<std::pair<int, T>>& list, int device) {
  std::erase_if(list, [&](const auto& e) { return e.first == device; });
}

void load_budget_devices(const toml::table& t, Loader& L) {
  Budget& b = L.policy.budget;
  for (auto&& [key, value] : t) {
    const std::string_view k = key.str();
    if (k == "default") {
      if (const auto v = get_budget_value(value, "budget.device.default", L)) {
        b.device = v->bytes;
        b.percent = v->percent;
      }
      continue;
    }
    int id = -1;
    const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), id);
    if (ec != std::errc() || end != k.data() + k.size() || id < 0 || id > kMaxDeviceId) {
      L.report.at(key, "bad key \"" + std::string(k) + "\" in [budget.device]: expected a device " +
                           "id (0 to " + std::to_string(kMaxDeviceId) + ") or \"default\"");
      continue;
    }
    const auto v = get_budget_value(value, "budget.device." + std::string(k), L);
    if (!v) continue;
    if (v->percent >= 0) {
      erase_entry(b.per_device, id);
      set_entry(b.per_device_percent, id, v->percent);
    } else {
      erase_entry(b.per_device_percent, id);
      set_entry(b.per_device, id, v->bytes);
    }
  }
  // By device, not by key: "06" and "6" name one device, and the normalized form must load back
  // in the order it was written.
  auto by_device = [](const auto& x, const auto& y) { return x.first < y.first; };
  std::sort(b.per_device.begin(), b.per_device.end(), by_device);
  std::sort(b.per_device_percent.begin(), b.per_device_percent.end(), by_device);
}

void load_trace(const toml::table& t, Loader& L) {
  check_keys(t, kTraceKeys, "in [trace]", L);
  Trace& tr = L.policy.trace;
  if (const auto* v = t.get("path"))
    if (const auto x = get_string(*v, "path", L)) tr.path = *x;
  if (const auto* v = t.get("stacks"))
    if (const auto x = get_enum(*v, "stacks", kStacks, L))
      tr.stacks = static_cast<Trace::Stacks>(*x);
  if (const auto* v = t.get("sample"))
    if (const auto x = get_int(*v, "sample", 1, 1 << 30, L))
      tr.sample = static_cast<std::uint32_t>(*x);
}

void load_log(const toml::table& t, Loader& L) {
  check_keys(t, kLogKeys, "in [log]", L);
  if (const auto* v = t.get("level"))
    if (const auto x = get_enum(*v, "level", kLevels, L))
      L.policy.log.level = static_cast<Log::Level>(*x);
  if (const auto* v = t.get("summary"))
    if (const auto x = get_bool(*v, "summary", L)) L.policy.log.summary = *x;
}

void load_reload(const toml::table& t, Loader& L) {
  check_keys(t, kReloadKeys, "in [reload]", L);
  if (const auto* v = t.get("watch"))
    if (const auto x = get_bool(*v, "watch", L)) L.policy.reload.watch = *x;
  // Below 10 ms the stat calls start to show; above a day nobody is waiting for the reload.
  if (const auto* v = t.get("interval_ms"))
    if (const auto x = get_int(*v, "interval_ms", 10, 86'400'000, L))
      L.policy.reload.interval_ms = static_cast<std::uint32_t>(*x);
}

// Reports a section that is not a table; returns it otherwise.
const toml::table* section(const toml::table& root, std::string_view key, Loader& L) {
  const toml::node* n = root.get(key);
  if (!n) return nullptr;
  if (const auto* t = n->as_table()) return t;
  L.report.at(*n,
              quoted(key) + " must be a table ([" + std::string(key) + "]), not " + type_name(*n));
  return nullptr;
}

// The file's default backend when [defaults] names none: the embedded default policy's, so that a
// file means the embedded default plus what it says (an empty file is no file). A backend of the
// file with that name (`[backends.vmm]`) is the file's tuning of it.
int implicit_default(Loader& L) {
  const Policy& embedded = default_policy();
  const BackendSpec& spec = embedded.backends[static_cast<std::size_t>(embedded.default_backend)];
  if (const int i = L.find_backend(spec.name); i >= 0) return i;
  auto& backends = L.policy.backends;
  backends.push_back(spec);
  return static_cast<int>(backends.size() - 1);
}

}  // namespace

void load_defaults(const toml::table& t, Loader& L) {
  check_keys(t, kDefaultsKeys, "in [defaults]", L);
  if (const auto* v = t.get("backend")) {
    L.default_backend_set = true;  // even when wrong: no second error about an implicit default
    if (const int i = resolve_backend(*v, L); i >= 0) L.policy.default_backend = i;
  }
  if (const auto* v = t.get("free_sync"))
    if (const auto x = get_enum(*v, "free_sync", kFreeSync, L))
      L.policy.default_free_sync = static_cast<FreeSync>(*x);
}

void load_budget(const toml::table& t, Loader& L) {
  for (std::string_view key : kMovedToHost)
    if (const auto* v = t.get(key))
      L.report.at(*v, quoted(key) +
                          " is a setting of the host spill target now: set it in "
                          "[backends.host] (with kind = \"host\")");
  check_keys(t, kBudgetKeysAndMoved, "in [budget]", L);
  Budget& b = L.policy.budget;
  if (const auto* v = t.get("device")) {
    if (const auto* devices = v->as_table()) {
      load_budget_devices(*devices, L);
    } else if (const auto x = get_budget_value(*v, "budget.device", L)) {
      // One value for every device replaces any per-device entries (an override of the file's).
      b.device = x->bytes;
      b.percent = x->percent;
      b.per_device.clear();
      b.per_device_percent.clear();
    }
  }
  if (const auto* v = t.get("spill"))
    if (const auto x = get_enum(*v, "spill", kSpill, L)) b.spill = static_cast<Budget::Spill>(*x);
  if (const auto* v = t.get("migrate"))
    if (const auto x = get_enum(*v, "migrate", kMigrate, L)) {
      b.migrate = static_cast<Budget::Migrate>(*x);
      // Demotion moves device memory to host chunks of the host spill target: without it there is
      // nowhere to move to, and a mode that silently does nothing misleads. ("promote" with spill =
      // "managed" is accepted: the driver migrates managed pages itself.)
      if ((b.migrate == Budget::Migrate::auto_ && b.spill != Budget::Spill::host) ||
          (b.migrate == Budget::Migrate::promote && b.spill == Budget::Spill::none))
        L.report.at(*v,
                    "migrate = \"" + std::string(kMigrate[*x]) +
                        "\" needs spill = \"host\" (memory moves between device and host chunks)");
    }
  if (const auto* v = t.get("share"))
    if (const auto x = get_enum(*v, "share", kShare, L)) b.share = static_cast<Budget::Share>(*x);
  if (const auto* v = t.get("share_wait_ms"))
    if (const auto x = get_int(*v, "share_wait_ms", 0, kMaxShareWaitMs, L))
      b.share_wait_ms = static_cast<std::uint32_t>(*x);
  if (const auto* v = t.get("idle_sleep_ms"))
    if (const auto x = get_int(*v, "idle_sleep_ms", 0, kMaxIdleSleepMs, L)) {
      b.idle_sleep_ms = static_cast<std::uint32_t>(*x);
      // Sleep moves device memory to the host spill target's chunks: without migration there is
      // nothing that can move.
      if (b.idle_sleep_ms != 0 &&
          (b.spill != Budget::Spill::host || b.migrate == Budget::Migrate::off))
        L.report.at(*v,
                    "idle_sleep_ms needs spill = \"host\" and migrate = \"promote\" or \"auto\" "
                    "(sleep moves device memory to the host at the same addresses)");
    }
}

void load_compute(const toml::table& t, Loader& L) {
  check_keys(t, kComputeKeys, "in [compute]", L);
  Compute& c = L.policy.compute;
  c.enabled = true;
  if (const auto* v = t.get("share")) {
    const auto* s = v->as_string();
    double percent = -1.0;
    std::string error;
    if (s == nullptr)
      L.report.at(*v, "bad value for \"share\": expected a percentage such as \"30%\"");
    else if (!parse_percent(s->get(), percent, error))
      L.report.at(*v, "bad percentage " + toml_quote(s->get()) + " for \"share\": " + error);
    else if (percent < 1.0)
      L.report.at(*v, "share " + toml_quote(s->get()) +
                          " is below 1% (a process must get some GPU time to make progress)");
    else
      c.share_permille = static_cast<std::uint32_t>(percent * 10.0 + 0.5);
  }
  if (const auto* v = t.get("priority"))
    if (const auto x = get_enum(*v, "priority", kPriority, L))
      c.priority = static_cast<Compute::Priority>(*x);
  if (const auto* v = t.get("scope"))
    if (const auto x = get_enum(*v, "scope", kComputeScope, L))
      c.scope = static_cast<Budget::Share>(*x + 1);  // kComputeScope is kShare without "process"
  if (const auto* v = t.get("period_ms"))
    if (const auto x = get_int(*v, "period_ms", kMinPeriodMs, kMaxPeriodMs, L))
      c.period_ms = static_cast<std::uint32_t>(*x);
}

// Pinning ahead fills the host reserve for demotions: without either it would do nothing. Checked
// once both [backends.host] and [budget] are read.
void check_host_side(Loader& L) {
  if (L.pin_ahead_at == nullptr) return;
  const BackendSpec host = L.policy.host_side();
  if (!host.pin_ahead) return;
  if (L.policy.budget.migrate != Budget::Migrate::auto_)
    L.report.at(*L.pin_ahead_at,
                "pin_ahead = true needs migrate = \"auto\" in [budget] (it prepares host memory "
                "for demotions)");
  else if (host.host_reserve == 0)
    L.report.at(*L.pin_ahead_at,
                "pin_ahead = true needs a host_reserve above 0 (what it pins ahead is kept there)");
}

void load_root(const toml::table& root, Loader& L) {
  check_keys(root, kRootKeys, "at the top level", L);
  if (const auto* v = root.get("version")) {
    if (L.env) {
      L.report.at(*v, "\"version\" cannot be set from ALLOCSHIM_CONF");
    } else if (const auto x = get_int(*v, "version", INT64_MIN, INT64_MAX, L); x && *x != 1) {
      L.report.at(
          *v, "unsupported policy version " + std::to_string(*x) + " (this build reads version 1)");
    }
  }
  // Backends first: [defaults] and the rules refer to them.
  if (const auto* t = section(root, "backends", L)) load_backends(*t, L);
  if (const auto* t = section(root, "defaults", L)) load_defaults(*t, L);
  if (!L.env && !L.default_backend_set) L.policy.default_backend = implicit_default(L);
  if (const auto* v = root.get("rules")) {
    if (L.env)
      L.report.at(*v, "rules cannot be set from ALLOCSHIM_CONF (edit the policy file)");
    else
      load_rules(*v, L);
  }
  if (const auto* t = section(root, "budget", L)) load_budget(*t, L);
  check_host_side(L);
  if (const auto* t = section(root, "compute", L)) load_compute(*t, L);
  if (const auto* t = section(root, "trace", L)) load_trace(*t, L);
  if (const auto* t = section(root, "log", L)) load_log(*t, L);
  if (const auto* t = section(root, "reload", L)) load_reload(*t, L);
}

void sort_diagnostics(std::vector<Diagnostic>& errors, std::size_t from) {
  std::stable_sort(errors.begin() + static_cast<std::ptrdiff_t>(from), errors.end(),
                   [](const Diagnostic& a, const Diagnostic& b) {
                     return a.line != b.line ? a.line < b.line : a.column < b.column;
                   });
}

}  // namespace detail

bool load_string(std::string_view text, const std::string& name, Policy& out,
                 std::vector<Diagnostic>& errors, const LoadOptions& options) {
  const std::size_t first = errors.size();
  detail::Reporter report(name, errors);
  int line = 0, column = 0;
  std::string guard_message;
  if (!detail::toml_guard(text, line, column, guard_message)) {
    report.at(line, column, std::move(guard_message));
    return false;
  }
  toml::parse_result parsed = toml::parse(text, std::string_view(name));
  if (!parsed) {
    // toml++ stops at the first syntax error; everything after it is unknown.
    std::string msg(parsed.error().description());
    if (!msg.empty() && msg[0] >= 'A' && msg[0] <= 'Z')
      msg[0] = static_cast<char>(msg[0] - 'A' + 'a');
    report.at(parsed.error().source(), "syntax error: " + msg);
    return false;
  }
  Policy p;
  p.source = name;
  detail::Loader L{report, p, options};
  detail::load_root(parsed.table(), L);
  if (report.count() > 0) {
    detail::sort_diagnostics(errors, first);
    return false;
  }
  out = std::move(p);
  return true;
}

bool load_string(std::string_view text, const std::string& name, Policy& out,
                 std::vector<Diagnostic>& errors) {
  return load_string(text, name, out, errors, LoadOptions{});
}

// Plain POSIX reads: this runs inside the preloaded library, where iostreams and locales are best
// left alone.
bool read_policy_file(const std::string& path, std::string& text, std::string& error) {
  text.clear();
  // Non-blocking open: a FIFO without a writer is not waited on (it then reads as empty).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    error = std::strerror(errno);
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    error = "is a directory";
    return false;
  }
  const bool stream = S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // a fed pipe is read to its end
  constexpr std::size_t kMaxPolicyBytes = 16u << 20;  // a policy is a few KiB; refuse garbage
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      error = std::strerror(errno);
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > kMaxPolicyBytes) {
      error = "larger than 16 MiB";
      ::close(fd);
      return false;
    }
  }
  ::close(fd);
  if (stream && text.empty()) {
    // An empty file is an empty policy; an empty pipe is most likely one nobody wrote to.
    error = "no data (a pipe or FIFO whose writer wrote nothing, or that had no writer)";
    return false;
  }
  return true;
}

bool load_file(const std::string& path, Policy& out, std::vector<Diagnostic>& errors,
               const LoadOptions& options) {
  std::string text, error;
  if (!read_policy_file(path, text, error)) {
    errors.push_back(Diagnostic{path, 0, 0, "cannot read policy file: " + error});
    return false;
  }
  return load_string(text, path, out, errors, options);
}

bool load_file(const std::string& path, Policy& out, std::vector<Diagnostic>& errors) {
  return load_file(path, out, errors, LoadOptions{});
}

}  // namespace allocshim::policy
