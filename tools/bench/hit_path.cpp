// hit_path: what each step of a pool hit costs on this machine, on the real driver.
//
// alloc_latency measures a whole cudaMalloc+cudaFree pair under the shim; this program takes the
// pair apart. It links the shim's core and its real driver table (no LD_PRELOAD, no cudart) and
// times, each as the mean of a batch of calls between two clock reads (median of 15 batches):
//   primitives   rdtsc, clock_gettime, a locked add, a mutex and a spin lock, a thread_local
//   driver       cuCtxGetDevice and cuCtxGetCurrent, through the table the core uses
//   core pieces  registry insert+erase, statistics of one alloc+free, policy match
//   backend      the vmm backend's allocate+deallocate (statistics included), free_sync none
//   core         Core::alloc+free with vmm and async_pool, free_sync none: everything of the hooked
//                call except the exported wrapper and cudart
// The same numbers for cudart and the wrapper come from cudart_cost (cudart_cost.cu).
//
// Usage: hit_path [--quick]. One JSON line per item ({"bench":"hit_path",...}), then a table.
// Exit status: 0 done, 1 a driver call failed, 77 no GPU or driver.
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/clock.h"
#include "core/core.h"
#include "core/registry.h"
#include "base/stats.h"
#include "driver/real_driver.h"
#include "op_timer.h"

namespace allocshim {
namespace {

bool g_quick = false;
thread_local unsigned long t_counter = 0;

double time_ops(const char* name, double ops, const std::function<void()>& body) {
  return bench::time_ops("hit_path", name, ops, g_quick, body);
}

#define CHECK(call)                                                                  \
  do {                                                                               \
    const Result r_ = (call);                                                        \
    if (r_ != res::ok) {                                                             \
      std::printf("FAIL: %s returned %d at %s:%d\n", #call, r_, __FILE__, __LINE__); \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

int run() {
  std::string error;
  const Driver* dp = load_real_driver(::dlsym, true, error);
  if (dp == nullptr) {
    std::printf("SKIPPED: no driver: %s\n", error.c_str());
    return 77;
  }
  const Driver& d = *dp;
  int count = 0;
  if (d.init(0) != res::ok || d.device_get_count(&count) != res::ok || count == 0) {
    std::printf("SKIPPED: no GPU\n");
    return 77;
  }
  Context ctx = nullptr;
  CHECK(d.primary_ctx_retain(&ctx, 0));
  CHECK(d.ctx_set_current(ctx));

  std::printf("primitives\n");
  volatile std::uint64_t sink = 0;
  time_ops("rdtsc", 1, [&] { sink = sink + clock::ticks(); });
  time_ops("clock_gettime(MONOTONIC)", 1, [&] {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    sink = sink + static_cast<std::uint64_t>(ts.tv_nsec);
  });
  std::atomic<std::uint64_t> counter{0};
  time_ops("locked add (uncontended)", 1, [&] { counter.fetch_add(1, std::memory_order_relaxed); });
  time_ops("relaxed load+store add", 1, [&] {
    counter.store(counter.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  });
  time_ops("thread_local increment", 1, [&] { ++t_counter; });
  std::mutex mutex;
  time_ops("std::mutex lock+unlock", 1, [&] {
    mutex.lock();
    mutex.unlock();
  });
  SpinLock spin;
  time_ops("SpinLock lock+unlock", 1, [&] {
    spin.lock();
    spin.unlock();
  });
  time_ops("clock::to_ns", 1, [&] { sink = sink + clock::to_ns(sink & 0xffff); });

  std::printf("driver\n");
  time_ops("cuCtxGetDevice", 1, [&] {
    int dev = 0;
    d.ctx_get_device(&dev);
    sink = sink + static_cast<std::uint64_t>(dev);
  });
  time_ops("cuCtxGetCurrent", 1, [&] {
    Context c = nullptr;
    d.ctx_get_current(&c);
    sink = sink + reinterpret_cast<std::uint64_t>(c);
  });

  std::printf("core pieces\n");
  Registry registry;
  DevPtr next = 0x7f0000000000ull;
  time_ops("registry insert+erase", 1, [&] {
    next += 256;
    registry.insert(next, Block{256, 1, 0, Api::alloc, FreeSync::none, 0});
    Block b;
    registry.erase(next, &b);
  });
  BackendStats stats;
  for (const bool sampled : {false, true}) {
    time_ops(sampled ? "stats of an alloc+free pair, sampled timing"
                     : "stats of an alloc+free pair, every call timed",
             1, [&] {
               DeviceStats& ds = stats.device(0);
               const DeviceStats::Call a = ds.begin(sampled);
               ds.on_hit();
               ds.end_alloc(a, 256, Api::alloc);
               const DeviceStats::Call f = ds.begin(sampled);
               ds.end_free(f, 256);
             });
  }
  policy::Policy vmm_none = policy::default_policy();
  std::vector<policy::Diagnostic> errors;
  if (!policy::apply_overrides(vmm_none, "vmm", "free_sync=none", errors)) {
    std::printf("FAIL: policy override\n");
    return 1;
  }
  time_ops("policy::match (vmm, no rules)", 1, [&] {
    const auto dec = policy::match(vmm_none, 256, Api::alloc, 0);
    sink = sink + static_cast<std::uint64_t>(dec.backend);
  });
  const policy::Policy& dflt = policy::default_policy();
  time_ops("policy::match (default policy)", 1, [&] {
    const auto dec = policy::match(dflt, 256, Api::alloc, 0);
    sink = sink + static_cast<std::uint64_t>(dec.backend);
  });

  const std::size_t sizes[] = {256, 1u << 20, 1u << 30};
  const char* size_names[] = {"256 B", "1 MiB", "1 GiB"};
  std::printf("vmm backend (allocate+deallocate, free_sync none)\n");
  {
    StreamTracker streams;
    std::string why;
    std::unique_ptr<Backend> vmm = make_backend(vmm_none.backends[0], d, streams, why);
    if (!vmm) {
      std::printf("FAIL: vmm backend: %s\n", why.c_str());
      return 1;
    }
    for (int i = 0; i < 3; ++i) {
      AllocRequest req;
      req.size = sizes[i];
      DevPtr p = 0;
      std::uint64_t cookie = 0;
      CHECK(vmm->allocate(req, FreeSync::none, &p, &cookie));
      vmm->deallocate(p, Block{req.size, 0, 0, Api::alloc, FreeSync::none, cookie}, FreeRequest{});
      const std::string name = std::string("vmm backend pair ") + size_names[i];
      time_ops(name.c_str(), 1, [&] {
        DevPtr q = 0;
        std::uint64_t c = 0;
        vmm->allocate(req, FreeSync::none, &q, &c);
        vmm->deallocate(q, Block{req.size, 0, 0, Api::alloc, FreeSync::none, c}, FreeRequest{});
      });
    }
  }

  std::printf("core (Core::alloc+free, free_sync none)\n");
  for (const char* backend : {"vmm", "async_pool"}) {
    policy::Policy p = policy::default_policy();
    errors.clear();
    if (!policy::apply_overrides(p, backend, "free_sync=none", errors)) return 1;
    Core core(d, p);
    if (!core.error().empty()) {
      std::printf("FAIL: core: %s\n", core.error().c_str());
      return 1;
    }
    for (int i = 0; i < 3; ++i) {
      AllocRequest req;
      req.size = sizes[i];
      DevPtr q = 0;
      CHECK(core.alloc(req, &q));
      CHECK(core.free(q, FreeRequest{}));
      const std::string name = std::string("core pair ") + backend + " " + size_names[i];
      time_ops(name.c_str(), 1, [&] {
        AllocRequest r;
        r.size = sizes[i];
        DevPtr x = 0;
        core.alloc(r, &x);
        core.free(x, FreeRequest{});
      });
    }
  }
  return sink == 42 ? 0 : 0;
}

}  // namespace
}  // namespace allocshim

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0)
      allocshim::g_quick = true;
    else {
      std::fprintf(stderr, "usage: hit_path [--quick]\n");
      return 2;
    }
  }
  return allocshim::run();
}
