// Environment overrides, in the spirit of PYTORCH_CUDA_ALLOC_CONF: change a policy for one run
// without editing its file. Precedence (docs/policy.md): the file (or the embedded default), then
// ALLOCSHIM_BACKEND, then the ALLOCSHIM_CONF items from left to right.
//
// Each ALLOCSHIM_CONF item `a.b.c=value` is turned into the one-line TOML fragment
// `a.b.c = "value"` and read by the same section loaders as a file (in `env` mode, where every
// value is a string converted to the type its key wants), so a key means the same in both places
// and is validated the same way. Positions in the fragment map back to columns of the variable.
#include "policy/loader.h"

namespace allocshim::policy {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t'; }

// [begin, end) of `s` without surrounding blanks.
void trim(std::string_view s, std::size_t& begin, std::size_t& end) {
  while (begin < end && is_space(s[begin])) ++begin;
  while (end > begin && is_space(s[end - 1])) --end;
}

bool valid_key(std::string_view key) {
  if (key.empty() || key.front() == '.' || key.back() == '.') return false;
  char prev = 0;
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok || (c == '.' && prev == '.')) return false;
    prev = c;
  }
  return true;
}

void apply_item(std::string_view conf, std::size_t begin, std::size_t end, Policy& work,
                const LoadOptions& options, std::vector<Diagnostic>& errors) {
  detail::Reporter report("ALLOCSHIM_CONF", errors);
  const std::string_view item = conf.substr(begin, end - begin);
  const std::size_t eq = item.find('=');
  const int item_column = static_cast<int>(begin) + 1;
  if (eq == std::string_view::npos) {
    report.at(1, item_column, "expected KEY=VALUE, not " + detail::toml_quote(item));
    return;
  }
  std::size_t kb = begin, ke = begin + eq, vb = begin + eq + 1, ve = end;
  trim(conf, kb, ke);
  trim(conf, vb, ve);
  std::string key(conf.substr(kb, ke - kb));
  const std::string_view value = conf.substr(vb, ve - vb);
  if (!valid_key(key)) {
    report.at(1, static_cast<int>(kb) + 1,
              "bad key " + detail::toml_quote(key) +
                  ": expected a dotted name such as \"budget.device\"");
    return;
  }
  // The two keys people set most often have short names.
  if (key == "backend" || key == "free_sync") key = "defaults." + key;

  const std::string fragment = key + " = " + detail::toml_quote(value);
  report.map_fragment(static_cast<int>(key.size()), static_cast<int>(kb) + 1,
                      static_cast<int>(vb) + 1);
  toml::parse_result parsed = toml::parse(fragment, std::string_view("ALLOCSHIM_CONF"));
  if (!parsed) {
    report.at(parsed.error().source(),
              "cannot read this value: " + std::string(parsed.error().description()));
    return;
  }
  detail::Loader L{report, work, options, /*env=*/true};
  detail::load_root(parsed.table(), L);
}

}  // namespace

bool apply_overrides(Policy& p, const char* backend_env, const char* conf_env,
                     std::vector<Diagnostic>& errors, const LoadOptions& options) {
  const std::size_t first = errors.size();
  Policy work = p;

  if (backend_env && *backend_env) {
    const std::string_view s(backend_env);
    std::size_t b = 0, e = s.size();
    trim(s, b, e);
    detail::Reporter report("ALLOCSHIM_BACKEND", errors);
    report.map_fragment(0, static_cast<int>(b) + 1, static_cast<int>(b) + 1);
    detail::Loader L{report, work, options, /*env=*/true};
    const toml::value<std::string> name(std::string(s.substr(b, e - b)));
    const int index = detail::resolve_backend(name, L);
    if (index >= 0) {
      // "Serve everything from this backend": the file's rules would otherwise still route
      // around it.
      work.default_backend = index;
      work.rules.clear();
    }
  }

  if (conf_env && *conf_env) {
    const std::string_view conf(conf_env);
    std::size_t begin = 0;
    while (begin <= conf.size()) {
      std::size_t end = conf.find(',', begin);
      if (end == std::string_view::npos) end = conf.size();
      std::size_t b = begin, e = end;
      trim(conf, b, e);
      if (b < e) apply_item(conf, b, e, work, options, errors);
      begin = end + 1;
    }
  }

  if (errors.size() != first) return false;
  // Said wherever the policy is shown (exit summary, stats): it is not the file alone any more.
  const auto note = [&work](const char* name, const char* value) {
    if (!value || !*value) return;
    work.overrides += (work.overrides.empty() ? "" : ", ") + std::string(name) + "=" + value;
  };
  note("ALLOCSHIM_BACKEND", backend_env);
  note("ALLOCSHIM_CONF", conf_env);
  p = std::move(work);
  return true;
}

bool apply_overrides(Policy& p, const char* backend_env, const char* conf_env,
                     std::vector<Diagnostic>& errors) {
  return apply_overrides(p, backend_env, conf_env, errors, LoadOptions{});
}

}  // namespace allocshim::policy
