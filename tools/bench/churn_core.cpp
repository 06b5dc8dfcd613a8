// churn_core: alloc_latency --threads's churn (each thread frees one of four live blocks and
// allocates one of a random size, 256 B..4 MiB log-uniform, for a fixed time) through the shim's
// core on the real driver table: no cudart, no exported wrapper, no LD_PRELOAD. Beside
// alloc_latency --threads under the shim (cudart + wrapper + core) and alloc_latency --threads
// --driver under the shim (wrapper + core), it says which layer stops the scaling. `--backend-only`
// calls the backend's allocate/deallocate instead of Core::alloc/free (no policy, registry or
// budget): what the backend alone scales to.
//
// Usage: churn_core [--backend B] [--free-sync S] [--threads LIST] [--duration-ms MS]
//                   [--backend-only]
// Defaults: vmm, none, 1,2,4,8,16, 250. One JSON line per thread count, then a table.
// Exit status: 0 done, 1 a driver call failed, 2 usage, 77 no GPU or driver.
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backends/vmm.h"
#include "core/core.h"
#include "driver/real_driver.h"
#include "splitmix.h"

namespace allocshim {
namespace {

using Clock = std::chrono::steady_clock;

using Rng = bench::SplitMix;  // alloc_latency's sizes

struct Options {
  std::string backend = "vmm", free_sync = "none";
  std::vector<int> threads{1, 2, 4, 8, 16};
  double duration_ms = 250;
  bool backend_only = false;
};

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--backend-only") {
      o.backend_only = true;
      continue;
    }
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (a == "--backend")
      o.backend = v;
    else if (a == "--free-sync")
      o.free_sync = v;
    else if (a == "--duration-ms")
      o.duration_ms = std::atof(v);
    else if (a == "--threads") {
      o.threads.clear();
      for (const char* p = v; *p;) {
        char* end = nullptr;
        const long n = std::strtol(p, &end, 10);
        if (end == p || n <= 0 || n > 1024) return false;
        o.threads.push_back(static_cast<int>(n));
        p = *end == ',' ? end + 1 : end;
      }
    } else {
      return false;
    }
  }
  return !o.threads.empty() && o.duration_ms > 0;
}

struct PerThread {
  long pairs = 0;
  int failed = 0;
};

// One churn thread: the core's calls, or the backend's with the blocks' records kept here.
void worker(int index, Context ctx, const Driver& d, Core& core, Backend* backend, FreeSync sync,
            std::atomic<int>& ready, const std::atomic<bool>& go, const std::atomic<bool>& stop,
            PerThread& out) {
  d.ctx_set_current(ctx);
  // Counted here, written to `out` once at the end: neighbouring threads' results share a line.
  int failed = 0;
  Rng rng{0x5eedu + 0x1000u * static_cast<std::uint64_t>(index)};
  DevPtr slot[4] = {};
  Block blocks[4] = {};
  auto alloc = [&](int k, std::size_t size) {
    AllocRequest req;
    req.size = size;
    if (backend == nullptr) {
      failed += core.alloc(req, &slot[k]) != res::ok;
      return;
    }
    std::uint64_t cookie = 0;
    failed += backend->allocate(req, sync, &slot[k], &cookie) != res::ok;
    blocks[k] = Block{size, 0, 0, Api::alloc, sync, cookie};
  };
  auto release = [&](int k) {
    if (slot[k] == 0) return;
    if (backend == nullptr)
      core.free(slot[k], FreeRequest{});
    else
      backend->deallocate(slot[k], blocks[k], FreeRequest{});
    slot[k] = 0;
  };
  for (int i = 0; i < 16; ++i) {
    release(i % 4);
    alloc(i % 4, rng.log_size(8, 22));
  }
  ready.fetch_add(1);
  while (!go.load(std::memory_order_acquire)) {}
  long pairs = 0;
  for (long i = 0; !stop.load(std::memory_order_relaxed); ++i, ++pairs) {
    const int k = static_cast<int>(i % 4);
    const std::size_t size = rng.log_size(8, 22);
    release(k);
    alloc(k, size);
  }
  for (int k = 0; k < 4; ++k) release(k);
  out.pairs = pairs;
  out.failed = failed;
}

}  // namespace
}  // namespace allocshim

int main(int argc, char** argv) {
  using namespace allocshim;
  Options o;
  if (!parse(argc, argv, o)) {
    std::printf(
        "usage: %s [--backend B] [--free-sync S] [--threads LIST] [--duration-ms MS] [--backend-only]\n",
        argv[0]);
    return 2;
  }
  std::string error;
  const Driver* dp = load_real_driver(::dlsym, true, error);
  if (dp == nullptr || dp->init(0) != res::ok) {
    std::printf("SKIPPED: no GPU/driver: %s\n", error.empty() ? "cuInit failed" : error.c_str());
    return 77;
  }
  const Driver& d = *dp;
  Context ctx = nullptr;
  if (d.primary_ctx_retain(&ctx, 0) != res::ok || d.ctx_set_current(ctx) != res::ok) {
    std::printf("FAIL: no primary context on device 0\n");
    return 1;
  }
  policy::Policy p = policy::default_policy();
  std::vector<policy::Diagnostic> errors;
  const std::string conf = "free_sync=" + o.free_sync;
  if (!policy::apply_overrides(p, o.backend.c_str(), conf.c_str(), errors)) {
    std::printf("usage: --backend %s --free-sync %s is not a valid override\n", o.backend.c_str(),
                o.free_sync.c_str());
    return 2;
  }
  Core core(d, p);
  // The backend the policy's default names, for --backend-only and its vmm introspection.
  Backend* backend = nullptr;
  for (std::size_t i = 0; i < core.backend_count(); ++i)
    if (core.backend(i).name() == p.backends[static_cast<std::size_t>(p.default_backend)].name)
      backend = const_cast<Backend*>(&core.backend(i));
  const FreeSync sync = p.default_free_sync;
  if (o.backend_only && backend == nullptr) {
    std::printf("FAIL: no backend named %s\n", o.backend.c_str());
    return 1;
  }
  struct Row {
    int threads;
    double rate;
    double locked;
  };
  std::vector<Row> rows;
  int failed = 0;
  for (int n : o.threads) {
    const std::uint64_t locked0 = backend ? vmm_info(*backend, 0).locked_calls : 0;
    std::vector<PerThread> out(static_cast<std::size_t>(n));
    std::atomic<int> ready{0};
    std::atomic<bool> go{false}, stop{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < n; ++t)
      pool.emplace_back(worker, t, ctx, std::cref(d), std::ref(core),
                        o.backend_only ? backend : nullptr, sync, std::ref(ready), std::cref(go),
                        std::cref(stop), std::ref(out[static_cast<std::size_t>(t)]));
    while (ready.load() < n) std::this_thread::yield();
    const auto t0 = Clock::now();
    go.store(true, std::memory_order_release);
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(o.duration_ms * 1e3)));
    stop.store(true);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    for (auto& th : pool) th.join();
    long pairs = 0;
    for (const PerThread& t : out) pairs += t.pairs, failed += t.failed;
    const std::uint64_t locked = backend ? vmm_info(*backend, 0).locked_calls - locked0 : 0;
    const Row r{n, static_cast<double>(pairs) / seconds,
                pairs ? static_cast<double>(locked) / (2.0 * pairs) : 0};
    std::printf(
        "{\"bench\":\"churn_core\",\"backend\":\"%s\",\"free_sync\":\"%s\",\"via\":\"%s\",\"threads\":%d,"
        "\"pairs\":%ld,\"pairs_per_s\":%.1f,\"locked_share\":%.5f}\n",
        o.backend.c_str(), o.free_sync.c_str(), o.backend_only ? "backend" : "core", n, pairs,
        r.rate, r.locked);
    std::fflush(stdout);
    rows.push_back(r);
  }
  std::printf("\n%8s %14s %14s\n", "threads", "pairs/s", "locked calls");
  for (const Row& r : rows) std::printf("%8d %14.0f %13.2f%%\n", r.threads, r.rate, 100 * r.locked);
  if (failed) {
    std::printf("FAIL: %d allocations failed\n", failed);
    return 1;
  }
  return 0;
}
