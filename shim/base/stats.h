// Allocation statistics, kept per backend and per device; the exit summary (core/summary.cpp)
// reads them once.
//
// Counters live in per-thread stripes indexed by the thread's id (base/threads.h): a thread updates
// its own stripe with plain loads and stores (no locked instruction, no cache line another thread
// writes). Threads without an id (more than threads::kMax alive) share one stripe updated
// atomically. Readers sum the stripes: values read while threads allocate are approximate, exact
// once they stop.
//
// Live bytes are per stripe too (a thread that frees another's block subtracts in its own stripe;
// the sum is exact). The peak of a sum is not a sum of peaks, so each stripe also keeps the bytes it
// has not yet published to one shared counter, and publishes them once they reach kPublishBytes
// either way: the shared counter is touched about once per kPublishBytes allocated, not per call.
// A stripe's own peak is the shared value it last saw plus its unpublished bytes; the peak read is
// the highest of those and of the shared counter's peak. For one thread that is exact; with n
// threads it may miss up to (n - 1) * kPublishBytes of a peak other threads reached between
// publications, never more.
//
// Timing: a backend whose calls always reach the driver (native, managed, host) times every call.
// A pooling backend (vmm, async_pool) times one call in about kSampleMean of each thread's calls
// (interval drawn between kSampleMean/2 and 3*kSampleMean/2 so a periodic workload is not
// aliased), and counts that sample as the calls since its previous one: the histogram and the
// total time are estimates, scaled to every call. The reason: the four clock reads of an
// alloc+free pair are a large part of a pool hit (tools/bench/hit_path.cpp measures both). The histogram
// covers allocations, frees and failed calls; calls since a stripe's last sample are untimed().
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "base/clock.h"
#include "base/peak.h"
#include "base/threads.h"
#include "base/types.h"

namespace allocshim {

// Latency histogram: bucket i counts calls that took [2^i, 2^(i+1)) nanoseconds.
inline constexpr int kLatencyBuckets = 32;
// Mean calls per timed call of a sampling backend, per thread.
inline constexpr std::uint32_t kSampleMean = 16;

namespace stats_detail {

// Unpublished live bytes a stripe may hold either way before it adds them to the shared counter.
inline constexpr std::int64_t kPublishBytes = std::int64_t{64} << 20;

struct alignas(64) Counters {
  std::atomic<std::uint64_t> allocs{0}, frees{0}, failures{0}, hits{0}, misses{0}, bytes{0},
      time_ns{0};
  // Live bytes: allocated minus freed by this stripe's threads (may be negative), the part not yet
  // published, the shared counter as last published, and this stripe's view of the peak.
  std::atomic<std::int64_t> live{0}, pending{0}, seen{0}, peak{0};
  // Sampling (owned stripes only): calls left until the next timed one, and the length of the
  // current interval (what the next timed call stands for).
  std::atomic<std::uint32_t> countdown{1}, interval{1};
  std::array<std::atomic<std::uint64_t>, kApiCount> api{};
  std::array<std::atomic<std::uint64_t>, kLatencyBuckets> latency{};
};

// Adds to a counter of this thread's stripe: a plain read-modify-write where the thread owns the
// stripe, an atomic one on the shared stripe.
inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t v, bool owned) {
  if (__builtin_expect(owned, 1))
    c.store(c.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  else
    c.fetch_add(v, std::memory_order_relaxed);
}

}  // namespace stats_detail

// What `barrier` frees cost a device (backends/free_sync.h): written by the thread that holds the
// backend's device lock, at an epoch's close or a wait, never on a cache hit; read at exit.
struct SyncCounters {
  std::atomic<std::uint64_t> epochs{0};    // epochs closed with events
  std::atomic<std::uint64_t> shortage{0};  // of them, closed because an allocation needed memory
  std::atomic<std::uint64_t> kept_open{
      0};  // shortages that grew memory rather than close a small epoch
  std::atomic<std::uint64_t> events{0};    // events recorded at closes
  std::atomic<std::uint64_t> queries{0};   // streams queried at closes
  std::atomic<std::uint64_t> close_ns{0};  // time spent recording closes (the device lock held)
  std::atomic<std::uint64_t> drains{0};    // waits for every pending free (memory short)
  void add(std::atomic<std::uint64_t>& c, std::uint64_t v = 1) {
    c.fetch_add(v, std::memory_order_relaxed);
  }
};

class DeviceStats {
 public:
  // One call of a backend, between begin() and one of the end_*() calls: whether it is timed, the
  // calls it stands for (weight; 0: not timed) and its start.
  struct Call {
    stats_detail::Counters* c;
    bool owned;
    std::uint32_t weight;
    std::uint64_t t0;
  };

  DeviceStats() = default;
  DeviceStats(const DeviceStats&) = delete;
  DeviceStats& operator=(const DeviceStats&) = delete;

  // `sampled`: time about one call in kSampleMean of this thread; otherwise every call.
  Call begin(bool sampled) {
    const Local l = local();
    if (__builtin_expect(sampled && l.owned, 1)) {
      const std::uint32_t left = l.c->countdown.load(std::memory_order_relaxed);
      if (__builtin_expect(left > 1, 1)) {
        l.c->countdown.store(left - 1, std::memory_order_relaxed);
        return Call{l.c, true, 0, 0};
      }
      const std::uint64_t t0 = clock::ticks();
      const std::uint32_t weight = l.c->interval.load(std::memory_order_relaxed);
      // The clock's low bits are random enough to jitter the interval.
      const std::uint32_t next =
          kSampleMean / 2 + static_cast<std::uint32_t>((t0 ^ (t0 >> 7)) % kSampleMean);
      l.c->interval.store(next, std::memory_order_relaxed);
      l.c->countdown.store(next, std::memory_order_relaxed);
      return Call{l.c, true, weight, t0};
    }
    return Call{l.c, l.owned, 1, clock::ticks()};
  }
  void end_alloc(const Call& call, std::size_t bytes, Api api) {
    add_live(Local{call.c, call.owned}, static_cast<std::int64_t>(bytes));
    stats_detail::bump(call.c->allocs, 1, call.owned);
    stats_detail::bump(call.c->bytes, bytes, call.owned);
    stats_detail::bump(call.c->api[static_cast<std::size_t>(api)], 1, call.owned);
    if (call.weight != 0) record_time(call);
  }
  void end_free(const Call& call, std::size_t bytes) {
    add_live(Local{call.c, call.owned}, -static_cast<std::int64_t>(bytes));
    stats_detail::bump(call.c->frees, 1, call.owned);
    if (call.weight != 0) record_time(call);
  }
  void end_failure(const Call& call) {
    stats_detail::bump(call.c->failures, 1, call.owned);
    if (call.weight != 0) record_time(call);
  }

  // Accounting where the caller timed the call itself (every call; ns may be 0).
  void on_alloc(std::size_t bytes, std::uint64_t ns, Api api) {
    Local l = local();
    add_live(l, static_cast<std::int64_t>(bytes));
    stats_detail::bump(l.c->allocs, 1, l.owned);
    stats_detail::bump(l.c->bytes, bytes, l.owned);
    stats_detail::bump(l.c->api[static_cast<std::size_t>(api)], 1, l.owned);
    record_ns(l, ns, 1);
  }
  void on_free(std::size_t bytes, std::uint64_t ns) {
    Local l = local();
    add_live(l, -static_cast<std::int64_t>(bytes));
    stats_detail::bump(l.c->frees, 1, l.owned);
    record_ns(l, ns, 1);
  }
  // A live block freed by the driver with its context (a reset): a free, but not a timed one.
  void on_dropped(std::size_t bytes) {
    Local l = local();
    add_live(l, -static_cast<std::int64_t>(bytes));
    stats_detail::bump(l.c->frees, 1, l.owned);
  }
  void on_failure() { add(&stats_detail::Counters::failures); }
  // Pool-style backends report whether a request was served from memory they already held.
  void on_hit() { add(&stats_detail::Counters::hits); }
  void on_miss() { add(&stats_detail::Counters::misses); }
  // Pool-style backends report the device memory they hold from the driver (live + cached) when it
  // changes, so the summary can show peak reserved next to peak live (their ratio is the cost of
  // pooling: fragmentation and cache).
  void set_reserved(std::uint64_t bytes) {
    reserved_.store(bytes, std::memory_order_relaxed);
    raise_peak(peak_reserved_, bytes);
  }

  std::uint64_t allocs() const { return sum(&stats_detail::Counters::allocs); }
  std::uint64_t frees() const { return sum(&stats_detail::Counters::frees); }
  std::uint64_t failures() const { return sum(&stats_detail::Counters::failures); }
  std::uint64_t hits() const { return sum(&stats_detail::Counters::hits); }
  std::uint64_t misses() const { return sum(&stats_detail::Counters::misses); }
  std::uint64_t bytes_allocated() const { return sum(&stats_detail::Counters::bytes); }
  // Estimated total time of the calls the histogram covers (exact where every call is timed).
  std::uint64_t time_ns() const { return sum(&stats_detail::Counters::time_ns); }
  std::uint64_t latency_bucket(int i) const;
  // Calls the histogram covers (its sum), and calls since each thread's last timed one.
  std::uint64_t timed_calls() const;
  std::uint64_t untimed() const;
  std::uint64_t api_calls(Api api) const;
  std::uint64_t live_bytes() const;
  std::uint64_t peak_bytes() const;
  std::uint64_t reserved_bytes() const { return reserved_.load(std::memory_order_relaxed); }
  std::uint64_t peak_reserved_bytes() const {
    return peak_reserved_.load(std::memory_order_relaxed);
  }
  SyncCounters& sync() { return sync_; }
  const SyncCounters& sync() const { return sync_; }

 private:
  struct Local {
    stats_detail::Counters* c;
    bool owned;
  };
  Local local() {
    const int id = threads::id();
    if (__builtin_expect(id >= 0, 1))
      if (stats_detail::Counters* c = stripes_.get(id); __builtin_expect(c != nullptr, 1))
        return Local{c, true};
    return Local{&shared_, false};
  }
  void add(std::atomic<std::uint64_t> stats_detail::Counters::*field) {
    Local l = local();
    stats_detail::bump(l.c->*field, 1, l.owned);
  }
  void add_live(Local l, std::int64_t delta) {
    stats_detail::Counters& c = *l.c;
    if (__builtin_expect(l.owned, 1)) {
      c.live.store(c.live.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
      const std::int64_t pending = c.pending.load(std::memory_order_relaxed) + delta;
      if (__builtin_expect(
              pending < stats_detail::kPublishBytes && pending > -stats_detail::kPublishBytes, 1)) {
        c.pending.store(pending, std::memory_order_relaxed);
        const std::int64_t mine = c.seen.load(std::memory_order_relaxed) + pending;
        if (delta > 0 && mine > c.peak.load(std::memory_order_relaxed))
          c.peak.store(mine, std::memory_order_relaxed);
        return;
      }
      c.pending.store(0, std::memory_order_relaxed);
      publish(c, pending);
      return;
    }
    c.live.fetch_add(delta, std::memory_order_relaxed);
    raise_peak(peak_, published_.fetch_add(delta, std::memory_order_relaxed) + delta);
  }
  // Adds an owned stripe's unpublished bytes to the shared counter (rare: see kPublishBytes).
  void publish(stats_detail::Counters& c, std::int64_t pending);
  void record_time(const Call& call) {
    record_ns(Local{call.c, call.owned}, clock::to_ns(clock::ticks() - call.t0), call.weight);
  }
  void record_ns(Local l, std::uint64_t ns, std::uint32_t weight) {
    stats_detail::bump(l.c->time_ns, ns * weight, l.owned);
    const int bucket = ns == 0 ? 0 : 63 - __builtin_clzll(ns);
    stats_detail::bump(l.c->latency[bucket < kLatencyBuckets ? bucket : kLatencyBuckets - 1],
                       weight, l.owned);
  }
  std::uint64_t sum(std::atomic<std::uint64_t> stats_detail::Counters::*field) const;
  template <class F>
  void each_stripe(F&& f) const {
    stripes_.for_each(f);
    f(shared_);
  }

  // Written by every thread, but only about once per kPublishBytes of allocation: a line of their
  // own, away from the stripe pages every call reads.
  alignas(64) std::atomic<std::int64_t> published_{0};
  std::atomic<std::int64_t> peak_{0};
  alignas(64) std::atomic<std::uint64_t> reserved_{0};
  std::atomic<std::uint64_t> peak_reserved_{0};
  alignas(64) threads::PerThread<stats_detail::Counters> stripes_;
  mutable stats_detail::Counters shared_;  // threads without an id
  alignas(64) SyncCounters sync_;
};

class BackendStats {
 public:
  DeviceStats& device(int d) { return devices_[index(d)]; }
  const DeviceStats& device(int d) const { return devices_[index(d)]; }
  // Calls by API over every device, for the summary's "by API" line.
  std::uint64_t api_calls(Api api) const {
    std::uint64_t n = 0;
    for (const DeviceStats& d : devices_) n += d.api_calls(api);
    return n;
  }

 private:
  static std::size_t index(int d) {
    return d >= 0 && static_cast<std::size_t>(d) < kMaxDevices ? static_cast<std::size_t>(d) : 0;
  }
  std::array<DeviceStats, kMaxDevices> devices_{};
};

}  // namespace allocshim
