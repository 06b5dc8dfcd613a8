// alloc_latency: what a device allocation costs the host, in one of four workloads. It knows nothing
// about allocshim: run it natively, then under `allocshim run`, and compare (run_benchmarks.py).
//
//   alloc_latency [--sizes LIST]           cudaMalloc + cudaFree pairs, per size (default mode)
//   alloc_latency --async [--sizes LIST]   cudaMallocAsync + cudaFreeAsync on the legacy stream, from
//                                          the default pool with release threshold max; also the same
//                                          pair followed by a legacy-stream synchronize
//   alloc_latency --threads LIST           churn: N host threads each freeing one of four live blocks
//                                          and allocating a new one of a mixed size, for a fixed time,
//                                          with cudaMalloc + cudaFree; with --async, cudaMallocAsync +
//                                          cudaFreeAsync on a non-blocking stream per thread (default
//                                          pool, release threshold max); with --driver, cuMemAlloc_v2 +
//                                          cuMemFree_v2 called directly (entry points from
//                                          cudaGetDriverEntryPointByVersion): the runtime's own share
//   alloc_latency --mixed                  fragmentation workload: a deterministic pseudo-random live
//                                          set of blocks of 256 B..64 MiB; prints the peak live bytes
// Options: --budget-ms MS (measuring time per size, default 400), --min-reps N (20), --max-reps N
// (200000), --duration-ms MS (per thread count, default 300), --mixed-ops N (20000), --mixed-cap
// BYTES (peak live bound, default 2 GiB), --seed N, --quick (tiny budgets: a smoke test).
//
// Each result is one JSON line starting with {"bench": (for scripts), followed by a human table.
// Times are host wall-clock (steady_clock) around the API calls: no device work is queued, so the
// calls' own cost is what is measured. Each latency sample is one pair; even iterations time the pair
// with two clock reads, odd ones time alloc and free apart (three reads), interleaved so both see the
// same conditions. clock_overhead_ns (printed) is the cost of one clock read, included once in each
// pair sample.
// Exit status: 0 done, 1 a CUDA call failed, 2 usage, 77 no GPU or driver.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "examples/example_check.h"
#include "splitmix.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;
constexpr std::size_t kDefaultSizes[] = {256,       4 * kKiB,   64 * kKiB, kMiB,
                                         16 * kMiB, 256 * kMiB, kGiB};
constexpr int kChurnSlots = 4;  // live blocks per churn thread

std::int64_t ns_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

std::atomic<long> g_allocations{0}, g_frees{0};

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, bytes));
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void device_free(void* p) {
  CHECK(cudaFree(p));
  g_frees.fetch_add(1, std::memory_order_relaxed);
}

using Rng = allocshim::bench::SplitMix;

struct Summary {
  std::int64_t median = 0, p90 = 0, min = 0;
  double mean = 0;
};

Summary summarize(std::vector<std::int64_t>& v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  s.p90 = v[std::min(n - 1, static_cast<std::size_t>(std::ceil(0.9 * static_cast<double>(n))) - 1)];
  s.min = v.front();
  double sum = 0;
  for (std::int64_t x : v) sum += static_cast<double>(x);
  s.mean = sum / static_cast<double>(n);
  return s;
}

std::string human_size(std::size_t b) {
  char buf[32];
  if (b >= kGiB && b % kGiB == 0)
    std::snprintf(buf, sizeof buf, "%zu GiB", b / kGiB);
  else if (b >= kMiB && b % kMiB == 0)
    std::snprintf(buf, sizeof buf, "%zu MiB", b / kMiB);
  else if (b >= kKiB && b % kKiB == 0)
    std::snprintf(buf, sizeof buf, "%zu KiB", b / kKiB);
  else
    std::snprintf(buf, sizeof buf, "%zu B", b);
  return buf;
}

struct Options {
  enum class Mode { sync, async, threads, mixed } mode = Mode::sync;
  enum class Churn { malloc, async, driver } churn = Churn::malloc;  // what --threads calls
  std::vector<std::size_t> sizes{std::begin(kDefaultSizes), std::end(kDefaultSizes)};
  std::vector<int> threads;
  double budget_ms = 400, duration_ms = 300;
  long min_reps = 20, max_reps = 200000, mixed_ops = 20000;
  std::size_t mixed_cap = 2 * kGiB;
  std::uint64_t seed = 0x5eed;
};

// A size such as "256", "4KiB", "64K", "1MiB", "1G".
bool parse_size(const char* s, std::size_t* out) {
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (end == s || v <= 0) return false;
  std::string unit(end);
  double mul = 1;
  if (unit == "" || unit == "B")
    mul = 1;
  else if (unit == "K" || unit == "KiB")
    mul = kKiB;
  else if (unit == "M" || unit == "MiB")
    mul = kMiB;
  else if (unit == "G" || unit == "GiB")
    mul = kGiB;
  else
    return false;
  *out = static_cast<std::size_t>(v * mul);
  return *out > 0;
}

template <class T, class F>
bool parse_list(const char* s, std::vector<T>& out, F parse_one) {
  out.clear();
  std::string all(s);
  std::size_t start = 0;
  while (start <= all.size()) {
    const std::size_t comma = std::min(all.find(',', start), all.size());
    T v{};
    if (!parse_one(all.substr(start, comma - start).c_str(), &v)) return false;
    out.push_back(v);
    start = comma + 1;
  }
  return !out.empty();
}

bool parse_args(int argc, char** argv, Options& o) {
  auto number = [](const char* s, double* v) {
    char* end = nullptr;
    *v = std::strtod(s, &end);
    return end != s && *end == '\0' && *v >= 0;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    double v = 0;
    if (a == "--async")
      o.mode = Options::Mode::async, o.churn = Options::Churn::async;
    else if (a == "--driver")
      o.churn = Options::Churn::driver;
    else if (a == "--mixed")
      o.mode = Options::Mode::mixed;
    else if (a == "--quick") {
      o.budget_ms = 20, o.duration_ms = 30, o.min_reps = 5, o.max_reps = 2000, o.mixed_ops = 400;
      o.mixed_cap = 256 * kMiB;
    } else if (!next)
      return false;
    else if (a == "--threads") {
      o.mode = Options::Mode::threads;
      if (!parse_list<int>(next, o.threads, [](const char* s, int* t) {
            *t = std::atoi(s);
            return *t > 0 && *t <= 1024;
          }))
        return false;
      ++i;
    } else if (a == "--sizes") {
      if (!parse_list<std::size_t>(next, o.sizes, parse_size)) return false;
      ++i;
    } else if (a == "--mixed-cap") {
      if (!parse_size(next, &o.mixed_cap)) return false;
      ++i;
    } else if (number(next, &v)) {
      ++i;
      if (a == "--budget-ms")
        o.budget_ms = v;
      else if (a == "--duration-ms")
        o.duration_ms = v;
      else if (a == "--min-reps")
        o.min_reps = std::max(1l, static_cast<long>(v));
      else if (a == "--max-reps")
        o.max_reps = std::max(1l, static_cast<long>(v));
      else if (a == "--mixed-ops")
        o.mixed_ops = std::max(1l, static_cast<long>(v));
      else if (a == "--seed")
        o.seed = static_cast<std::uint64_t>(v);
      else
        return false;
    } else {
      return false;
    }
  }
  o.max_reps = std::max(o.max_reps, o.min_reps);
  if (!o.threads.empty())
    o.mode = Options::Mode::threads;  // --async or --driver pick its calls
  else if (o.churn == Options::Churn::driver)
    return false;
  return true;
}

// ---- latency: one API pair per sample --------------------------------------------------------

enum class Api { malloc, malloc_async, malloc_async_sync };
const char* api_name(Api a) {
  switch (a) {
    case Api::malloc: return "malloc";
    case Api::malloc_async: return "malloc_async";
    case Api::malloc_async_sync: return "malloc_async_sync";
  }
  return "?";
}

void* api_alloc(Api api, std::size_t bytes) {
  if (api == Api::malloc) return device_alloc(bytes);
  void* p = nullptr;
  CHECK(cudaMallocAsync(&p, bytes, cudaStreamLegacy));
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void api_free(Api api, void* p) {
  if (api == Api::malloc) return device_free(p);
  CHECK(cudaFreeAsync(p, cudaStreamLegacy));
  g_frees.fetch_add(1, std::memory_order_relaxed);
  // What a caller pays to know the free is done: the async pair plus a legacy-stream sync.
  if (api == Api::malloc_async_sync) CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

struct LatencyRow {
  Api api;
  std::size_t size;
  long reps, warmup;
  Summary pair, alloc, free;
  cudaError_t error;  // of the first allocation: the size is not measured
};

LatencyRow measure_latency(Api api, std::size_t size, const Options& o) {
  LatencyRow row{api, size, 0, 0, {}, {}, {}, cudaSuccess};
  // An allocator that cannot serve one size (a backend's limit, a full card) should not cost the
  // other sizes their numbers: the first allocation is tried, and a refusal is reported.
  void* probe = nullptr;
  row.error = api == Api::malloc ? cudaMalloc(&probe, size)
                                 : cudaMallocAsync(&probe, size, cudaStreamLegacy);
  if (row.error != cudaSuccess) {
    (void)cudaGetLastError();  // allocation failures are not sticky; clear the last error anyway
    return row;
  }
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  api_free(api, probe);
  // Warm-up: the first pairs pay for pool growth, mappings and caches; a tenth of the budget.
  const auto w0 = Clock::now();
  while (row.warmup < std::max(10l, o.max_reps / 10) &&
         (row.warmup < 10 || ns_between(w0, Clock::now()) < o.budget_ms * 1e5)) {
    api_free(api, api_alloc(api, size));
    ++row.warmup;
  }
  if (api != Api::malloc) CHECK(cudaStreamSynchronize(cudaStreamLegacy));

  std::vector<std::int64_t> pair_ns, alloc_ns, free_ns;
  pair_ns.reserve(static_cast<std::size_t>(o.max_reps / 2 + 1));
  alloc_ns.reserve(pair_ns.capacity());
  free_ns.reserve(pair_ns.capacity());
  const std::int64_t budget_ns = static_cast<std::int64_t>(o.budget_ms * 1e6);
  const auto start = Clock::now();
  for (long i = 0; i < o.max_reps; ++i) {
    Clock::time_point end;
    if (i % 2 == 0) {
      const auto t0 = Clock::now();
      void* p = api_alloc(api, size);
      api_free(api, p);
      end = Clock::now();
      pair_ns.push_back(ns_between(t0, end));
    } else {
      const auto t0 = Clock::now();
      void* p = api_alloc(api, size);
      const auto t1 = Clock::now();
      api_free(api, p);
      end = Clock::now();
      alloc_ns.push_back(ns_between(t0, t1));
      free_ns.push_back(ns_between(t1, end));
    }
    row.reps = i + 1;
    // Stream-ordered frees queue nothing here, but keep the stream drained anyway, off the clock.
    if (api == Api::malloc_async && i % 1024 == 1023)
      CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    if (row.reps >= o.min_reps && ns_between(start, end) >= budget_ns) break;
  }
  if (api != Api::malloc) CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  row.pair = summarize(pair_ns);
  row.alloc = summarize(alloc_ns);
  row.free = summarize(free_ns);
  return row;
}

int run_latency(const Options& o, bool async) {
  if (async) {
    int supported = 0, dev = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev));
    if (!supported) {
      std::printf("SKIPPED: the device has no memory pools (cudaMallocAsync)\n");
      return 77;
    }
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
    std::uint64_t threshold =
        UINT64_MAX;  // keep everything, so every pair after the first is a warm-pool hit
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  const Api apis[] = {async ? Api::malloc_async : Api::malloc, Api::malloc_async_sync};
  std::vector<LatencyRow> rows;
  for (Api api : apis) {
    if (api == Api::malloc_async_sync && !async) continue;
    for (std::size_t size : o.sizes) {
      std::size_t free_b = 0, total_b = 0;
      CHECK(cudaMemGetInfo(&free_b, &total_b));
      if (size > free_b / 2) {
        std::printf(
            "{\"bench\":\"latency\",\"api\":\"%s\",\"size\":%zu,\"skipped\":\"only %zu bytes free\"}\n",
            api_name(api), size, free_b);
        continue;
      }
      const LatencyRow r = measure_latency(api, size, o);
      if (r.error != cudaSuccess) {
        std::printf("{\"bench\":\"latency\",\"api\":\"%s\",\"size\":%zu,\"error\":\"%s: %s\"}\n",
                    api_name(api), size, cudaGetErrorName(r.error), cudaGetErrorString(r.error));
        continue;
      }
      std::printf(
          "{\"bench\":\"latency\",\"api\":\"%s\",\"size\":%zu,\"reps\":%ld,\"warmup\":%ld,"
          "\"pair_median_ns\":%" PRId64 ",\"pair_p90_ns\":%" PRId64 ",\"pair_min_ns\":%" PRId64
          ",\"pair_mean_ns\":%.1f,\"alloc_median_ns\":%" PRId64 ",\"free_median_ns\":%" PRId64
          "}\n",
          api_name(api), size, r.reps, r.warmup, r.pair.median, r.pair.p90, r.pair.min, r.pair.mean,
          r.alloc.median, r.free.median);
      std::fflush(stdout);
      rows.push_back(r);
    }
  }
  std::printf("\n%-18s %9s %8s %12s %12s %12s %12s\n", "api", "size", "reps", "pair med us",
              "pair p90 us", "alloc med us", "free med us");
  for (const LatencyRow& r : rows)
    std::printf("%-18s %9s %8ld %12.3f %12.3f %12.3f %12.3f\n", api_name(r.api),
                human_size(r.size).c_str(), r.reps, r.pair.median / 1e3, r.pair.p90 / 1e3,
                r.alloc.median / 1e3, r.free.median / 1e3);
  return 0;
}

// ---- churn: host threads allocating and freeing at once ----------------------------------------

// Keeps at most `cap` samples spread evenly over the whole run: when full, drop every other one and
// record half as often.
struct Sampler {
  std::vector<std::int64_t> v;
  std::size_t cap = 1 << 16;
  std::uint64_t stride = 1, seen = 0;
  void add(std::int64_t x) {
    if (seen++ % stride != 0) return;
    if (v.size() == cap) {
      for (std::size_t i = 0; i < cap / 2; ++i) v[i] = v[2 * i];
      v.resize(cap / 2);
      stride *= 2;
      if ((seen - 1) % stride != 0) return;
    }
    v.push_back(x);
  }
};

struct ChurnThread {
  Sampler samples;
  long pairs = 0;
  Clock::time_point end;
};

// The driver's entry points, typed here (cuda.h is not needed for two calls): CUresult is an enum,
// CUdeviceptr an unsigned 64-bit integer.
using CuMemAlloc = int (*)(unsigned long long* dptr, std::size_t bytes);
using CuMemFree = int (*)(unsigned long long dptr);
CuMemAlloc g_cu_mem_alloc = nullptr;
CuMemFree g_cu_mem_free = nullptr;

void check_cu(int r, const char* call) {
  if (r == 0) return;
  std::printf("FAIL: %s returned CUresult %d\n", call, r);
  std::fflush(stdout);
  std::exit(1);
}

// One churn thread's calls: cudaMalloc, cudaMallocAsync on its own stream, or the driver's. It
// counts them itself and adds them to the process's counts once, at the end: two shared atomics
// per pair would cap the whole process's throughput, which is what the churn measures.
struct ChurnCalls {
  Options::Churn api;
  cudaStream_t stream = nullptr;
  long allocs = 0, frees = 0;
  void* alloc(std::size_t bytes) {
    void* p = nullptr;
    if (api == Options::Churn::malloc) {
      CHECK(cudaMalloc(&p, bytes));
    } else if (api == Options::Churn::async) {
      CHECK(cudaMallocAsync(&p, bytes, stream));
    } else {
      unsigned long long d = 0;
      check_cu(g_cu_mem_alloc(&d, bytes), "cuMemAlloc_v2");
      p = reinterpret_cast<void*>(d);
    }
    ++allocs;
    return p;
  }
  void free(void* p) {
    if (api == Options::Churn::malloc)
      CHECK(cudaFree(p));
    else if (api == Options::Churn::async)
      CHECK(cudaFreeAsync(p, stream));
    else
      check_cu(g_cu_mem_free(reinterpret_cast<unsigned long long>(p)), "cuMemFree_v2");
    ++frees;
  }
  ~ChurnCalls() {
    g_allocations.fetch_add(allocs, std::memory_order_relaxed);
    g_frees.fetch_add(frees, std::memory_order_relaxed);
  }
};

const char* churn_name(Options::Churn c) {
  return c == Options::Churn::malloc  ? "malloc"
         : c == Options::Churn::async ? "malloc_async"
                                      : "driver";
}

void churn_worker(int index, int device, Options::Churn api, std::uint64_t seed,
                  std::atomic<int>& ready, const std::atomic<bool>& go,
                  const std::atomic<bool>& stop, ChurnThread& out) {
  CHECK(cudaSetDevice(device));
  ChurnCalls calls{api};
  if (api == Options::Churn::async)
    CHECK(cudaStreamCreateWithFlags(&calls.stream, cudaStreamNonBlocking));
  Rng rng{seed + 0x1000u * static_cast<std::uint64_t>(index)};
  void* slot[kChurnSlots] = {};
  // Warm-up: fill the slots and turn them over a few times before the clock starts.
  for (int i = 0; i < 4 * kChurnSlots; ++i) {
    void*& s = slot[i % kChurnSlots];
    if (s) calls.free(s);
    s = calls.alloc(rng.log_size(8, 22));
  }
  ready.fetch_add(1);
  while (!go.load(std::memory_order_acquire)) {}
  // Kept on this thread's stack while it runs: `out` shares cache lines with other threads' results.
  ChurnThread mine;
  for (long i = 0; !stop.load(std::memory_order_relaxed); ++i) {
    const std::size_t size = rng.log_size(8, 22);  // 256 B .. 4 MiB
    void*& s = slot[i % kChurnSlots];
    const auto t0 = Clock::now();
    calls.free(s);
    s = calls.alloc(size);
    mine.end = Clock::now();
    mine.samples.add(ns_between(t0, mine.end));
    ++mine.pairs;
  }
  out = std::move(mine);
  for (void* s : slot) calls.free(s);
  if (calls.stream != nullptr) {
    CHECK(cudaStreamSynchronize(calls.stream));
    CHECK(cudaStreamDestroy(calls.stream));
  }
}

int run_threads(const Options& o) {
  int device = 0;
  CHECK(cudaGetDevice(&device));
  if (o.churn == Options::Churn::async) {
    int supported = 0;
    CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device));
    if (!supported) {
      std::printf("SKIPPED: the device has no memory pools (cudaMallocAsync)\n");
      return 77;
    }
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    std::uint64_t threshold = UINT64_MAX;  // a warm pool, as in --async
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  } else if (o.churn == Options::Churn::driver) {
    cudaDriverEntryPointQueryResult found{};
    CHECK(cudaGetDriverEntryPointByVersion("cuMemAlloc", reinterpret_cast<void**>(&g_cu_mem_alloc),
                                           12000, cudaEnableDefault, &found));
    CHECK(cudaGetDriverEntryPointByVersion("cuMemFree", reinterpret_cast<void**>(&g_cu_mem_free),
                                           12000, cudaEnableDefault, &found));
    if (g_cu_mem_alloc == nullptr || g_cu_mem_free == nullptr) {
      std::printf("FAIL: the driver has no cuMemAlloc/cuMemFree entry point\n");
      return 1;
    }
  }
  struct Row {
    int threads;
    long pairs;
    double seconds;
    Summary pair;
  };
  std::vector<Row> rows;
  for (int n : o.threads) {
    std::vector<ChurnThread> out(static_cast<std::size_t>(n));
    std::atomic<int> ready{0};
    std::atomic<bool> go{false}, stop{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < n; ++t)
      pool.emplace_back(churn_worker, t, device, o.churn, o.seed, std::ref(ready), std::cref(go),
                        std::cref(stop), std::ref(out[static_cast<std::size_t>(t)]));
    while (ready.load() < n) std::this_thread::yield();
    const auto start = Clock::now();
    go.store(true, std::memory_order_release);
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(o.duration_ms * 1e3)));
    stop.store(true);
    for (auto& th : pool) th.join();
    Row r{n, 0, 0, {}};
    Clock::time_point last = start;
    std::vector<std::int64_t> all;
    for (auto& t : out) {
      r.pairs += t.pairs;
      if (t.pairs) last = std::max(last, t.end);
      all.insert(all.end(), t.samples.v.begin(), t.samples.v.end());
    }
    r.seconds = static_cast<double>(ns_between(start, last)) / 1e9;
    r.pair = summarize(all);
    const double rate = r.seconds > 0 ? static_cast<double>(r.pairs) / r.seconds : 0;
    std::printf(
        "{\"bench\":\"churn\",\"api\":\"%s\",\"threads\":%d,\"pairs\":%ld,\"seconds\":%.6f,\"pairs_per_s\":%.1f,"
        "\"pair_median_ns\":%" PRId64 ",\"pair_p90_ns\":%" PRId64 ",\"samples\":%zu}\n",
        churn_name(o.churn), n, r.pairs, r.seconds, rate, r.pair.median, r.pair.p90, all.size());
    std::fflush(stdout);
    rows.push_back(r);
  }
  std::printf("\n%8s %10s %10s %14s %12s %12s\n", "threads", "pairs", "seconds", "pairs/s",
              "pair med us", "pair p90 us");
  for (const Row& r : rows)
    std::printf("%8d %10ld %10.3f %14.0f %12.3f %12.3f\n", r.threads, r.pairs, r.seconds,
                r.seconds > 0 ? static_cast<double>(r.pairs) / r.seconds : 0.0, r.pair.median / 1e3,
                r.pair.p90 / 1e3);
  return 0;
}

// ---- mixed: a live set that grows and shrinks, for fragmentation ------------------------------

int run_mixed(const Options& o) {
  std::size_t free_b = 0, total_b = 0;
  CHECK(cudaMemGetInfo(&free_b, &total_b));
  std::size_t cap = o.mixed_cap;
  // Leave room for a pooling backend's overhead and for others on the card.
  while (cap > 64 * kMiB && cap > free_b / 3) cap /= 2;
  if (cap != o.mixed_cap)
    std::printf("note: --mixed-cap lowered from %zu to %zu bytes (%zu bytes free)\n", o.mixed_cap,
                cap, free_b);

  // Phases: the live-set target moves (fill, drain, refill...), and every other phase draws mostly
  // small blocks, so large blocks must later fit around the small ones left behind.
  const double targets[] = {1.0, 0.35, 0.85, 0.2, 0.95, 0.5};
  constexpr int kPhases = sizeof targets / sizeof targets[0];
  struct Block {
    void* p;
    std::size_t size;
  };
  std::vector<Block> live;
  std::size_t live_bytes = 0, peak = 0;
  long allocs = 0, frees = 0;
  std::vector<std::int64_t> alloc_ns, free_ns;
  Rng rng{o.seed};
  auto free_random = [&] {
    const std::size_t k = rng.below(live.size());
    const auto t0 = Clock::now();
    device_free(live[k].p);
    free_ns.push_back(ns_between(t0, Clock::now()));
    live_bytes -= live[k].size;
    live[k] = live.back();
    live.pop_back();
    ++frees;
  };
  const auto start = Clock::now();
  for (long op = 0; op < o.mixed_ops; ++op) {
    const int phase = static_cast<int>(op * kPhases / o.mixed_ops);
    const double target = targets[phase] * static_cast<double>(cap);
    const bool grow = static_cast<double>(live_bytes) < target;
    if (!live.empty() && rng.unit() >= (grow ? 0.75 : 0.25)) {
      free_random();
      continue;
    }
    const bool small = phase % 2 == 1 && rng.unit() < 0.8;
    const std::size_t size =
        small ? rng.log_size(8, 20) : rng.log_size(8, 26);  // 256 B..1 MiB or ..64 MiB
    while (!live.empty() && live_bytes + size > cap) free_random();
    const auto t0 = Clock::now();
    void* p = device_alloc(size);
    alloc_ns.push_back(ns_between(t0, Clock::now()));
    live.push_back({p, size});
    live_bytes += size;
    peak = std::max(peak, live_bytes);
    ++allocs;
  }
  const double seconds = static_cast<double>(ns_between(start, Clock::now())) / 1e9;
  const std::size_t end_live = live.size();
  while (!live.empty()) free_random();
  const Summary a = summarize(alloc_ns), f = summarize(free_ns);
  std::printf(
      "{\"bench\":\"mixed\",\"ops\":%ld,\"allocs\":%ld,\"frees\":%ld,\"cap_bytes\":%zu,"
      "\"peak_live_bytes\":%zu,\"live_blocks_at_end\":%zu,\"seconds\":%.6f,\"alloc_median_ns\":%" PRId64
      ",\"free_median_ns\":%" PRId64 ",\"seed\":%" PRIu64 "}\n",
      o.mixed_ops, allocs, frees, cap, peak, end_live, seconds, a.median, f.median, o.seed);
  std::printf(
      "\nmixed: %ld allocations, %ld frees in %.3f s; peak live %zu bytes (%.1f MiB) of a %s cap; "
      "alloc median %.3f us, free median %.3f us\n",
      allocs, frees, seconds, peak, static_cast<double>(peak) / kMiB, human_size(cap).c_str(),
      a.median / 1e3, f.median / 1e3);
  return 0;
}

std::int64_t clock_overhead_ns() {
  std::vector<std::int64_t> v;
  for (int i = 0; i < 1001; ++i) {
    const auto a = Clock::now();
    v.push_back(ns_between(a, Clock::now()));
  }
  return summarize(v).median;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse_args(argc, argv, o)) {
    std::printf(
        "usage: %s [--async | --threads N[,N...] [--async | --driver] | --mixed] [--sizes S[,S...]] [--budget-ms MS] "
        "[--min-reps N] [--max-reps N] [--duration-ms MS] [--mixed-ops N] [--mixed-cap BYTES] "
        "[--seed N] [--quick]\n",
        argv[0]);
    return 2;
  }
  exit_unless_gpu();
  int device = 0, driver = 0, runtime = 0;
  CHECK(cudaGetDevice(&device));
  // Create the context before anything is timed (cudaFree(nullptr) would do too, but reaches the
  // shim as a free of a pointer it does not know).
  CHECK(cudaSetDevice(device));
  CHECK(cudaDeviceSynchronize());
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, device));
  CHECK(cudaDriverGetVersion(&driver));
  CHECK(cudaRuntimeGetVersion(&runtime));
  std::size_t free_b = 0, total_b = 0;
  CHECK(cudaMemGetInfo(&free_b, &total_b));
  std::string name;
  for (const char* c = prop.name; *c; ++c)
    if (*c != '"' && *c != '\\' && static_cast<unsigned char>(*c) >= 0x20) name += *c;
  const char* mode = o.mode == Options::Mode::sync      ? "sync"
                     : o.mode == Options::Mode::async   ? "async"
                     : o.mode == Options::Mode::threads ? "threads"
                                                        : "mixed";
  std::printf(
      "{\"bench\":\"info\",\"mode\":\"%s\",\"device\":%d,\"name\":\"%s\",\"cc\":\"%d.%d\","
      "\"driver_version\":%d,\"runtime_version\":%d,\"mem_free\":%zu,\"mem_total\":%zu,"
      "\"clock_overhead_ns\":%" PRId64 ",\"budget_ms\":%g,\"max_reps\":%ld}\n",
      mode, device, name.c_str(), prop.major, prop.minor, driver, runtime, free_b, total_b,
      clock_overhead_ns(), o.budget_ms, o.max_reps);
  std::fflush(stdout);

  int rc = 0;
  switch (o.mode) {
    case Options::Mode::sync: rc = run_latency(o, false); break;
    case Options::Mode::async: rc = run_latency(o, true); break;
    case Options::Mode::threads: rc = run_threads(o); break;
    case Options::Mode::mixed: rc = run_mixed(o); break;
  }
  if (rc != 0) return rc;
  // The same counts check_stats.py compares with the shim's statistics.
  std::printf("allocations: %ld\nfrees: %ld\n", g_allocations.load(), g_frees.load());
  std::printf("{\"bench\":\"done\",\"allocations\":%ld,\"frees\":%ld}\n", g_allocations.load(),
              g_frees.load());
  return 0;
}
