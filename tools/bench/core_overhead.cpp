// What the shim adds to one allocation call, with the driver's own cost taken out.
//
// A real cudaMalloc costs 80+ µs, so the shim's few tens of nanoseconds cannot be measured against
// it. Here the driver table is a null driver (a bump pointer per thread: alloc and free cost a few
// ns and share nothing between threads, so what does not scale is the core's), and the
// same alloc+free pairs run (a) straight on that table and (b) through the core with the `native`
// backend: policy match, backend call, timing, statistics, registry insert and erase. The
// difference, halved, is the core's cost per hooked call. The exported wrapper in front of the core
// adds a thread-local check and a call on top (shim/abi/hooks.cpp).
//
// Usage: core_overhead [pairs] — prints a table, and one JSON line per row for scripts.
#include <algorithm>
#include <atomic>
#include <cstdio>

#include "core/core.h"
#include "thread_timer.h"

namespace allocshim {
namespace {

// Each thread bumps through its own 64 GiB of addresses: a shared counter would make the direct
// path itself stop scaling with threads, and the core's own scaling is what is measured.
std::atomic<DevPtr> g_next_range{0x7f0000000000ull};
thread_local DevPtr t_next = 0;

Driver null_driver() {
  Driver d{};
  d.ctx_get_device = [](int* dev) {
    *dev = 0;
    return res::ok;
  };
  d.device_get_count = [](int* n) {
    *n = 1;
    return res::ok;
  };
  d.mem_alloc = [](DevPtr* p, std::size_t bytes) {
    if (t_next == 0) t_next = g_next_range.fetch_add(DevPtr{1} << 36, std::memory_order_relaxed);
    *p = t_next;
    t_next += (bytes + 255) & ~std::size_t{255};
    return res::ok;
  };
  d.mem_free = [](DevPtr) { return res::ok; };
  d.mem_get_info = [](std::size_t* f, std::size_t* t) {
    *f = *t = 0;
    return res::ok;
  };
  return d;
}

// ns per alloc+free pair, each of `threads` threads doing `pairs` pairs with 4 live blocks.
double run(int threads, long pairs, Core* core, const Driver& d) {
  return bench::ns_per_op(threads, pairs, [&](int) {
    return [&](long n) {
      DevPtr live[4] = {};
      for (long i = 0; i < n; ++i) {
        DevPtr& slot = live[i & 3];
        if (core) {
          if (slot) core->free(slot, FreeRequest{});
          AllocRequest req;
          req.size = 256u << (i & 7);
          core->alloc(req, &slot);
        } else {
          if (slot) d.mem_free(slot);
          d.mem_alloc(&slot, 256u << (i & 7));
        }
      }
      for (DevPtr p : live)
        if (p) core ? core->free(p, FreeRequest{}) : d.mem_free(p);
    };
  });
}

}  // namespace
}  // namespace allocshim

int main(int argc, char** argv) {
  using namespace allocshim;
  long pairs = 2'000'000;
  if (argc > 2 || (argc == 2 && !bench::parse_count(argv[1], &pairs))) {
    std::fprintf(
        stderr,
        "usage: core_overhead [pairs]   (pairs: a whole number from 16 up; default 2000000)\n");
    return 2;
  }
  const Driver d = null_driver();
  Core core(d, policy::default_policy());
  std::printf("%8s %16s %16s %18s\n", "threads", "direct ns/pair", "core ns/pair", "added ns/call");
  for (int threads : {1, 2, 4, 8, 16}) {
    // Best of three: the minimum is the least disturbed by other work on the machine.
    double direct = 1e30, via_core = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      direct = std::min(direct, run(threads, pairs / threads, nullptr, d));
      via_core = std::min(via_core, run(threads, pairs / threads, &core, d));
    }
    const double added = (via_core - direct) / 2;
    std::printf("%8d %16.1f %16.1f %18.1f\n", threads, direct, via_core, added);
    std::printf(
        "{\"bench\":\"core_overhead\",\"threads\":%d,\"direct_ns_per_pair\":%.2f,"
        "\"core_ns_per_pair\":%.2f,\"added_ns_per_call\":%.2f}\n",
        threads, direct, via_core, added);
  }
  return 0;
}
