// What every GPU test program needs: error checks that name the failing call (and, where the
// program sets gpu_test::step, the step it was in), the harness's skip (exit 77) without a GPU, and
// fill/check kernels over every 32-bit word of a range with a pattern a misplaced chunk, a stale
// copy or a lost write cannot match. ipc_common.h and oversub_common.h build on it.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace gpu_test {

inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kGiB = std::size_t{1} << 30;

// What the program is doing, printed with every failure (empty: not said).
inline const char* step = "";

inline const char* step_prefix() { return step[0] ? ": " : ""; }

// Exits 77 with the harness's "no GPU/driver" reason when there is nothing to run on.
inline void require_gpu() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no GPU/driver: %s\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "no device");
    std::exit(77);
  }
}

// The start of a program that takes at least `args` arguments: exits 2 printing `usage` when it
// was given fewer, then skips where there is no GPU.
inline void start_program(int argc, char** argv, int args, const char* usage) {
  if (argc < args + 1) {
    std::fprintf(stderr, "usage: %s %s\n", argv[0], usage);
    std::exit(2);
  }
  require_gpu();
}

// Word i of a pattern: depends on the seed and the whole 64-bit index.
__device__ __host__ inline std::uint32_t pattern(std::size_t i, std::uint32_t seed) {
  const std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  return static_cast<std::uint32_t>(x ^ (x >> 29));
}

__global__ void fill_words(std::uint32_t* p, std::size_t n, std::uint32_t seed) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = pattern(i, seed);
}

// Adds the words of [p, p + n) that differ from the pattern to *bad.
__global__ void check_words(const std::uint32_t* p, std::size_t n, std::uint32_t seed,
                            unsigned long long* bad) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  unsigned long long mine = 0;
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    mine += p[i] != pattern(i, seed);
  if (mine) atomicAdd(bad, mine);
}

}  // namespace gpu_test

#define CHECK(call)                                                           \
  do {                                                                        \
    const cudaError_t err_ = (call);                                          \
    if (err_ != cudaSuccess) {                                                \
      std::printf("FAIL: %s%s%s returned %s (%s) at %s:%d\n", gpu_test::step, \
                  gpu_test::step_prefix(), #call, cudaGetErrorName(err_),     \
                  cudaGetErrorString(err_), __FILE__, __LINE__);              \
      std::fflush(stdout);                                                    \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

// The same for a driver API call.
#define CU_CHECK(call)                                                                            \
  do {                                                                                            \
    const CUresult err_ = (call);                                                                 \
    if (err_ != CUDA_SUCCESS) {                                                                   \
      const char* name_ = nullptr;                                                                \
      cuGetErrorName(err_, &name_);                                                               \
      std::printf("FAIL: %s%s%s returned %s at %s:%d\n", gpu_test::step, gpu_test::step_prefix(), \
                  #call, name_ ? name_ : "an unknown CUresult", __FILE__, __LINE__);              \
      std::fflush(stdout);                                                                        \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

#define EXPECT(cond, ...)                            \
  do {                                               \
    if (!(cond)) {                                   \
      std::printf("FAIL: " __VA_ARGS__);             \
      std::printf(" (%s:%d)\n", __FILE__, __LINE__); \
      std::fflush(stdout);                           \
      std::exit(1);                                  \
    }                                                \
  } while (0)
