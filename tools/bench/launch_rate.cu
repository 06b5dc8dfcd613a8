// Kernel launch rate from THREADS threads, each on a non-blocking stream of its own: an empty
// kernel with 8 pointer parameters, four of them into buffers of 64 MiB (movable under a budget
// with migrate = "auto"). Run natively, under the shim without a budget and with one: the launch
// hooks' cost is the ratio of the rates (issue 23's target: 100% / at least 97% of native).
//
//   launch_rate THREADS LAUNCHES_PER_THREAD ROUNDS
// Output: one "rate threads=T launches_per_s=R" line per round; exit 0, 1 on a CUDA error, 77
// without a GPU.
#include <atomic>
#include <chrono>
#include <thread>

#include "oversub_common.h"

using namespace oversub;

__global__ void empty_kernel(float* a, float* b, float* c, float* d, float* e, float* f, float* g,
                             float* h) {
  if (threadIdx.x == 1024) *a = *b + *c + *d + *e + *f + *g + *h;  // never: keeps the parameters
}

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s THREADS LAUNCHES_PER_THREAD ROUNDS\n", argv[0]);
    return 2;
  }
  require_gpu();
  const int threads = std::atoi(argv[1]);
  const long launches = std::atol(argv[2]);
  const int rounds = std::atoi(argv[3]);
  std::vector<float*> buffers(4);
  for (float*& b : buffers) CHECK(cudaMalloc(&b, 64 * kMiB));
  float* small = nullptr;
  CHECK(cudaMalloc(&small, 4096));
  std::vector<cudaStream_t> streams(static_cast<std::size_t>(threads));
  for (auto& s : streams) CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int r = 0; r < rounds; ++r) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        cudaStream_t s = streams[static_cast<std::size_t>(t)];
        empty_kernel<<<1, 32, 0, s>>>(buffers[0], small, buffers[1], small, buffers[2], small,
                                      buffers[3], small);
        CHECK(cudaStreamSynchronize(s));
        ++ready;
        while (!go.load()) {}
        for (long i = 0; i < launches; ++i)
          empty_kernel<<<1, 32, 0, s>>>(buffers[0], small, buffers[1], small, buffers[2], small,
                                        buffers[3], small);
        CHECK(cudaGetLastError());
        CHECK(cudaStreamSynchronize(s));
      });
    }
    while (ready.load() < threads) {}
    const auto t0 = std::chrono::steady_clock::now();
    go = true;
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rate threads=%d launches_per_s=%.0f\n", threads, double(launches) * threads / s);
  }
  for (auto& s : streams) CHECK(cudaStreamDestroy(s));
  for (float* b : buffers) CHECK(cudaFree(b));
  CHECK(cudaFree(small));
  return 0;
}
