// reuse_race: the race a pooling allocator opens when a free does not wait for the GPU.
//
//   reuse_race [ATTEMPTS] [--blocking-reader] [--spin-ms MS]
//
// Each attempt:
//   1. allocate block X, fill it with pattern P on stream A;
//   2. launch a reader on A that spins ~50 ms, then reads X and counts words that are not P;
//   3. cudaFree(X) at once, while the reader still spins;
//   4. allocate Y of the same size and launch a writer of pattern Q on a non-blocking stream B.
// Natively cudaFree synchronizes, so the reader has finished before Y exists: no corruption even
// when Y == X. Under the shim with free_sync=none a pool hands X straight back as Y, the writer runs
// beside the spinning reader, and the reader sees Q. With free_sync=device (sync at free) or
// barrier (reuse only after events on every stream have completed) it must stay correct.
//
// Stream A is non-blocking by default, which exercises the shim's tracking of created streams;
// --blocking-reader makes it a blocking stream, ordered by the legacy default stream instead.
// Exit status: 0 no corruption, 3 corruption seen, 1 error, 77 no GPU or driver.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "example_check.h"

namespace {

constexpr std::size_t kBlockBytes = 4u << 20;  // two 2 MiB VMM granules
constexpr std::uint32_t kOriginal = 0x0a11ce00u;
constexpr std::uint32_t kIntruder = 0xbadc0de0u;

__device__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void fill(std::uint32_t* p, std::size_t words, std::uint32_t value) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = value;
}

// Few blocks, so the writer on stream B finds free SMs and runs while this one spins. The wall
// clock (globaltimer) rather than clock64 keeps the window the same whatever the SM clock.
__global__ void late_reader(const std::uint32_t* p, std::size_t words, std::uint32_t expected,
                            std::uint64_t spin_ns, unsigned long long* mismatches) {
  const std::uint64_t start = global_ns();
  while (global_ns() - start < spin_ns) {}
  unsigned long long bad = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    bad += p[i] != expected;
  if (bad) atomicAdd(mismatches, bad);
}

}  // namespace

int main(int argc, char** argv) {
  int attempts = 3;
  bool blocking_reader = false;
  double spin_ms = 50.0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--blocking-reader") == 0) {
      blocking_reader = true;
    } else if (std::strcmp(argv[i], "--spin-ms") == 0 && i + 1 < argc) {
      spin_ms = std::atof(argv[++i]);
    } else if (std::atoi(argv[i]) > 0) {
      attempts = std::atoi(argv[i]);
    } else {
      std::printf("usage: %s [ATTEMPTS] [--blocking-reader] [--spin-ms MS]\n", argv[0]);
      return 2;
    }
  }
  exit_unless_gpu();

  cudaStream_t reader_stream = nullptr, writer_stream = nullptr;
  if (blocking_reader)
    CHECK(cudaStreamCreate(&reader_stream));
  else
    CHECK(cudaStreamCreateWithFlags(&reader_stream, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&writer_stream, cudaStreamNonBlocking));

  long allocations = 0, frees = 0;
  unsigned long long* mismatches = nullptr;
  CHECK(cudaMalloc(&mismatches, attempts * sizeof *mismatches));
  ++allocations;
  CHECK(cudaMemset(mismatches, 0, attempts * sizeof *mismatches));
  // cudaMemset runs on the legacy stream, which a non-blocking reader stream does not wait for.
  CHECK(cudaDeviceSynchronize());

  const std::size_t words = kBlockBytes / sizeof(std::uint32_t);
  const auto spin_ns = static_cast<std::uint64_t>(spin_ms * 1e6);
  int aliased = 0, corrupted = 0;
  double free_ms_total = 0;
  for (int a = 0; a < attempts; ++a) {
    std::uint32_t* old_block = nullptr;
    CHECK(cudaMalloc(&old_block, kBlockBytes));
    ++allocations;
    const auto old_addr = reinterpret_cast<std::uintptr_t>(old_block);  // kept past the free
    fill<<<64, 256, 0, reader_stream>>>(old_block, words, kOriginal);
    CHECK(cudaGetLastError());
    late_reader<<<4, 256, 0, reader_stream>>>(old_block, words, kOriginal, spin_ns, mismatches + a);
    CHECK(cudaGetLastError());

    const auto t0 = std::chrono::steady_clock::now();
    CHECK(cudaFree(old_block));
    const double free_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ++frees;
    free_ms_total += free_ms;

    std::uint32_t* new_block = nullptr;
    CHECK(cudaMalloc(&new_block, kBlockBytes));
    ++allocations;
    const auto new_addr = reinterpret_cast<std::uintptr_t>(new_block);
    const bool alias = new_addr < old_addr + kBlockBytes && old_addr < new_addr + kBlockBytes;
    fill<<<64, 256, 0, writer_stream>>>(new_block, words, kIntruder);
    CHECK(cudaGetLastError());

    CHECK(cudaDeviceSynchronize());
    unsigned long long bad = 0;
    CHECK(cudaMemcpy(&bad, mismatches + a, sizeof bad, cudaMemcpyDeviceToHost));
    CHECK(cudaFree(new_block));
    ++frees;

    aliased += alias;
    corrupted += bad != 0;
    std::printf(
        "attempt %d: cudaFree took %.3f ms, new block %s the old one, reader saw %llu "
        "foreign words\n",
        a + 1, free_ms, alias ? "aliased" : "did not alias", bad);
  }
  CHECK(cudaFree(mismatches));
  ++frees;
  CHECK(cudaStreamDestroy(reader_stream));
  CHECK(cudaStreamDestroy(writer_stream));

  std::printf("reader stream: %s, spin: %.1f ms, block: %zu bytes\n",
              blocking_reader ? "blocking" : "non-blocking", spin_ms, kBlockBytes);
  std::printf("allocations: %ld\n", allocations);
  std::printf("frees: %ld\n", frees);
  std::printf("summary: aliased %d/%d, corrupted %d/%d, cudaFree %.3f ms avg\n", aliased, attempts,
              corrupted, attempts, free_ms_total / attempts);
  if (corrupted) {
    std::printf(
        "CORRUPTION: the reader saw the new allocation's data: a block was reused while a "
        "kernel still read it\n");
    return 3;
  }
  std::printf("NO CORRUPTION: every reader saw its own data\n");
  return 0;
}
