#include "base/clock.h"

#include <time.h>

#include <atomic>

namespace allocshim::clock {
namespace {
// Fixed-point nanoseconds per tick (<< 32), measured once against CLOCK_MONOTONIC.
std::atomic<std::uint64_t> g_ns_per_tick_q32{0};

std::uint64_t calibrate() {
  const std::uint64_t m0 = now_ns(), t0 = ticks();
  std::uint64_t m1 = m0, t1 = t0;
  // 200 µs of spinning gives ~0.1% accuracy: plenty for latency histograms and summaries.
  while (m1 - m0 < 200'000) {
    m1 = now_ns();
    t1 = ticks();
  }
  const std::uint64_t q32 = t1 > t0 ? ((m1 - m0) << 32) / (t1 - t0) : (1ull << 32);
  g_ns_per_tick_q32.store(q32 ? q32 : 1, std::memory_order_relaxed);
  return q32 ? q32 : 1;
}
}  // namespace

std::uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

std::uint64_t to_ns(std::uint64_t t) {
  std::uint64_t q32 = g_ns_per_tick_q32.load(std::memory_order_relaxed);
  if (__builtin_expect(q32 == 0, 0)) q32 = calibrate();
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(t) * q32) >> 32);
}

}  // namespace allocshim::clock
