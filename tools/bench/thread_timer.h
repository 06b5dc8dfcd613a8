// The harness the null-driver benchmarks share (core_overhead, launch_overhead): THREADS threads
// start together, each runs its own loop of OPS operations, and the result is the mean over
// threads of nanoseconds per operation; and the operation-count argument they take.
#pragma once

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

namespace allocshim::bench {

// make_loop(t) runs on thread t before the start and returns the loop to time: a callable taking
// the operation count.
template <class MakeLoop>
double ns_per_op(int threads, long ops, MakeLoop make_loop) {
  std::vector<std::thread> pool;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<double> per_thread(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto loop = make_loop(t);
      ++ready;
      while (!go.load()) {}
      const auto t0 = std::chrono::steady_clock::now();
      loop(ops);
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
      per_thread[static_cast<std::size_t>(t)] = took.count() * 1e9 / static_cast<double>(ops);
    });
  }
  while (ready.load() < threads) {}
  go = true;
  for (auto& th : pool) th.join();
  double sum = 0;
  for (double v : per_thread) sum += v;
  return sum / threads;
}

// A count argument: digits only, at least 16 (one operation per thread of the largest row).
inline bool parse_count(const char* s, long* out) {
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || errno != 0 || n < 16) return false;
  *out = n;
  return true;
}

}  // namespace allocshim::bench
