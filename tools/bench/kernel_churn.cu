// kernel_churn: host threads that each allocate, run kernels on the block, wait and free, the
// pattern where a free's safety costs the most (issue 13). It knows nothing about allocshim: run it
// natively, then under `allocshim run`, and compare (kernel_churn.sh).
//
//   kernel_churn [--threads LIST] [--iterations N] [--bytes B] [--async] [--nonblocking]
//
// Each of N host threads owns a stream (blocking by default, as cudaStreamCreate makes it;
// --nonblocking: cudaStreamNonBlocking) and, per iteration: allocates B bytes (cudaMalloc, or with
// --async cudaMallocAsync on its stream), fills the block with a pattern of its own on its stream,
// runs a second kernel that checks every word of it, synchronizes its stream and frees the block
// (cudaFree, or cudaFreeAsync before the synchronization). A mismatch means another thread's
// kernel wrote the block while this one used it: a reuse race. The time per iteration is the
// wall time of the timed iterations of all threads, divided by the iterations of one thread.
// Defaults: --threads 1,2,4,8,16, --iterations 300 (after 10 untimed), --bytes 1 MiB.
// Output: one JSON line per thread count ({"bench":"kernel_churn",...}), then a table.
// Exit status: 0 done, 1 a CUDA call failed, 2 usage, 3 a reuse race was seen, 77 no GPU or driver.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "examples/example_check.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kWarmup = 10;
constexpr int kGrid = 32,
              kBlock = 256;  // a few SMs per kernel: 16 threads' kernels run side by side

__global__ void fill(std::uint32_t* p, std::size_t words, std::uint32_t value) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = value ^ static_cast<std::uint32_t>(i);
}

__global__ void check(const std::uint32_t* p, std::size_t words, std::uint32_t value,
                      unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    bad += p[i] != (value ^ static_cast<std::uint32_t>(i));
  if (bad) atomicAdd(mismatches, bad);
}

struct Options {
  std::vector<int> threads{1, 2, 4, 8, 16};
  int iterations = 300;
  std::size_t bytes = std::size_t{1} << 20;
  bool async = false;
  bool nonblocking = false;
};

// Returns the index of the first argument it cannot use, or 0.
int parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--async") {
      o.async = true;
    } else if (a == "--nonblocking") {
      o.nonblocking = true;
    } else if (a == "--threads" && next) {
      o.threads.clear();
      for (const char* s = next; *s;) {
        char* end = nullptr;
        const long v = std::strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1024) return i;
        o.threads.push_back(static_cast<int>(v));
        s = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0') return i;
      }
      ++i;
    } else if (a == "--iterations" && next) {
      o.iterations = std::atoi(next);
      if (o.iterations < 1) return i;
      ++i;
    } else if (a == "--bytes" && next) {
      o.bytes = std::strtoull(next, nullptr, 10);
      if (o.bytes < 4) return i;
      ++i;
    } else {
      return i;
    }
  }
  return 0;
}

void worker(const Options& o, int index, std::atomic<int>& ready, const std::atomic<bool>& go,
            unsigned long long* mismatches) {
  CHECK(cudaSetDevice(0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, o.nonblocking ? cudaStreamNonBlocking : cudaStreamDefault));
  const std::size_t words = o.bytes / 4;
  auto iteration = [&](int it) {
    std::uint32_t* p = nullptr;
    if (o.async)
      CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p), o.bytes, s));
    else
      CHECK(cudaMalloc(reinterpret_cast<void**>(&p), o.bytes));
    const std::uint32_t value =
        static_cast<std::uint32_t>(index) << 20 ^ static_cast<std::uint32_t>(it);
    fill<<<kGrid, kBlock, 0, s>>>(p, words, value);
    check<<<kGrid, kBlock, 0, s>>>(p, words, value, mismatches);
    CHECK(cudaGetLastError());
    if (o.async) CHECK(cudaFreeAsync(p, s));
    CHECK(cudaStreamSynchronize(s));
    if (!o.async) CHECK(cudaFree(p));
  };
  for (int it = 0; it < kWarmup; ++it) iteration(it);
  ready.fetch_add(1);
  while (!go.load()) std::this_thread::yield();
  for (int it = 0; it < o.iterations; ++it) iteration(kWarmup + it);
  CHECK(cudaStreamDestroy(s));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const int bad = parse(argc, argv, o); bad != 0) {
    const bool valued = bad + 1 < argc && std::strncmp(argv[bad + 1], "--", 2) != 0;
    std::fprintf(stderr, "kernel_churn: invalid option or value: %s%s%s\n", argv[bad],
                 valued ? " " : "", valued ? argv[bad + 1] : "");
    std::fprintf(
        stderr,
        "usage: %s [--threads N[,N...]] [--iterations N] [--bytes B] [--async] [--nonblocking]\n",
        argv[0]);
    return 2;
  }
  exit_unless_gpu();
  CHECK(cudaSetDevice(0));
  unsigned long long* mismatches = nullptr;
  CHECK(cudaMallocManaged(reinterpret_cast<void**>(&mismatches), sizeof(unsigned long long)));
  *mismatches = 0;
  const char* api = o.async ? "cudaMallocAsync" : "cudaMalloc";
  const char* stream = o.nonblocking ? "nonblocking" : "blocking";
  struct Row {
    int threads;
    double us;
  };
  std::vector<Row> rows;
  for (int n : o.threads) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < n; ++t)
      pool.emplace_back(worker, std::cref(o), t, std::ref(ready), std::cref(go), mismatches);
    while (ready.load() < n) std::this_thread::yield();
    const Clock::time_point t0 = Clock::now();
    go.store(true);
    for (std::thread& t : pool) t.join();
    const double us =
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / o.iterations;
    rows.push_back({n, us});
    std::printf(
        "{\"bench\":\"kernel_churn\",\"api\":\"%s\",\"stream\":\"%s\",\"threads\":%d,"
        "\"iterations\":%d,\"bytes\":%zu,\"us_per_iteration\":%.2f}\n",
        api, stream, n, o.iterations, o.bytes, us);
    std::fflush(stdout);
  }
  CHECK(cudaDeviceSynchronize());
  const unsigned long long bad = *mismatches;
  std::printf("\nkernel_churn: %s, %s streams, %zu bytes, %d iterations per thread\n", api, stream,
              o.bytes, o.iterations);
  std::printf("%8s %14s\n", "threads", "us/iteration");
  for (const Row& r : rows) std::printf("%8d %14.1f\n", r.threads, r.us);
  std::printf("mismatched words: %llu\n", bad);
  CHECK(cudaFree(mismatches));
  if (bad != 0) {
    std::printf(
        "FAIL: kernel_churn: a block was written by another thread's kernel while in use\n");
    return 3;
  }
  std::printf("PASS: kernel_churn\n");
  return 0;
}
