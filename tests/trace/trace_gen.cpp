// trace_gen: writes a large trace through the real recorder (its chunks, thread segments and stack
// trie), to measure `allocshim report` at scale (docs/tracing.md, "Large traces").
//
// THREADS threads each make EVENTS/THREADS allocations and frees from SITES call sites, DEPTH to
// DEPTH+SITES-1 frames deep (each its own stack; the recorder keeps 64 frames). Each thread keeps
// up to 4096 blocks live (a random slot is freed if live, else allocated), so lifetimes vary and
// the live set stays bounded, as in a training loop.
//
//   trace_gen PATH [events=10000000] [threads=4] [sites=32] [depth=8]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "trace/recorder.h"

using namespace allocshim;

namespace {

constexpr int kSlots = 4096;

struct Worker {
  trace::Recorder* recorder;
  int thread;
  std::uint64_t rng;
  std::vector<std::size_t> live = std::vector<std::size_t>(kSlots, 0);

  std::uint64_t next() {  // xorshift64
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  }
};

// Recurses `depth` frames so each site has its own stack, then makes `ops` events there.
__attribute__((noinline)) void site(Worker& w, int depth, int id, int ops) {
  if (depth > 0) {
    site(w, depth - 1, id, ops);
    asm volatile("" ::: "memory");
    return;
  }
  for (int i = 0; i < ops; ++i) {
    const int slot = static_cast<int>(w.next() % kSlots);
    const DevPtr p = 0x7f0000000000ull + (static_cast<DevPtr>(w.thread) << 36) +
                     static_cast<DevPtr>(slot) * (1u << 22);
    if (w.live[slot]) {
      // Duration 0: a free is stamped when it began (now - duration), and a made-up duration could
      // put it before the allocation it frees.
      w.recorder->on_free(p, w.live[slot], 0, id % 3, 0);
      w.live[slot] = 0;
    } else {
      const std::size_t size = static_cast<std::size_t>(512) << (w.next() % 12);
      w.recorder->on_alloc(p, size, 0, id % 3, Api::alloc, 900 + w.next() % 1000);
      w.live[slot] = size;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 6 || argv[1][0] == '-') {  // no options: "--help" is no trace path
    std::fprintf(stderr,
                 "usage: trace_gen PATH [events=10000000] [threads=4] [sites=32] [depth=8]\n");
    return 2;
  }
  const std::string path = argv[1];
  const long events = argc > 2 ? std::atol(argv[2]) : 10000000;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 4;
  const int sites = argc > 4 ? std::atoi(argv[4]) : 32;
  const int depth = argc > 5 ? std::atoi(argv[5]) : 8;
  if (events <= 0 || threads <= 0 || sites <= 0 || depth < 0) {
    std::fprintf(stderr, "trace_gen: events, threads and sites must be positive\n");
    return 2;
  }
  trace::Config c;
  c.path = path;
  c.stacks = trace::StackMode::native;
  std::string error;
  trace::Recorder* r = trace::Recorder::start(c, error);
  if (!r) {
    std::fprintf(stderr, "trace_gen: %s\n", error.c_str());
    return 1;
  }
  r->describe_backend(0, BackendKind::native, "native");
  r->describe_backend(1, BackendKind::async_pool, "async_pool");
  r->describe_backend(2, BackendKind::vmm, "vmm");
  constexpr int kOps = 50;
  const long rounds = (events / threads + kOps - 1) / kOps;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([=] {
      Worker w{r, t, 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(t + 1)};
      for (long i = 0; i < rounds; ++i) {
        // Each site its own stack: a depth of its own.
        const int id = static_cast<int>(w.next() % static_cast<std::uint64_t>(sites));
        site(w, depth + id, id, kOps);
      }
    });
  for (std::thread& t : pool) t.join();
  trace::Recorder::stop();
  std::printf("trace_gen: wrote %s (%ld events, %d threads, %d sites)\n", path.c_str(),
              rounds * kOps * threads, threads, sites);
  return 0;
}
