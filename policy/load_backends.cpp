// [backends.NAME] tables: named instances of the five kinds, their kind-specific options, and how
// a `backend = "..."` reference resolves to one of them.
#include <algorithm>
#include <charconv>

#include "policy/loader.h"
#include "policy/size.h"

namespace allocshim::policy::detail {
namespace {

constexpr std::string_view kKindNames[] = {"native", "async_pool", "vmm", "managed", "host"};
constexpr std::uint64_t kVmmGranularity = 2ull << 20;  // minimum = recommended on every GPU seen

// The options each kind takes; docs/policy.md documents each one.
constexpr std::string_view kAsyncPoolOptions[] = {"release_threshold", "initial", "ipc"};
constexpr std::string_view kVmmOptions[] = {"chunk", "reserve", "release_threshold",
                                            "thread_cache"};
constexpr std::string_view kManagedOptions[] = {"read_mostly", "preferred_location", "accessed_by",
                                                "prefetch", "stripe"};
constexpr std::string_view kHostOptions[] = {"pin_threads", "host_reserve", "pin_ahead",
                                             "pin_ahead_idle_ms"};
constexpr std::string_view kPreferred[] = {"none", "device", "host"};
constexpr std::int64_t kMaxPinThreads = 64;
constexpr std::int64_t kMaxPinAheadIdleMs = 3600000;
Names options_of(BackendKind kind) {
  switch (kind) {
    case BackendKind::async_pool: return kAsyncPoolOptions;
    case BackendKind::vmm: return kVmmOptions;
    case BackendKind::managed: return kManagedOptions;
    case BackendKind::host: return kHostOptions;
    case BackendKind::native: break;
  }
  return {};
}
constexpr std::string_view kAllOptions[] = {
    "kind",        "release_threshold", "initial",     "ipc",
    "chunk",       "reserve",           "read_mostly", "preferred_location",
    "accessed_by", "prefetch",          "stripe",      "thread_cache",
    "pin_threads", "host_reserve",      "pin_ahead",   "pin_ahead_idle_ms"};

bool contains(Names names, std::string_view s) {
  return std::find(names.begin(), names.end(), s) != names.end();
}

std::optional<BackendKind> kind_from_name(std::string_view s) {
  for (int k = 0; k < kBackendKindCount; ++k)
    if (s == backend_kind_name(static_cast<BackendKind>(k))) return static_cast<BackendKind>(k);
  return std::nullopt;
}

bool valid_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-'))
      return false;
  return true;
}

std::optional<std::uint64_t> get_granular(const toml::node& v, std::string_view key, bool nonzero,
                                          Loader& L) {
  const auto bytes = get_size(v, key, L);
  if (!bytes) return std::nullopt;
  if ((nonzero && *bytes == 0) || *bytes % kVmmGranularity != 0) {
    L.report.at(v, quoted(key) + " must be a " + (nonzero ? "non-zero " : "") +
                       "multiple of 2MiB (the VMM granularity), not " + format_size(*bytes));
    return std::nullopt;
  }
  return bytes;
}

// stripe: a fraction in [0, 1] or "auto".
std::optional<double> get_stripe(const toml::node& v, Loader& L) {
  double x = 0;
  if (const auto* f = v.as_floating_point()) {
    x = f->get();
  } else if (const auto* i = v.as_integer()) {
    x = static_cast<double>(i->get());
  } else if (const auto* s = v.as_string()) {
    if (s->get() == "auto") return kStripeAuto;
    const std::string& t = s->get();
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), x);
    if (!L.env || ec != std::errc() || end != t.data() + t.size()) {
      L.report.at(
          v, "\"stripe\" must be a fraction between 0 and 1 or \"auto\", not " + toml_quote(t));
      return std::nullopt;
    }
  } else {
    L.report.at(v,
                "\"stripe\" must be a fraction between 0 and 1 or \"auto\", not " + type_name(v));
    return std::nullopt;
  }
  if (!(x >= 0.0 && x <= 1.0)) {
    L.report.at(
        v, "\"stripe\" must be a fraction between 0 and 1 or \"auto\", not " + format_float(x));
    return std::nullopt;
  }
  return x;
}

void load_option(BackendSpec& b, std::string_view key, const toml::node& v, Loader& L) {
  if (key == "release_threshold") {
    const auto x = get_size_or_max(v, key, L);
    if (x) (b.kind == BackendKind::vmm ? b.vmm_release_threshold : b.release_threshold) = *x;
  } else if (key == "initial") {
    if (const auto x = get_size(v, key, L)) b.initial = *x;
  } else if (key == "ipc") {
    if (const auto x = get_bool(v, key, L)) b.ipc = *x;
  } else if (key == "chunk") {
    if (const auto x = get_granular(v, key, true, L)) b.chunk = *x;
  } else if (key == "reserve") {
    if (const auto x = get_granular(v, key, false, L)) b.reserve = *x;
  } else if (key == "thread_cache") {
    if (const auto x = get_size(v, key, L)) b.thread_cache = *x;
  } else if (key == "read_mostly") {
    if (const auto x = get_bool(v, key, L)) b.read_mostly = *x;
  } else if (key == "preferred_location") {
    if (const auto x = get_enum(v, key, kPreferred, L))
      b.preferred_location = static_cast<BackendSpec::Preferred>(*x);
  } else if (key == "accessed_by") {
    if (const auto x = get_bool(v, key, L)) b.accessed_by = *x;
  } else if (key == "prefetch") {
    if (const auto x = get_bool(v, key, L)) b.prefetch = *x;
  } else if (key == "stripe") {
    if (const auto x = get_stripe(v, L)) b.stripe = *x;
  } else if (key == "pin_threads") {
    if (const auto x = get_int(v, key, 0, kMaxPinThreads, L))
      b.pin_threads = static_cast<std::uint32_t>(*x);
  } else if (key == "host_reserve") {
    if (const auto x = get_size(v, key, L)) b.host_reserve = *x;
  } else if (key == "pin_ahead") {
    if (const auto x = get_bool(v, key, L)) {
      b.pin_ahead = *x;
      L.pin_ahead_at = &v;
    }
  } else if (key == "pin_ahead_idle_ms") {
    if (const auto x = get_int(v, key, 1, kMaxPinAheadIdleMs, L))
      b.pin_ahead_idle_ms = static_cast<std::uint32_t>(*x);
  }
}

std::string option_list(BackendKind kind) {
  const Names opts = options_of(kind);
  if (opts.size() == 0)
    return "(kind \"" + std::string(backend_kind_name(kind)) + "\" has no options)";
  std::string s = "(its options: ";
  std::size_t i = 0;
  for (std::string_view o : opts) s += (i++ ? ", " : "") + std::string(o);
  return s + ")";
}

void load_backend(const toml::key& key, const toml::table& t, Loader& L) {
  const std::string name(key.str());
  const std::string where = "in [backends." + name + "]";
  if (!valid_name(name))
    L.report.at(key,
                "backend name " + toml_quote(name) + " may only use letters, digits, '_' and '-'");

  auto& backends = L.policy.backends;
  const int found = L.find_backend(name);
  auto existing = found >= 0 ? backends.begin() + found : backends.end();
  BackendSpec spec;
  spec.name = name;
  if (existing != backends.end()) spec = *existing;

  bool kind_known = existing != backends.end();
  if (const toml::node* kv = t.get("kind")) {
    if (const auto k = get_enum(*kv, "kind", kKindNames, L)) {
      const auto kind = static_cast<BackendKind>(*k);
      const auto named_kind = kind_from_name(name);
      if (existing != backends.end() && existing->kind != kind) {
        L.report.at(*kv, "cannot change the kind of backend \"" + name + "\" (" +
                             backend_kind_name(existing->kind) + ") from the environment");
      } else if (named_kind && *named_kind != kind) {
        L.report.at(*kv, "backend \"" + name + "\" must have kind \"" + name +
                             "\": a kind's name always means that kind");
      } else {
        check_kind_allowed(kind, *kv, L);
        spec.kind = kind;
        kind_known = true;
      }
    }
  } else if (existing == backends.end() && kind_from_name(name)) {
    spec.kind = *kind_from_name(name);  // named like a kind: of that kind
    kind_known = true;
  } else if (existing == backends.end()) {
    L.report.at(key, "[backends." + name + "] needs a \"kind\": " + quoted_list(kKindNames));
  }

  for (auto&& [okey, value] : t) {
    const std::string_view o = okey.str();
    if (o == "kind") continue;
    if (!kind_known) {
      // The kind is wrong already; only point out keys no kind takes.
      if (!contains(kAllOptions, o))
        L.report.at(
            okey, "unknown key \"" + std::string(o) + "\" " + where + did_you_mean(o, kAllOptions));
      continue;
    }
    if (contains(kHostOptions, o) && spec.kind == BackendKind::host && name != "host") {
      // The host side of the spill target: another instance of the kind moves nothing.
      L.report.at(okey,
                  "option \"" + std::string(o) +
                      "\" sets the budget's host spill target: only [backends.host] takes it");
    } else if (contains(options_of(spec.kind), o)) {
      load_option(spec, o, value, L);
    } else if (contains(kAllOptions, o)) {
      L.report.at(okey, "option \"" + std::string(o) + "\" is not valid for kind \"" +
                            backend_kind_name(spec.kind) + "\" " + option_list(spec.kind));
    } else {
      std::string msg = "unknown key \"" + std::string(o) + "\" " + where;
      std::vector<std::string> candidates{"kind"};
      for (std::string_view c : options_of(spec.kind)) candidates.emplace_back(c);
      const std::string_view c = closest(o, candidates);
      msg +=
          c.empty() ? " " + option_list(spec.kind) : "; did you mean \"" + std::string(c) + "\"?";
      L.report.at(okey, std::move(msg));
    }
  }
  // Kept even when wrong, so references to it do not pile up "unknown backend" errors.
  if (existing != backends.end())
    *existing = std::move(spec);
  else
    backends.push_back(std::move(spec));
}

}  // namespace

int Loader::find_backend(std::string_view name) {
  // Backends are only ever appended, and a backend's name never changes once it is in the policy.
  const auto& backends = policy.backends;
  for (; backends_indexed < backends.size(); ++backends_indexed)
    backend_index.emplace(backends[backends_indexed].name, static_cast<int>(backends_indexed));
  const auto it = backend_index.find(std::string(name));
  return it == backend_index.end() ? -1 : it->second;
}

bool check_kind_allowed(BackendKind kind, const toml::node& where, Loader& L) {
  if (L.options.kinds & (1u << static_cast<unsigned>(kind))) return true;
  L.report.at(where, std::string("backend kind \"") + backend_kind_name(kind) +
                         "\" is not implemented yet in this build");
  return false;
}

void load_backends(const toml::table& backends, Loader& L) {
  // toml++ keeps keys sorted; the policy keeps the file's order, which `check` prints back.
  std::vector<std::pair<const toml::key*, const toml::node*>> entries;
  for (auto&& [key, value] : backends) entries.emplace_back(&key, &value);
  std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    const auto& pa = a.first->source().begin;
    const auto& pb = b.first->source().begin;
    return pa.line != pb.line ? pa.line < pb.line : pa.column < pb.column;
  });
  for (const auto& [key, value] : entries) {
    if (const auto* t = value->as_table())
      load_backend(*key, *t, L);
    else
      L.report.at(*value, "\"backends." + std::string(key->str()) +
                              "\" must be a table ([backends." + std::string(key->str()) +
                              "]), not " + type_name(*value));
  }
}

int resolve_backend(const toml::node& value, Loader& L) {
  const auto* s = value.as_string();
  if (!s) {
    L.report.at(value,
                "\"backend\" must be a string naming a backend or a kind, not " + type_name(value));
    return -1;
  }
  const std::string& name = s->get();
  auto& backends = L.policy.backends;
  if (const int i = L.find_backend(name); i >= 0) return i;
  if (const auto kind = kind_from_name(name)) {
    if (!check_kind_allowed(*kind, value, L)) return -1;
    BackendSpec spec;
    spec.name = name;
    spec.kind = *kind;
    backends.push_back(std::move(spec));
    return static_cast<int>(backends.size() - 1);
  }
  std::vector<std::string> candidates;
  for (const BackendSpec& b : backends) candidates.push_back(b.name);
  for (std::string_view k : kKindNames) candidates.emplace_back(k);
  const std::string_view c = closest(name, candidates);
  if (!c.empty()) {
    L.report.at(value, "unknown backend " + toml_quote(name) + "; did you mean \"" +
                           std::string(c) + "\"?");
  } else {
    L.report.at(value, "unknown backend " + toml_quote(name) + " (define [backends." + name +
                           "], or name a kind: " + quoted_list(kKindNames) + ")");
  }
  return -1;
}

}  // namespace allocshim::policy::detail
