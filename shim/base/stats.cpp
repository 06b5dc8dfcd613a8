#include "base/stats.h"

#include <algorithm>

namespace allocshim {

void DeviceStats::publish(stats_detail::Counters& c, std::int64_t pending) {
  const std::int64_t now = published_.fetch_add(pending, std::memory_order_relaxed) + pending;
  c.seen.store(now, std::memory_order_relaxed);
  if (now > c.peak.load(std::memory_order_relaxed)) c.peak.store(now, std::memory_order_relaxed);
  raise_peak(peak_, now);
}

std::uint64_t DeviceStats::live_bytes() const {
  std::int64_t total = 0;
  each_stripe(
      [&](const stats_detail::Counters& c) { total += c.live.load(std::memory_order_relaxed); });
  return total > 0 ? static_cast<std::uint64_t>(total) : 0;
}

std::uint64_t DeviceStats::peak_bytes() const {
  std::int64_t peak = peak_.load(std::memory_order_relaxed);
  each_stripe([&](const stats_detail::Counters& c) {
    peak = std::max(peak, c.peak.load(std::memory_order_relaxed));
  });
  // What is live now was reached, whatever the stripes saw.
  return std::max(static_cast<std::uint64_t>(peak > 0 ? peak : 0), live_bytes());
}

std::uint64_t DeviceStats::sum(std::atomic<std::uint64_t> stats_detail::Counters::*field) const {
  std::uint64_t total = 0;
  each_stripe([&](const stats_detail::Counters& c) {
    total += (c.*field).load(std::memory_order_relaxed);
  });
  return total;
}

std::uint64_t DeviceStats::latency_bucket(int i) const {
  std::uint64_t total = 0;
  each_stripe([&](const stats_detail::Counters& c) {
    total += c.latency[static_cast<std::size_t>(i)].load(std::memory_order_relaxed);
  });
  return total;
}

std::uint64_t DeviceStats::timed_calls() const {
  std::uint64_t total = 0;
  for (int i = 0; i < kLatencyBuckets; ++i) total += latency_bucket(i);
  return total;
}

std::uint64_t DeviceStats::untimed() const {
  std::uint64_t total = 0;
  // Calls of each owned stripe's current interval so far: the next timed call will stand for them.
  stripes_.for_each([&](const stats_detail::Counters& c) {
    const std::uint32_t interval = c.interval.load(std::memory_order_relaxed);
    const std::uint32_t left = c.countdown.load(std::memory_order_relaxed);
    if (interval > left) total += interval - left;
  });
  return total;
}

std::uint64_t DeviceStats::api_calls(Api api) const {
  std::uint64_t total = 0;
  each_stripe([&](const stats_detail::Counters& c) {
    total += c.api[static_cast<std::size_t>(api)].load(std::memory_order_relaxed);
  });
  return total;
}

}  // namespace allocshim
