// The benchmarks' random sizes: splitmix64, deterministic across machines and compilers (unlike
// <random>'s distributions), so that alloc_latency on a GPU, churn_core and the unit tests that
// replay its workloads (tests/unit/vmm_test.cpp) draw the same sequence. Header-only, no CUDA.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace allocshim::bench {

struct SplitMix {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }
  // Log-uniform between 2^lo and 2^hi bytes, rounded up to 256 (cudaMalloc's alignment): odd
  // sizes, as programs ask for.
  std::size_t log_size(double lo, double hi) {
    const double bytes = std::exp2(lo + (hi - lo) * unit());
    return (static_cast<std::size_t>(bytes) + 255) / 256 * 256;
  }
};

}  // namespace allocshim::bench
