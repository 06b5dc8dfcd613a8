// What the launch hooks add to one kernel launch, with the driver's own cost taken out.
//
// A real launch costs microseconds, so the hook's nanoseconds are measured here on a null launch
// (a function that does nothing) and compared three ways per thread count:
//   direct   the null launch alone;
//   idle     what a hooked launch does when no core may move memory: one relaxed load and branch
//            (abi/hooks.cpp, submissions_watched);
//   budget   what it does while migration may move memory: enter the launch gate, scan the
//            kernel's 8 pointer parameters against 64 movable ranges (half of them pointing into
//            one, as a model's launches do), leave the gate (placement/migration.h);
//   gate     the gate alone, and scan the parameter scan alone: the budget row's two parts.
// Every thread launches the same kernel over the same ranges, as inference threads do.
//
// With --driver (needs a GPU), the direct and budget paths wrap a real cuLaunchKernel of an empty
// kernel with 8 pointer parameters, 4 into 64 MiB buffers (launch_rate's launch), alternating in
// short batches inside one process: what the hooks cost a real launch, free of the spread between
// processes that comparing launch rates suffers (each thread alternates paths for its whole life).
// Only the launch calls are timed, each batch short enough that the stream's queue never fills.
//
// Usage: launch_overhead [--driver] [launches] — prints a table, and one JSON line per row for
// scripts; --driver exits 77 without a CUDA driver or device.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "placement/migration.h"
#include "thread_timer.h"

namespace allocshim {
namespace {

// The benchmark moves nothing: migration's ledger is never asked.
struct NoMoves final : MoveLedger {
  std::size_t claim_promotion(int, std::size_t) override { return 0; }
  void release_device(int, std::size_t) override {}
  void on_moved(int, DevPtr, std::size_t, bool, std::uint64_t) override {}
  void on_move_failed(int, Result) override {}
};
NoMoves g_no_moves;

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

enum class Mode { direct, idle, budget, gate, scan };

// ns per launch, each of `threads` threads making `launches` launches.
double run(int threads, long launches, Mode mode, Migration& m, std::atomic<bool>& watched) {
  return bench::ns_per_op(threads, launches, [&](int) {
    return [&, mode](long n) {
      // Half the parameters point into movable ranges, half elsewhere (sizes, other memory).
      DevPtr args[kParams];
      void* params[kParams];
      for (int i = 0; i < kParams; ++i) {
        args[i] = i % 2 ? kBase + static_cast<DevPtr>(i) * kRange + 4096
                        : 0x1000 + static_cast<DevPtr>(i);
        params[i] = &args[i];
      }
      void* const kernel = reinterpret_cast<void*>(0x5000);
      for (long i = 0; i < n; ++i) {
        if (mode == Mode::direct ||
            (mode == Mode::idle && !watched.load(std::memory_order_relaxed))) {
          null_launch(kernel, params);
          continue;
        }
        if (mode != Mode::scan) m.gate().enter();
        if (mode != Mode::gate) m.uses().mark_launch(kernel, params, nullptr);
        null_launch(kernel, params);
        if (mode != Mode::scan) m.gate().leave();
      }
    };
  });
}

// The real driver, for --driver: the few entry points it needs, by name from libcuda (the tools
// build without the CUDA headers; CUresult is an int, handles are pointers).
struct RealDriver {
  int (*init)(unsigned);
  int (*device_get)(int*, int);
  int (*primary_retain)(void**, int);
  int (*ctx_set_current)(void*);
  int (*module_load_data)(void**, const void*);
  int (*module_get_function)(void**, void*, const char*);
  int (*mem_alloc)(DevPtr*, std::size_t);
  int (*launch)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                void**, void**);
  int (*stream_create)(void**, unsigned);
  int (*stream_sync)(void*);
  int (*stream_destroy)(void*);
  int (*param_info)(void*, std::size_t, std::size_t*, std::size_t*);
};
RealDriver g_real{};

bool load_real() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return false;
  bool ok = true;
  auto get = [&](auto& fn, const char* name) {
    void* p = dlsym(lib, name);
    ok = ok && p != nullptr;
    std::memcpy(&fn, &p, sizeof p);
  };
  get(g_real.init, "cuInit");
  get(g_real.device_get, "cuDeviceGet");
  get(g_real.primary_retain, "cuDevicePrimaryCtxRetain");
  get(g_real.ctx_set_current, "cuCtxSetCurrent");
  get(g_real.module_load_data, "cuModuleLoadData");
  get(g_real.module_get_function, "cuModuleGetFunction");
  get(g_real.mem_alloc, "cuMemAlloc_v2");
  get(g_real.launch, "cuLaunchKernel");
  get(g_real.stream_create, "cuStreamCreate");
  get(g_real.stream_sync, "cuStreamSynchronize");
  get(g_real.stream_destroy, "cuStreamDestroy_v2");
  get(g_real.param_info, "cuFuncGetParamInfo");
  return ok;
}

// An empty kernel with 8 pointer parameters, as PTX the driver compiles for the device.
constexpr const char* kEmptyKernelPtx = R"(.version 7.0
.target sm_75
.address_size 64
.visible .entry empty(.param .u64 p0, .param .u64 p1, .param .u64 p2, .param .u64 p3,
                      .param .u64 p4, .param .u64 p5, .param .u64 p6, .param .u64 p7)
{
  ret;
}
)";

// Per thread count: threads that live for the whole measurement, each on its own stream,
// rotating batches of `kBatch` launches through the direct path, the gate alone and the budget
// path (the order rotating by round), all threads in the same path at once (a barrier between
// batches). Only
// the launch calls are timed; the stream is synchronized after each batch. Alternating inside one
// thread keeps what differs between threads and processes (the CPU, the driver's memory) out of
// the comparison. Prints the mean ns per launch of each path, their difference, and the spread of
// the per-round direct/budget ratios.
int run_driver(long launches) {
  if (!load_real() || g_real.init(0) != 0) {
    std::printf("SKIPPED: no CUDA driver\n");
    return 77;
  }
  int dev = 0;
  void* ctx = nullptr;
  void* module = nullptr;
  void* kernel = nullptr;
  if (g_real.device_get(&dev, 0) != 0 || g_real.primary_retain(&ctx, dev) != 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  if (g_real.ctx_set_current(ctx) != 0 || g_real.module_load_data(&module, kEmptyKernelPtx) != 0 ||
      g_real.module_get_function(&kernel, module, "empty") != 0) {
    std::fprintf(stderr, "launch_overhead: could not load the empty kernel\n");
    return 1;
  }
  Driver d{};
  d.func_get_param_info = [](void* f, std::size_t i, std::size_t* off, std::size_t* size) {
    return static_cast<Result>(g_real.param_info(f, i, off, size));
  };
  Migration m(d, g_no_moves);
  DevPtr buffers[4] = {}, small = 0;
  for (DevPtr& b : buffers) {
    if (g_real.mem_alloc(&b, kRange) != 0) return 1;
    m.uses().add(b, kRange);
  }
  if (g_real.mem_alloc(&small, 4096) != 0) return 1;
  constexpr long kBatch = 256;
  // The paths each thread alternates between: the bare launch, inside the gate only, and the
  // budget path (the gate and the parameter scan).
  enum Path { kDirect, kGate, kBudget, kPaths };
  std::printf("%8s %8s %11s %11s %11s %11s %11s %8s %22s\n", "threads", "rounds", "direct ns",
              "gate ns", "budget ns", "gate added", "scan added", "rate", "pair ratio p10/p50/p90");
  for (int threads : {1, 8}) {
    const long rounds = std::max(1L, launches / kBatch / threads / kPaths);
    // Per path, thread and round: the batch's ns per launch.
    std::vector<std::vector<double>> ns[kPaths];
    for (auto& v : ns) v.resize(static_cast<std::size_t>(threads));
    std::atomic<bool> failed{false};
    std::barrier<> step(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        void* stream = nullptr;
        if (g_real.ctx_set_current(ctx) != 0 || g_real.stream_create(&stream, 1) != 0)
          failed = true;
        DevPtr args[kParams];
        void* params[kParams];
        for (int i = 0; i < kParams; ++i) {
          args[i] = i % 2 ? small : buffers[i / 2];
          params[i] = &args[i];
        }
        for (long round = 0; round < rounds; ++round)
          for (int cell = 0; cell < kPaths; ++cell) {
            const int path = static_cast<int>((cell + round) % kPaths);
            step.arrive_and_wait();
            if (failed) continue;
            const auto t0 = std::chrono::steady_clock::now();
            for (long i = 0; i < kBatch; ++i) {
              if (path != kDirect) m.gate().enter();
              if (path == kBudget) m.uses().mark_launch(kernel, params, nullptr);
              const int r = g_real.launch(kernel, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr);
              if (path != kDirect) m.gate().leave();
              if (r != 0) failed = true;
            }
            const double batch =
                std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0)
                    .count();
            ns[path][static_cast<std::size_t>(t)].push_back(batch / kBatch);
            if (g_real.stream_sync(stream) != 0) failed = true;
          }
        if (stream != nullptr) g_real.stream_destroy(stream);
      });
    for (auto& th : pool) th.join();
    if (failed) {
      std::fprintf(stderr, "launch_overhead: a launch failed\n");
      return 1;
    }
    double mean[kPaths] = {};
    std::vector<double> ratios;  // direct / budget, per thread and round
    for (int t = 0; t < threads; ++t)
      for (std::size_t i = 0; i < static_cast<std::size_t>(rounds); ++i) {
        for (int p = 0; p < kPaths; ++p) mean[p] += ns[p][static_cast<std::size_t>(t)][i];
        ratios.push_back(ns[kDirect][static_cast<std::size_t>(t)][i] /
                         ns[kBudget][static_cast<std::size_t>(t)][i]);
      }
    for (double& v : mean) v /= static_cast<double>(ratios.size());
    std::sort(ratios.begin(), ratios.end());
    auto at = [&](double q) {
      return ratios[static_cast<std::size_t>(q * static_cast<double>(ratios.size() - 1))];
    };
    std::printf("%8d %8ld %11.1f %11.1f %11.1f %11.1f %11.1f %8.4f %8.3f/%.3f/%.3f\n", threads,
                rounds, mean[kDirect], mean[kGate], mean[kBudget], mean[kGate] - mean[kDirect],
                mean[kBudget] - mean[kGate], mean[kDirect] / mean[kBudget], at(0.1), at(0.5),
                at(0.9));
    std::printf(
        "{\"bench\":\"launch_overhead_driver\",\"threads\":%d,\"rounds\":%ld,\"direct_ns\":%.2f,"
        "\"gate_ns\":%.2f,\"budget_ns\":%.2f,\"budget_added_ns\":%.2f,\"rate_ratio\":%.4f,"
        "\"pair_ratio_p10\":%.4f,\"pair_ratio_p50\":%.4f,\"pair_ratio_p90\":%.4f}\n",
        threads, rounds, mean[kDirect], mean[kGate], mean[kBudget], mean[kBudget] - mean[kDirect],
        mean[kDirect] / mean[kBudget], at(0.1), at(0.5), at(0.9));
  }
  return 0;
}

}  // namespace
}  // namespace allocshim

int main(int argc, char** argv) {
  using namespace allocshim;
  long launches = 5'000'000;
  const bool driver = argc > 1 && std::strcmp(argv[1], "--driver") == 0;
  const int first = driver ? 2 : 1;
  if (argc > first + 1 || (argc == first + 1 && !bench::parse_count(argv[first], &launches))) {
    std::fprintf(
        stderr,
        "usage: launch_overhead [--driver] [launches]   (a whole number from 16 up; default 5000000)\n");
    return 2;
  }
  if (driver) return run_driver(argc > first ? launches : 2'000'000);
  const Driver d = null_driver();
  Migration m(d, g_no_moves);
  for (int i = 0; i < kRanges; ++i) m.uses().add(kBase + static_cast<DevPtr>(i) * kRange, kRange);
  std::atomic<bool> watched{false};  // the hook layer's flag, off: no core may move memory
  std::printf("%8s %12s %12s %12s %14s %14s %12s %12s\n", "threads", "direct ns", "idle ns",
              "budget ns", "idle added", "budget added", "gate added", "scan added");
  for (int threads : {1, 2, 4, 8}) {
    // Best of three: the minimum is the least disturbed by other work on the machine.
    double direct = 1e30, idle = 1e30, budget = 1e30, gate = 1e30, scan = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const long per = launches / threads;
      direct = std::min(direct, run(threads, per, Mode::direct, m, watched));
      idle = std::min(idle, run(threads, per, Mode::idle, m, watched));
      budget = std::min(budget, run(threads, per, Mode::budget, m, watched));
      gate = std::min(gate, run(threads, per, Mode::gate, m, watched));
      scan = std::min(scan, run(threads, per, Mode::scan, m, watched));
    }
    std::printf("%8d %12.1f %12.1f %12.1f %14.1f %14.1f %12.1f %12.1f\n", threads, direct, idle,
                budget, idle - direct, budget - direct, gate - direct, scan - direct);
    std::printf(
        "{\"bench\":\"launch_overhead\",\"threads\":%d,\"direct_ns\":%.2f,\"idle_ns\":%.2f,"
        "\"budget_ns\":%.2f,\"idle_added_ns\":%.2f,\"budget_added_ns\":%.2f,\"gate_added_ns\":%.2f,"
        "\"scan_added_ns\":%.2f}\n",
        threads, direct, idle, budget, idle - direct, budget - direct, gate - direct,
        scan - direct);
  }
  return 0;
}
