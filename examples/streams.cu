// streams: several host threads allocate, launch and free at once, on non-blocking streams, on the
// default stream and with stream-ordered cudaMallocAsync/cudaFreeAsync. Built twice: `streams`
// (legacy default stream) and `streams_per_thread` (--default-stream per-thread, so the runtime
// calls the driver's _ptsz entry points).
//
//   streams [THREADS] [ITERATIONS]
//
// Each thread keeps a window of live blocks, fills each with a pattern unique to the thread and
// the block when it is allocated, and verifies it just before freeing it, after the other threads
// have allocated and written in between. Two live blocks that overlapped, or a block reused while a
// kernel still wrote it, would show up as mismatches.
// Exit status: 0 pass, 1 failure, 77 no GPU or driver.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "example_check.h"

namespace {

constexpr std::size_t kSizes[] = {512, 100000, 1u << 20, (2u << 20) + 8, 6u << 20};
constexpr int kSizeCount = sizeof kSizes / sizeof kSizes[0];
constexpr int kWindow = 4;  // live blocks per thread

__host__ __device__ std::uint32_t pattern(std::uint32_t seed, std::uint64_t i) {
  return static_cast<std::uint32_t>(i * 2246822519u) ^ (seed * 0x9e3779b9u);
}

__global__ void fill(std::uint32_t* p, std::size_t words, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = pattern(seed, i);
}

__global__ void verify(const std::uint32_t* p, std::size_t words, std::uint32_t seed,
                       unsigned long long* errors) {
  unsigned long long bad = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    bad += p[i] != pattern(seed, i);
  if (bad) atomicAdd(errors, bad);
}

// How a block is allocated and which stream its kernels run on.
enum class Mode {
  malloc_own_stream,
  malloc_default_stream,
  async_own_stream,
  async_default_stream
};
constexpr int kModeCount = 4;

struct Slot {
  std::uint32_t* ptr = nullptr;
  std::size_t words = 0;
  std::uint32_t seed = 0;
  Mode mode = Mode::malloc_own_stream;
};

std::atomic<long> allocations{0}, frees{0};
std::atomic<unsigned long long> mismatches{0};

void worker(int thread, int iterations) {
  cudaStream_t own = nullptr;
  CHECK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
  unsigned long long* errors = nullptr;
  CHECK(cudaMalloc(&errors, sizeof *errors));
  ++allocations;
  CHECK(cudaMemsetAsync(errors, 0, sizeof *errors, own));
  CHECK(cudaStreamSynchronize(own));

  auto stream_of = [own](Mode m) {
    return m == Mode::malloc_own_stream || m == Mode::async_own_stream ? own : cudaStream_t{0};
  };
  auto retire = [&](Slot& s) {
    const cudaStream_t st = stream_of(s.mode);
    verify<<<32, 256, 0, st>>>(s.ptr, s.words, s.seed, errors);
    CHECK(cudaGetLastError());
    if (s.mode == Mode::async_own_stream || s.mode == Mode::async_default_stream)
      CHECK(cudaFreeAsync(s.ptr, st));
    else
      CHECK(cudaFree(s.ptr));
    ++frees;
    s.ptr = nullptr;
  };

  Slot window[kWindow];
  for (int it = 0; it < iterations; ++it) {
    Slot& s = window[it % kWindow];
    if (s.ptr) retire(s);
    const std::size_t bytes = kSizes[(thread + it) % kSizeCount];
    s.words = bytes / sizeof(std::uint32_t);
    s.seed = static_cast<std::uint32_t>(thread * 100003 + it);
    s.mode = static_cast<Mode>((thread + it) % kModeCount);
    const cudaStream_t st = stream_of(s.mode);
    if (s.mode == Mode::async_own_stream || s.mode == Mode::async_default_stream)
      CHECK(cudaMallocAsync(&s.ptr, bytes, st));
    else
      CHECK(cudaMalloc(&s.ptr, bytes));
    ++allocations;
    fill<<<32, 256, 0, st>>>(s.ptr, s.words, s.seed);
    CHECK(cudaGetLastError());
  }
  for (Slot& s : window)
    if (s.ptr) retire(s);

  CHECK(cudaStreamSynchronize(own));
  CHECK(cudaStreamSynchronize(0));
  unsigned long long host = 0;
  CHECK(cudaMemcpy(&host, errors, sizeof host, cudaMemcpyDeviceToHost));
  CHECK(cudaFree(errors));
  ++frees;
  CHECK(cudaStreamDestroy(own));
  mismatches += host;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 4;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 50;
  if (threads <= 0 || iterations <= 0) {
    std::printf("usage: %s [THREADS > 0] [ITERATIONS > 0]\n", argv[0]);
    return 2;
  }
  exit_unless_gpu();
  // Create the context before the threads race to do it (cudaSetDevice initializes it since 12.0).
  CHECK(cudaSetDevice(0));
  CHECK(cudaDeviceSynchronize());

#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
  const char* default_stream = "per-thread";
#else
  const char* default_stream = "legacy";
#endif
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t, iterations);
  for (std::thread& t : pool) t.join();
  CHECK(cudaDeviceSynchronize());

  std::printf("threads: %d, iterations: %d, default stream: %s\n", threads, iterations,
              default_stream);
  std::printf("allocations: %ld\n", allocations.load());
  std::printf("frees: %ld\n", frees.load());
  std::printf("mismatches: %llu\n", mismatches.load());
  if (mismatches.load() != 0 || allocations.load() != frees.load()) {
    std::printf("FAIL: streams: data did not verify\n");
    return 1;
  }
  std::printf("PASS: streams\n");
  return 0;
}
