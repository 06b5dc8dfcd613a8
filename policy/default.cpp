// The embedded default policy: what the shim serves when no policy file is given.
//
// kDefaultPolicy is the one place to edit it (after GPU measurements, the default backend may
// change); default_policy() is parsed from this very text, so the two cannot drift, and a test
// checks that it loads. A file that leaves [defaults] backend out takes this policy's, so the text
// must name it (the loader reads it from here).
#include "policy/policy.h"

namespace allocshim::policy {
namespace {

constexpr std::string_view kDefaultPolicy =
    R"toml(# allocshim default policy (`allocshim check --print-default` prints it).
#
# cudaMalloc-style allocations come from `vmm` growable regions: freed blocks are kept mapped and
# handed out again, so a cudaMalloc+cudaFree pair is served tens to a thousand times faster than by
# the driver (README.md, "Results"). Every free still synchronizes the device, exactly as
# cudaFree does, so no program can observe a block being reused under a running kernel. Managed and
# stream-ordered allocations (cudaMallocManaged, cudaMallocAsync) stay native unless a rule names
# their api. A policy file starts from this one: a key it leaves out keeps the value here. For the
# pure passthrough, set backend = "native"; docs/policy.md lists every key.
version = 1

[defaults]
backend = "vmm"        # growable VMM regions, sub-allocated, cached after free
free_sync = "device"   # synchronize at free: cudaFree's own guarantee

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
