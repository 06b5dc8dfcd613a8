// A cheap monotonic clock for timing allocation calls. rdtsc costs a few nanoseconds where
// clock_gettime costs 15-25; ticks are turned into nanoseconds with a rate calibrated against
// CLOCK_MONOTONIC (invariant TSC is universal on the x86-64 machines CUDA runs on).
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace allocshim::clock {

inline std::uint64_t ticks() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  std::uint64_t v;
  asm volatile("mrs %0, cntvct_el0" : "=r"(v));
  return v;
#endif
}

// Nanoseconds from a tick count; calibrates on first use (a ~1 ms sleep, off the hot path).
std::uint64_t to_ns(std::uint64_t ticks);
// Current CLOCK_MONOTONIC time in nanoseconds.
std::uint64_t now_ns();

}  // namespace allocshim::clock
