// Allocation statistics, kept per backend and per device with relaxed atomics: the hot path pays a
// few uncontended increments, and the exit summary (core/summary.cpp) reads them once.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/types.h"

namespace allocshim {

// Latency histogram: bucket i counts calls that took [2^i, 2^(i+1)) nanoseconds.
inline constexpr int kLatencyBuckets = 32;

class DeviceStats {
 public:
  void on_alloc(std::size_t bytes, std::uint64_t ns) {
    allocs_.fetch_add(1, std::memory_order_relaxed);
    bytes_allocated_.fetch_add(bytes, std::memory_order_relaxed);
    const std::uint64_t live = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::uint64_t peak = peak_.load(std::memory_order_relaxed);
    while (live > peak && !peak_.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
    record_time(ns);
  }
  void on_free(std::size_t bytes, std::uint64_t ns) {
    frees_.fetch_add(1, std::memory_order_relaxed);
    live_.fetch_sub(bytes, std::memory_order_relaxed);
    record_time(ns);
  }
  void on_failure() { failures_.fetch_add(1, std::memory_order_relaxed); }
  // Pool-style backends report whether a request was served from memory they already held.
  void on_hit() { hits_.fetch_add(1, std::memory_order_relaxed); }
  void on_miss() { misses_.fetch_add(1, std::memory_order_relaxed); }
  // Pool-style backends report the device memory they hold from the driver (live + cached) when it
  // changes, so the summary can show peak reserved next to peak live (their ratio is the cost of
  // pooling: fragmentation and cache).
  void set_reserved(std::uint64_t bytes) {
    reserved_.store(bytes, std::memory_order_relaxed);
    std::uint64_t peak = peak_reserved_.load(std::memory_order_relaxed);
    while (bytes > peak &&
           !peak_reserved_.compare_exchange_weak(peak, bytes, std::memory_order_relaxed)) {
    }
  }

  std::uint64_t allocs() const { return allocs_.load(std::memory_order_relaxed); }
  std::uint64_t frees() const { return frees_.load(std::memory_order_relaxed); }
  std::uint64_t failures() const { return failures_.load(std::memory_order_relaxed); }
  std::uint64_t hits() const { return hits_.load(std::memory_order_relaxed); }
  std::uint64_t misses() const { return misses_.load(std::memory_order_relaxed); }
  std::uint64_t bytes_allocated() const { return bytes_allocated_.load(std::memory_order_relaxed); }
  std::uint64_t live_bytes() const { return live_.load(std::memory_order_relaxed); }
  std::uint64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  std::uint64_t time_ns() const { return time_ns_.load(std::memory_order_relaxed); }
  std::uint64_t reserved_bytes() const { return reserved_.load(std::memory_order_relaxed); }
  std::uint64_t peak_reserved_bytes() const { return peak_reserved_.load(std::memory_order_relaxed); }
  std::uint64_t latency_bucket(int i) const { return latency_[i].load(std::memory_order_relaxed); }

 private:
  void record_time(std::uint64_t ns) {
    time_ns_.fetch_add(ns, std::memory_order_relaxed);
    const int bucket = ns == 0 ? 0 : 63 - __builtin_clzll(ns);
    latency_[bucket < kLatencyBuckets ? bucket : kLatencyBuckets - 1].fetch_add(
        1, std::memory_order_relaxed);
  }

  std::atomic<std::uint64_t> allocs_{0}, frees_{0}, failures_{0}, hits_{0}, misses_{0};
  std::atomic<std::uint64_t> bytes_allocated_{0}, live_{0}, peak_{0}, time_ns_{0};
  std::atomic<std::uint64_t> reserved_{0}, peak_reserved_{0};
  std::array<std::atomic<std::uint64_t>, kLatencyBuckets> latency_{};
};

class BackendStats {
 public:
  DeviceStats& device(int d) { return devices_[index(d)]; }
  const DeviceStats& device(int d) const { return devices_[index(d)]; }
  // Calls by API, for the summary's "by API" line.
  void on_api(Api api) { by_api_[static_cast<int>(api)].fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t api_calls(Api api) const {
    return by_api_[static_cast<int>(api)].load(std::memory_order_relaxed);
  }

 private:
  static std::size_t index(int d) {
    return d >= 0 && static_cast<std::size_t>(d) < kMaxDevices ? static_cast<std::size_t>(d) : 0;
  }
  std::array<DeviceStats, kMaxDevices> devices_{};
  std::array<std::atomic<std::uint64_t>, kApiCount> by_api_{};
};

}  // namespace allocshim
