// What loading a policy costs as it grows: N backends and one rule per backend naming it, loaded
// with load_string (a plain timed run by hand, not a test; load_scale_test.cpp checks the work per
// backend). Usage: policy_load_bench [N...]   (default 16384 32768 65536 131072)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "policy/policy.h"

int main(int argc, char** argv) {
  std::vector<long> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::strtol(argv[i], nullptr, 10));
  if (sizes.empty()) sizes = {16384, 32768, 65536, 131072};
  std::printf("%10s %12s %14s\n", "backends", "load s", "us per backend");
  for (long n : sizes) {
    std::string text;
    for (long i = 0; i < n; ++i) text += "[backends.b" + std::to_string(i) + "]\nkind = \"vmm\"\n";
    for (long i = 0; i < n; ++i)
      text += "[[rules]]\nsize = \"<= " + std::to_string(i + 1) + "MiB\"\nbackend = \"b" +
              std::to_string(i) + "\"\n";
    allocshim::policy::Policy p;
    std::vector<allocshim::policy::Diagnostic> errors;
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = allocshim::policy::load_string(text, "bench.toml", p, errors);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!ok) {
      std::fprintf(stderr, "load failed: %s\n", errors.empty() ? "?" : errors[0].str().c_str());
      return 1;
    }
    std::printf("%10ld %12.3f %14.2f\n", n, s, s * 1e6 / static_cast<double>(n));
  }
  return 0;
}
