// trace_bench: the cost of tracing with full native stacks (docs/tracing.md records the results).
//
// A workload of repeated call sites: NSITES call sites, each DEPTH frames deep, allocate and free
// in turn. Each traced event (an alloc or a free) is timed on its own; the median over all events
// is the added cost per event, since without tracing the recorder is not called at all (the core's
// check is one predictable branch). Bytes per event is the trace file's size over the events.
//
//   trace_bench [events=400000] [depth=20] [sites=8] [path=/tmp/trace_bench.trace]
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "trace/recorder.h"
#include "base/clock.h"

using namespace allocshim;

namespace {

std::vector<std::uint32_t> g_alloc_ns, g_free_ns;

// Recurses `depth` frames, then allocates and frees `rounds` times from that one call site.
__attribute__((noinline)) void site(trace::Recorder* r, int depth, int id, int rounds) {
  if (depth > 0) {
    site(r, depth - 1, id, rounds);
    asm volatile("" ::: "memory");
    return;
  }
  for (int i = 0; i < rounds; ++i) {
    const DevPtr p =
        0x7f0000000000ull + (static_cast<DevPtr>(id) << 24) + static_cast<DevPtr>(i % 64) * 4096;
    const std::size_t size = 4096u << (id % 4);
    std::uint64_t t0 = clock::now_ns();
    r->on_alloc(p, size, 0, id % 2, Api::alloc, 900);
    std::uint64_t t1 = clock::now_ns();
    r->on_free(p, size, 0, id % 2, 700);
    std::uint64_t t2 = clock::now_ns();
    g_alloc_ns.push_back(static_cast<std::uint32_t>(t1 - t0));
    g_free_ns.push_back(static_cast<std::uint32_t>(t2 - t1));
  }
}

std::uint32_t percentile(std::vector<std::uint32_t> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  const long events = argc > 1 ? std::atol(argv[1]) : 400000;
  const int depth = argc > 2 ? std::atoi(argv[2]) : 20;
  const int sites = argc > 3 ? std::atoi(argv[3]) : 8;
  if (argc > 5 || events <= 0 || depth < 0 || sites <= 0) {
    std::fprintf(stderr, "usage: trace_bench [events=400000] [depth=20] [sites=8] [path]\n");
    return 2;
  }
  const std::string path =
      argc > 4 ? argv[4] : "/tmp/trace_bench." + std::to_string(getpid()) + ".trace";

  trace::Config c;
  c.path = path;
  c.stacks = trace::StackMode::native;
  std::string error;
  trace::Recorder* r = trace::Recorder::start(c, error);
  if (!r) {
    std::fprintf(stderr, "trace_bench: %s\n", error.c_str());
    return 1;
  }
  // The number is libunwind's: a run that fell back to glibc's backtrace() (libunwind.so.8 not
  // found) measures something else, 20x slower, and says so.
  const std::string unwinder = r->unwinder();
  if (unwinder.rfind("libunwind", 0) != 0)
    std::fprintf(stderr, "trace_bench: warning: not using libunwind: %s\n", unwinder.c_str());
  // Each site call contributes `rounds` allocs and as many frees; recursion below `site` plus the
  // loop in main give the stack its depth (the frames above main are libc's).
  const int rounds = 100;
  const long calls = std::max(1L, events / (2L * rounds));
  g_alloc_ns.reserve(static_cast<std::size_t>(calls * rounds));
  g_free_ns.reserve(static_cast<std::size_t>(calls * rounds));
  // Warm-up: interns the stacks and fills libunwind's cache, as a long-running program would.
  for (int s = 0; s < sites; ++s) site(r, depth, s, 1);
  g_alloc_ns.clear();
  g_free_ns.clear();
  const std::uint64_t t0 = clock::now_ns();
  for (long i = 0; i < calls; ++i) site(r, depth, static_cast<int>(i % sites), rounds);
  const std::uint64_t wall = clock::now_ns() - t0;
  trace::Recorder::stop();

  FILE* f = std::fopen(path.c_str(), "rb");
  long bytes = 0;
  if (f) {
    std::fseek(f, 0, SEEK_END);
    bytes = std::ftell(f);
    std::fclose(f);
  }
  std::vector<std::uint32_t> all(g_alloc_ns);
  all.insert(all.end(), g_free_ns.begin(), g_free_ns.end());
  const double n = static_cast<double>(all.size());
  std::printf("trace_bench: %zu events (%d sites, %d frames deep + main), native stacks\n",
              all.size(), sites, depth);
  std::printf("  unwinder                %s\n", unwinder.c_str());
  double sum = 0;
  for (std::uint32_t v : all) sum += v;
  std::printf("  per event (alloc+free)  median %u ns   p90 %u ns   p99 %u ns   mean %.0f ns\n",
              percentile(all, 0.5), percentile(all, 0.9), percentile(all, 0.99), sum / n);
  std::printf("  alloc (with unwind)     median %u ns   p90 %u ns\n", percentile(g_alloc_ns, 0.5),
              percentile(g_alloc_ns, 0.9));
  std::printf("  free                    median %u ns   p90 %u ns\n", percentile(g_free_ns, 0.5),
              percentile(g_free_ns, 0.9));
  std::printf("  wall per event          %.0f ns (timing calls included)\n",
              static_cast<double>(wall) / n);
  std::printf("  file                    %ld bytes, %.2f bytes per event (%s)\n", bytes,
              static_cast<double>(bytes) / n, path.c_str());
  std::remove(path.c_str());
  return 0;
}
