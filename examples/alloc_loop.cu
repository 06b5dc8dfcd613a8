// alloc_loop: the quick-start demo. cudaMalloc/cudaFree of mixed sizes in a loop; in each block one
// kernel writes a pattern and a second kernel verifies it and adds it to a checksum.
//
//   alloc_loop [ITERATIONS]                      # natively
//   allocshim run -- alloc_loop [ITERATIONS]     # the same program under the shim
//
// It prints its own allocation count so a test can compare it with the shim's statistics, and the
// host time of each cudaMalloc + cudaFree pair (kernels excluded), which is what a pool saves.
// Exit status: 0 pass, 1 failure, 77 no GPU or driver (CTest's SKIP_RETURN_CODE).
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "example_check.h"

namespace {

// Sizes chosen to hit the shapes allocators treat differently: tiny, sub-page, odd, one 2 MiB VMM
// granule exactly, and several granules.
constexpr std::size_t kSizes[] = {256,        4096 + 12,      65536,    1u << 20,
                                  (2u << 20), (3u << 20) + 4, 16u << 20};
constexpr int kSizeCount = sizeof kSizes / sizeof kSizes[0];

// The value word i of iteration `iter` holds: unique per block and per position, so a block that
// aliased another live one, or a short mapping, shows up as a mismatch.
__host__ __device__ std::uint32_t pattern(std::uint32_t iter, std::uint64_t i) {
  return static_cast<std::uint32_t>(i * 2654435761u) ^ (iter * 0x9e3779b9u);
}

__global__ void fill(std::uint32_t* p, std::size_t words, std::uint32_t iter) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = pattern(iter, i);
}

// counters[0]: mismatching words; counters[1]: running checksum of every word read.
__global__ void verify(const std::uint32_t* p, std::size_t words, std::uint32_t iter,
                       unsigned long long* counters) {
  unsigned long long bad = 0, sum = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t v = p[i];
    bad += v != pattern(iter, i);
    sum += v;
  }
  if (bad) atomicAdd(&counters[0], bad);
  atomicAdd(&counters[1], sum);
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 200;
  if (iterations <= 0) {
    std::printf("usage: %s [ITERATIONS > 0]\n", argv[0]);
    return 2;
  }
  exit_unless_gpu();

  long allocations = 0, frees = 0;
  unsigned long long* counters = nullptr;
  CHECK(cudaMalloc(&counters, 2 * sizeof *counters));
  ++allocations;
  CHECK(cudaMemset(counters, 0, 2 * sizeof *counters));

  using clock = std::chrono::steady_clock;
  clock::duration alloc_free_time{};
  unsigned long long expected_sum = 0;
  std::size_t bytes = 0;
  for (int it = 0; it < iterations; ++it) {
    const std::size_t size = kSizes[it % kSizeCount];
    const std::size_t words = size / sizeof(std::uint32_t);
    std::uint32_t* block = nullptr;
    const auto t0 = clock::now();
    CHECK(cudaMalloc(&block, size));
    alloc_free_time += clock::now() - t0;
    ++allocations;
    bytes += size;

    fill<<<64, 256>>>(block, words, static_cast<std::uint32_t>(it));
    CHECK(cudaGetLastError());
    verify<<<64, 256>>>(block, words, static_cast<std::uint32_t>(it), counters);
    CHECK(cudaGetLastError());
    for (std::size_t i = 0; i < words; ++i)
      expected_sum += pattern(static_cast<std::uint32_t>(it), i);

    // Wait for the kernels first so the timed cudaFree measures the allocator, not the kernels it
    // would otherwise wait for (cudaFree synchronizes natively and under free_sync=device).
    CHECK(cudaDeviceSynchronize());
    const auto t1 = clock::now();
    CHECK(cudaFree(block));
    alloc_free_time += clock::now() - t1;
    ++frees;
  }

  unsigned long long host[2] = {0, 0};
  CHECK(cudaMemcpy(host, counters, sizeof host, cudaMemcpyDeviceToHost));
  CHECK(cudaFree(counters));
  ++frees;

  const double us = std::chrono::duration<double, std::micro>(alloc_free_time).count() / iterations;
  std::printf("iterations: %d (%d sizes, %zu to %zu bytes)\n", iterations, kSizeCount, kSizes[0],
              kSizes[kSizeCount - 1]);
  std::printf("allocations: %ld\n", allocations);
  std::printf("frees: %ld\n", frees);
  std::printf("bytes: %zu\n", bytes + 2 * sizeof *counters);
  std::printf("mismatches: %llu\n", host[0]);
  std::printf("checksum: 0x%016llx (expected 0x%016llx)\n", host[1], expected_sum);
  std::printf("time per alloc+free pair: %.2f us\n", us);
  if (host[0] != 0 || host[1] != expected_sum) {
    std::printf("FAIL: alloc_loop: data did not verify\n");
    return 1;
  }
  std::printf("PASS: alloc_loop\n");
  return 0;
}
