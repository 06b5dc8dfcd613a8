#include "core/stats.h"

#include <cstdlib>
#include <new>

namespace allocshim {
namespace stats_detail {
namespace {
std::atomic<int> g_next_stripe{0};
thread_local int t_stripe __attribute__((tls_model("initial-exec"))) = -1;
}  // namespace

int thread_stripe() {
  int s = t_stripe;
  if (__builtin_expect(s < 0, 0)) {
    // Stripe ids are never reused: a thread that exits keeps its counts, and a program that makes
    // many short-lived threads ends up on the shared stripe, which is still exact.
    const int n = g_next_stripe.fetch_add(1, std::memory_order_relaxed);
    s = t_stripe = n < kOwnedStripes ? n : kSharedStripe;
  }
  return s;
}

}  // namespace stats_detail

DeviceStats::~DeviceStats() {
  for (auto& s : stripes_) {
    stats_detail::Counters* c = s.load(std::memory_order_relaxed);
    if (!c) continue;
    c->~Counters();
    std::free(c);
  }
}

stats_detail::Counters* DeviceStats::make_stripe(int stripe) {
  void* mem = std::aligned_alloc(alignof(stats_detail::Counters), sizeof(stats_detail::Counters));
  if (!mem) return nullptr;
  auto* fresh = new (mem) stats_detail::Counters();
  stats_detail::Counters* expected = nullptr;
  // Only the shared stripe can be raced for; an owned one is only ever made by its thread.
  if (!stripes_[static_cast<std::size_t>(stripe)].compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) {
    fresh->~Counters();
    std::free(mem);
    return expected;
  }
  return fresh;
}

void DeviceStats::raise_peak(std::uint64_t live) {
  std::uint64_t peak = peak_.load(std::memory_order_relaxed);
  while (live > peak && !peak_.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

std::uint64_t DeviceStats::sum(std::atomic<std::uint64_t> stats_detail::Counters::*field) const {
  std::uint64_t total = 0;
  for (const auto& s : stripes_)
    if (const stats_detail::Counters* c = s.load(std::memory_order_acquire)) total += (c->*field).load(std::memory_order_relaxed);
  return total;
}

std::uint64_t DeviceStats::latency_bucket(int i) const {
  std::uint64_t total = 0;
  for (const auto& s : stripes_)
    if (const stats_detail::Counters* c = s.load(std::memory_order_acquire))
      total += c->latency[static_cast<std::size_t>(i)].load(std::memory_order_relaxed);
  return total;
}

std::uint64_t DeviceStats::timed_calls() const {
  std::uint64_t total = 0;
  for (int i = 0; i < kLatencyBuckets; ++i) total += latency_bucket(i);
  return total;
}

std::uint64_t DeviceStats::untimed() const {
  std::uint64_t total = 0;
  for (std::size_t s = 0; s < static_cast<std::size_t>(stats_detail::kOwnedStripes); ++s)
    if (const stats_detail::Counters* c = stripes_[s].load(std::memory_order_acquire)) {
      // Calls of the current interval so far: the next timed call will stand for them.
      const std::uint32_t interval = c->interval.load(std::memory_order_relaxed);
      const std::uint32_t left = c->countdown.load(std::memory_order_relaxed);
      if (interval > left) total += interval - left;
    }
  return total;
}

std::uint64_t DeviceStats::api_calls(Api api) const {
  std::uint64_t total = 0;
  for (const auto& s : stripes_)
    if (const stats_detail::Counters* c = s.load(std::memory_order_acquire))
      total += c->api[static_cast<std::size_t>(api)].load(std::memory_order_relaxed);
  return total;
}

}  // namespace allocshim
