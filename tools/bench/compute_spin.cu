// A process of known kernels for [compute] shares (docs/operators.md, "Compute share and
// priority"): each kernel keeps every SM of the GPU busy for KERNEL_US microseconds, launched in
// batches of 8 (directly, or as one CUDA graph of 8 kernels) with a stream synchronization after
// each batch. It waits until START_AT (CLOCK_REALTIME, seconds), so that processes started apart
// run over the same window, then runs for SECONDS. Its rate over that window against its rate
// alone is the share of the GPU's time it got.
//
//   compute_spin kernels|graph SECONDS START_AT [KERNEL_US]
// Output: one line "spin mode=M kernels=N seconds=S rate=R" (kernels per second); exit 0, 1 on a
// CUDA error, 2 on a usage error, 77 without a GPU.
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "oversub_common.h"

using namespace oversub;

namespace {

constexpr int kBatch = 8;
constexpr int kThreads = 128;

__global__ void spin(long long cycles, int* sink) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
  if (cycles < 0 && threadIdx.x == 0) *sink = 1;  // never: keeps the loop
}

double realtime() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || (std::strcmp(argv[1], "kernels") != 0 && std::strcmp(argv[1], "graph") != 0)) {
    std::fprintf(stderr, "usage: %s kernels|graph SECONDS START_AT [KERNEL_US]\n", argv[0]);
    return 2;
  }
  require_gpu();
  const bool graph = std::strcmp(argv[1], "graph") == 0;
  const double seconds = std::atof(argv[2]);
  const double start_at = std::atof(argv[3]);
  const double kernel_us = argc > 4 ? std::atof(argv[4]) : 1000.0;

  int sms = 0, per_sm = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, spin, kThreads, 0));
  const dim3 grid(static_cast<unsigned>(sms * per_sm));
  int* sink = nullptr;
  CHECK(cudaMalloc(&sink, sizeof(int)));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // Cycles per microsecond of the SM clock, measured (it differs between GPUs and clocks).
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  const long long probe = 20'000'000;
  spin<<<grid, kThreads, 0, s>>>(probe, sink);  // warm-up
  CHECK(cudaEventRecord(e0, s));
  spin<<<grid, kThreads, 0, s>>>(probe, sink);
  CHECK(cudaEventRecord(e1, s));
  CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  const long long cycles =
      static_cast<long long>(static_cast<double>(probe) / (ms * 1000.0) * kernel_us);

  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kBatch; ++i) spin<<<grid, kThreads, 0, s>>>(cycles, sink);
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphDestroy(g));
  }
  while (realtime() < start_at) {
    const double left = start_at - realtime();
    if (left > 0.002) {
      const timespec pause{0, 1'000'000};
      nanosleep(&pause, nullptr);
    }
  }
  const double t0 = realtime();
  long long done = 0;
  double t = t0;
  while (t - t0 < seconds) {
    if (graph) {
      CHECK(cudaGraphLaunch(exec, s));
    } else {
      for (int i = 0; i < kBatch; ++i) spin<<<grid, kThreads, 0, s>>>(cycles, sink);
    }
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(s));
    done += kBatch;
    t = realtime();
  }
  std::printf("spin mode=%s kernels=%lld seconds=%.4f rate=%.2f kernel_us=%.0f\n", argv[1], done,
              t - t0, static_cast<double>(done) / (t - t0), kernel_us);
  if (exec) CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaFree(sink));
  return 0;
}
