// Helpers shared by the oversubscription GPU programs (oversub_test.cu, spill_bench.cu, ...), on
// top of gpu_common.h: sizes, fill/verify launches over a range, the grid-stride read kernel whose
// bandwidth the benchmark reports, and CU for driver API calls.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "gpu_common.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// CHECK for a driver API call (the programs that call it directly link libcuda: pin_bench,
// move_bench).
#define CU(call)                                                                           \
  do {                                                                                     \
    const CUresult r_ = (call);                                                            \
    if (r_ != CUDA_SUCCESS) {                                                              \
      std::printf("FAIL: %s returned %d (%s:%d)\n", #call, static_cast<int>(r_), __FILE__, \
                  __LINE__);                                                               \
      std::fflush(stdout);                                                                 \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

namespace oversub {

using gpu_test::check_words;
using gpu_test::fill_words;
using gpu_test::kGiB;
using gpu_test::kMiB;
using gpu_test::pattern;
using gpu_test::require_gpu;
using gpu_test::start_program;

// "8GiB", "512MiB", "1000" -> bytes.
inline std::size_t parse_size(const char* s) {
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  const std::string unit = end ? end : "";
  const double m = unit == "GiB"   ? double(kGiB)
                   : unit == "MiB" ? double(kMiB)
                   : unit == "KiB" ? 1024.0
                                   : 1.0;
  return static_cast<std::size_t>(v * m);
}

// cudaMalloc / cudaFree counted: the programs print "allocations: N" / "frees: N" for the GPU
// harness (check_stats.py --count).
inline int allocations = 0, frees = 0;

inline void* dmalloc(std::size_t bytes) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, bytes));
  ++allocations;
  return p;
}

inline void dfree(void* p) {
  CHECK(cudaFree(p));
  ++frees;
}

inline int grid_blocks() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  return sms * 8;
}

inline void fill(void* p, std::size_t bytes, std::uint32_t seed, cudaStream_t s = nullptr) {
  fill_words<<<grid_blocks(), 512, 0, s>>>(static_cast<std::uint32_t*>(p), bytes / 4, seed);
  CHECK(cudaGetLastError());
}

// Launches a check of [p, p + bytes) adding its mismatches to *bad (device memory), on `s`.
inline void check_async(const void* p, std::size_t bytes, std::uint32_t seed,
                        unsigned long long* bad, cudaStream_t s = nullptr) {
  check_words<<<grid_blocks(), 512, 0, s>>>(static_cast<const std::uint32_t*>(p), bytes / 4, seed,
                                            bad);
  CHECK(cudaGetLastError());
}

// Mismatching words of [p, p + bytes) (synchronous).
inline unsigned long long count_bad(const void* p, std::size_t bytes, std::uint32_t seed,
                                    unsigned long long* bad) {
  CHECK(cudaMemset(bad, 0, sizeof *bad));
  check_async(p, bytes, seed, bad);
  unsigned long long host = 0;
  CHECK(cudaMemcpy(&host, bad, sizeof host, cudaMemcpyDeviceToHost));
  return host;
}

// Grid-stride read of 16-byte words, four independent loads in flight per thread (zero-copy reads
// over the link need many outstanding requests). The XOR is stored only if it takes a value it
// cannot have, so the loads are not optimized away.
__global__ void read_kernel(const uint4* p, std::size_t n, unsigned* sink) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    acc.x ^= a.x ^ b.x ^ c.x ^ d.x;
    acc.y ^= a.y ^ b.y ^ c.y ^ d.y;
    acc.z ^= a.z ^ b.z ^ c.z ^ d.z;
    acc.w ^= a.w ^ b.w ^ c.w ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = p[i];
    acc.x ^= a.x;
    acc.y ^= a.y;
    acc.z ^= a.z;
    acc.w ^= a.w;
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x5eed5eedu && acc.x == 0xdeadbeefu) *sink = 1;
}

// Read bandwidth of [p, p + bytes) in GB/s (10^9 bytes per second): the median of `runs` timed
// kernels after one warm-up (which also takes any first-touch faults of managed memory). `sink` is
// a device word the caller allocated.
inline double read_gbps(const void* p, std::size_t bytes, unsigned* sink, int runs = 5) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  const int blocks = grid_blocks() * 2;
  std::vector<double> gbps;
  for (int r = -1; r < runs; ++r) {
    CHECK(cudaEventRecord(start));
    read_kernel<<<blocks, 512>>>(static_cast<const uint4*>(p), bytes / 16, sink);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (r >= 0) gbps.push_back(static_cast<double>(bytes) / (ms * 1e6));
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  std::sort(gbps.begin(), gbps.end());
  return gbps[gbps.size() / 2];
}

}  // namespace oversub
