// The embedded default policy: what the shim serves when no policy file is given.
//
// kDefaultPolicy is the one place to edit it (after GPU measurements, the default backend may
// change); default_policy() is parsed from this very text, so the two cannot drift, and a test
// checks that it loads.
#include "policy/policy.h"

namespace allocshim::policy {
namespace {

constexpr std::string_view kDefaultPolicy = R"toml(# allocshim default policy (`allocshim check --print-default` prints it).
#
# The safe passthrough: every allocation is served by the driver exactly as without the shim, and
# every free synchronizes as cuMemFree does. Nothing changes a program's behaviour until a policy
# file says so; copy this file and edit it (docs/policy.md lists every key).
version = 1

[defaults]
backend = "native"     # cuMemAlloc itself
free_sync = "device"   # synchronize at free, cudaFree's own semantics

[log]
level = "warn"
)toml";

}  // namespace

std::string_view default_policy_text() { return kDefaultPolicy; }

const Policy& default_policy() {
  // Built on first use (never by a global constructor: this runs inside a preloaded library).
  static const Policy policy = [] {
    Policy p;
    std::vector<Diagnostic> errors;
    if (!load_string(kDefaultPolicy, "<default>", p, errors)) {
      // Only reachable if kDefaultPolicy is edited into something invalid (or names a kind this
      // build lacks); tests catch that. Serve natively rather than fail the program.
      p = Policy{};
      p.backends.push_back(BackendSpec{});
      p.backends.back().name = "native";
    }
    return p;
  }();
  return policy;
}

}  // namespace allocshim::policy
