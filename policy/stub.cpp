// Placeholder until the policy engine lands: only the embedded default (everything native).
#include "policy/policy.h"

namespace allocshim::policy {

std::string Diagnostic::str() const {
  return file + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + message;
}

std::string_view default_policy_text() {
  return "version = 1\n\n[defaults]\nbackend = \"native\"\nfree_sync = \"device\"\n";
}

const Policy& default_policy() {
  static const Policy p = [] {
    Policy d;
    d.backends.push_back(BackendSpec{});
    d.backends.back().name = "native";
    return d;
  }();
  return p;
}

bool load_file(const std::string& path, Policy&, std::vector<Diagnostic>& errors) {
  errors.push_back({path, 1, 1, "policy files are not supported yet"});
  return false;
}

bool load_string(std::string_view, const std::string& name, Policy&, std::vector<Diagnostic>& errors) {
  errors.push_back({name, 1, 1, "policy files are not supported yet"});
  return false;
}

bool apply_overrides(Policy&, const char*, const char*, std::vector<Diagnostic>&) { return true; }

Decision match(const Policy& p, std::uint64_t, Api, int, std::string_view) {
  return Decision{p.default_backend, p.default_free_sync, -1};
}

std::string to_toml(const Policy&) { return std::string(default_policy_text()); }

}  // namespace allocshim::policy
