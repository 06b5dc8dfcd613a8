// policy_match_bench: what policy::match() costs per allocation, for a policy of ten rules.
//
// A plain timed loop (no benchmark library: the GPU machine has none). Prints ns/match for
// allocations that hit the first rule, a middle rule, and no rule, and for a policy whose one
// callsite rule is consulted. Not a test: run it by hand, on an idle machine, e.g.
//   build/bin/policy_match_bench [iterations]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "policy/policy.h"

namespace {

using allocshim::Api;

// The results must be observable, or the timed loops could be optimized away.
volatile long g_sink = 0;
namespace policy = allocshim::policy;

constexpr const char* kTenRules = R"(
[defaults]
backend = "pool"
free_sync = "barrier"
[backends.pool]
kind = "async_pool"
[backends.big]
kind = "vmm"
[[rules]]
size = ">= 1GiB"
api = "alloc"
backend = "big"
[[rules]]
size = "512MiB..1GiB"
device = [0, 1]
backend = "big"
[[rules]]
api = "managed"
backend = "managed"
[[rules]]
size = "< 512B"
api = "async"
free_sync = "none"
[[rules]]
size = "256MiB..512MiB"
device = 2
backend = "vmm"
[[rules]]
size = "64MiB..256MiB"
api = ["alloc", "pitch"]
device = [4, 5, 6]
backend = "big"
[[rules]]
size = "= 4KiB"
device = 7
free_sync = "device"
[[rules]]
api = "pitch"
size = ">= 2MiB"
backend = "native"
[[rules]]
size = "16MiB..32MiB"
device = [3]
free_sync = "none"
[[rules]]
size = "1MiB..2MiB"
api = "async"
device = [1]
backend = "native"
)";

constexpr const char* kCallsite = R"(
[[rules]]
size = ">= 1GiB"
backend = "vmm"
[[rules]]
callsite = "*thrust::*"
backend = "async_pool"
)";

policy::Policy load(const char* text) {
  policy::Policy p;
  std::vector<policy::Diagnostic> errors;
  policy::LoadOptions all;
  all.kinds = policy::kAllKinds;
  if (!policy::load_string(text, "bench.toml", p, errors, all)) {
    for (const auto& e : errors) std::fprintf(stderr, "%s\n", e.str().c_str());
    std::exit(1);
  }
  return p;
}

struct Case {
  const char* name;
  std::uint64_t size;
  Api api;
  int device;
  const char* callsite;
};

// Times `iterations` matches; the running sum keeps the compiler from dropping the calls.
double ns_per_match(const policy::Policy& p, const Case& c, long iterations, long& sink) {
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < iterations; ++i) {
    // Vary the size a little so the branch predictor does not see a constant.
    const auto d =
        policy::match(p, c.size + static_cast<std::uint64_t>(i & 7), c.api, c.device, c.callsite);
    sink += d.rule + d.backend;
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  return std::chrono::duration<double, std::nano>(elapsed).count() /
         static_cast<double>(iterations);
}

}  // namespace

int main(int argc, char** argv) {
  const long iterations = argc > 1 ? std::atol(argv[1]) : 20'000'000;
  if (iterations <= 0) {
    std::fprintf(stderr, "usage: %s [iterations > 0]\n", argv[0]);
    return 2;
  }
  const policy::Policy ten = load(kTenRules);
  const policy::Policy callsite = load(kCallsite);
  const char* frames =
      "main\n/usr/lib/libfoo.so\nvoid thrust::detail::temporary_allocator<char>::allocate\n"
      "cub::DeviceRadixSort::SortKeys";
  const Case ten_cases[] = {
      {"first rule matches", 2ull << 30, Api::alloc, 0, ""},
      {"fifth rule matches", 300ull << 20, Api::alloc, 2, ""},
      {"last rule matches", (1ull << 20) + 64, Api::async, 1, ""},
      {"no rule matches (10 tried)", 8192, Api::alloc, 0, ""},
  };
  long sink = 0;
  std::printf("policy::match, %zu rules, %ld iterations each\n", ten.rules.size(), iterations);
  for (const Case& c : ten_cases)
    std::printf("  %-34s %6.1f ns/match\n", c.name, ns_per_match(ten, c, iterations, sink));
  std::printf("policy::match, a callsite rule after a size rule\n");
  const Case callsite_cases[] = {
      {"callsite glob matches frame 3", 4096, Api::alloc, 0, frames},
      {"callsite glob matches no frame", 4096, Api::alloc, 0, "main\nlibfoo.so\nbar"},
  };
  for (const Case& c : callsite_cases)
    std::printf("  %-34s %6.1f ns/match\n", c.name,
                ns_per_match(callsite, c, iterations / 10, sink));
  g_sink = sink;
  return 0;
}
