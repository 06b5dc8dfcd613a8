// What the launch hooks add to one kernel launch, with the driver's own cost taken out.
//
// A real launch costs microseconds, so the hook's nanoseconds are measured here on a null launch
// (a function that does nothing) and compared three ways per thread count:
//   direct   the null launch alone;
//   idle     what a hooked launch does when no core may move memory: one relaxed load and branch
//            (abi/hooks.cpp, submissions_watched);
//   budget   what it does while migration may move memory: enter the launch gate, scan the
//            kernel's 8 pointer parameters against 64 movable ranges (half of them pointing into
//            one, as a model's launches do), leave the gate (core/migration.h).
// Every thread launches the same kernel over the same ranges, as inference threads do.
//
// Usage: launch_overhead [launches] — prints a table, and one JSON line per row for scripts.
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/migration.h"

namespace allocshim {
namespace {

constexpr int kParams = 8;
constexpr int kRanges = 64;
constexpr DevPtr kBase = 0x7f0000000000ull;
constexpr std::size_t kRange = std::size_t{64} << 20;

Driver null_driver() {
  Driver d{};
  d.func_get_param_info = [](void*, std::size_t i, std::size_t* off, std::size_t* size) {
    if (i >= kParams) return res::invalid_value;
    *off = i * 8;
    *size = 8;
    return res::ok;
  };
  return d;
}

// The null launch: kept out of line so that the direct row pays a call as the others do.
__attribute__((noinline)) int null_launch(void* f, void** params) {
  asm volatile("" : : "r"(f), "r"(params) : "memory");
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

enum class Mode { direct, idle, budget };

// ns per launch, each of `threads` threads making `launches` launches.
double run(int threads, long launches, Mode mode, Migration& m, std::atomic<bool>& watched) {
  std::vector<std::thread> pool;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<double> per_thread(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      // Half the parameters point into movable ranges, half elsewhere (sizes, other memory).
      DevPtr args[kParams];
      void* params[kParams];
      for (int i = 0; i < kParams; ++i) {
        args[i] = i % 2 ? kBase + static_cast<DevPtr>(i) * kRange + 4096 : 0x1000 + static_cast<DevPtr>(i);
        params[i] = &args[i];
      }
      void* const kernel = reinterpret_cast<void*>(0x5000);
      ++ready;
      while (!go.load()) {
      }
      const auto t0 = std::chrono::steady_clock::now();
      for (long i = 0; i < launches; ++i) {
        if (mode == Mode::direct || (mode == Mode::idle && !watched.load(std::memory_order_relaxed))) {
          null_launch(kernel, params);
          continue;
        }
        m.gate().enter();
        m.uses().mark_launch(kernel, params, nullptr);
        null_launch(kernel, params);
        m.gate().leave();
      }
      per_thread[static_cast<std::size_t>(t)] = seconds_since(t0) * 1e9 / static_cast<double>(launches);
    });
  }
  while (ready.load() < threads) {
  }
  go = true;
  for (auto& th : pool) th.join();
  double sum = 0;
  for (double v : per_thread) sum += v;
  return sum / threads;
}

bool parse_count(const char* s, long* out) {
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || errno != 0 || n < 16) return false;
  *out = n;
  return true;
}

}  // namespace
}  // namespace allocshim

int main(int argc, char** argv) {
  using namespace allocshim;
  long launches = 5'000'000;
  if (argc > 2 || (argc == 2 && !parse_count(argv[1], &launches))) {
    std::fprintf(stderr, "usage: launch_overhead [launches]   (a whole number from 16 up; default 5000000)\n");
    return 2;
  }
  const Driver d = null_driver();
  Migration m(d);
  for (int i = 0; i < kRanges; ++i) m.uses().add(kBase + static_cast<DevPtr>(i) * kRange, kRange);
  std::atomic<bool> watched{false};  // the hook layer's flag, off: no core may move memory
  std::printf("%8s %12s %12s %12s %14s %14s\n", "threads", "direct ns", "idle ns", "budget ns", "idle added",
              "budget added");
  for (int threads : {1, 2, 4, 8}) {
    // Best of three: the minimum is the least disturbed by other work on the machine.
    double direct = 1e30, idle = 1e30, budget = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      direct = std::min(direct, run(threads, launches / threads, Mode::direct, m, watched));
      idle = std::min(idle, run(threads, launches / threads, Mode::idle, m, watched));
      budget = std::min(budget, run(threads, launches / threads, Mode::budget, m, watched));
    }
    std::printf("%8d %12.1f %12.1f %12.1f %14.1f %14.1f\n", threads, direct, idle, budget, idle - direct,
                budget - direct);
    std::printf("{\"bench\":\"launch_overhead\",\"threads\":%d,\"direct_ns\":%.2f,\"idle_ns\":%.2f,"
                "\"budget_ns\":%.2f,\"idle_added_ns\":%.2f,\"budget_added_ns\":%.2f}\n",
                threads, direct, idle, budget, idle - direct, budget - direct);
  }
  return 0;
}
