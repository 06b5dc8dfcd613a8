// A program that resets the device mid-run, as test suites and NVIDIA's samples do: each round
// allocates blocks of several sizes (cudaMalloc and cudaMallocAsync), makes a stream and an event of
// its own, writes and checks every block with kernels, frees some, leaves the others (and a free
// still in flight), then destroys the context; the next round starts on a fresh one. It knows
// nothing of allocshim: run natively, its output is the reference.
//
//   device_reset [runtime]   cudaDeviceReset ends each of 4 rounds
//   device_reset driver      the driver API: cuCtxCreate, cuMemAlloc, cuCtxDestroy, 4 rounds
//
// Prints "allocations: N" and "frees: M", where M counts the blocks the program freed and those
// it left to the reset (which frees them), then "ok". Exit 0 when every check passed.
#include <cuda.h>

#include <cstring>
#include <vector>

#include "gpu_common.h"

namespace {

using gpu_test::kMiB;

constexpr int kRounds = 4;
constexpr std::size_t kSizes[] = {256, 4096, 100000, 2 * kMiB, 3 * kMiB + 512, 64 * kMiB};

unsigned long long* g_bad = nullptr;  // managed counter of mismatching words

void fill_and_check(void* p, std::size_t bytes, std::uint32_t seed, cudaStream_t s) {
  const std::size_t n = bytes / 4;
  gpu_test::fill_words<<<64, 256, 0, s>>>(static_cast<std::uint32_t*>(p), n, seed);
  CHECK(cudaGetLastError());
  gpu_test::check_words<<<64, 256, 0, s>>>(static_cast<const std::uint32_t*>(p), n, seed, g_bad);
  CHECK(cudaGetLastError());
}

int runtime_rounds() {
  long allocations = 0, frees = 0;
  for (int round = 0; round <= kRounds; ++round) {
    gpu_test::step = round < kRounds ? "round" : "after the last reset";
    CHECK(cudaMallocManaged(&g_bad, sizeof *g_bad));
    *g_bad = 0;
    ++allocations;
    cudaStream_t stream = nullptr;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t event = nullptr;
    CHECK(cudaEventCreate(&event));
    std::vector<void*> blocks;
    std::uint32_t seed = 1000u * static_cast<std::uint32_t>(round);
    for (std::size_t bytes : kSizes) {
      void* p = nullptr;
      CHECK(cudaMalloc(&p, bytes));
      ++allocations;
      fill_and_check(p, bytes, ++seed, round % 2 ? stream : nullptr);
      blocks.push_back(p);
    }
    void* async_block = nullptr;
    CHECK(cudaMallocAsync(&async_block, kMiB, stream));
    ++allocations;
    fill_and_check(async_block, kMiB, ++seed, stream);
    CHECK(cudaEventRecord(event, stream));
    CHECK(cudaDeviceSynchronize());
    EXPECT(*g_bad == 0, "round %d: %llu words differ from what was written", round, *g_bad);
    // Free every other block; the rest, the async block and the counter are left to the reset.
    for (std::size_t i = 0; i < blocks.size(); i += 2) {
      CHECK(cudaFree(blocks[i]));
      ++frees;
    }
    if (round == kRounds) {  // the last round cleans up after itself
      for (std::size_t i = 1; i < blocks.size(); i += 2) CHECK(cudaFree(blocks[i]));
      CHECK(cudaFreeAsync(async_block, stream));
      CHECK(cudaStreamSynchronize(stream));
      CHECK(cudaFree(g_bad));
      frees += static_cast<long>(blocks.size() / 2) + 2;
      CHECK(cudaEventDestroy(event));
      CHECK(cudaStreamDestroy(stream));
      break;
    }
    // A kernel still running on the program's stream, and a free queued behind it.
    fill_and_check(blocks[1], kSizes[1], ++seed, stream);
    CHECK(cudaFreeAsync(async_block, stream));
    frees +=
        static_cast<long>(blocks.size() / 2) + 2;  // the async block, the left ones, the counter
    CHECK(cudaDeviceReset());
  }
  std::printf("allocations: %ld\nfrees: %ld\nok\n", allocations, frees);
  return 0;
}

int driver_rounds() {
  CU_CHECK(cuInit(0));
  CUdevice dev = 0;
  CU_CHECK(cuDeviceGet(&dev, 0));
  long allocations = 0, frees = 0;
  for (int round = 0; round < kRounds; ++round) {
    CUcontext ctx = nullptr;
    CU_CHECK(cuCtxCreate(&ctx, nullptr, 0, dev));
    std::vector<CUdeviceptr> blocks;
    for (std::size_t bytes : kSizes) {
      CUdeviceptr p = 0;
      CU_CHECK(cuMemAlloc(&p, bytes));
      ++allocations;
      const unsigned value = 0x01010101u * static_cast<unsigned>(round + 1);
      CU_CHECK(cuMemsetD32(p, value, bytes / 4));
      std::vector<unsigned> back(bytes / 4);
      CU_CHECK(cuMemcpyDtoH(back.data(), p, bytes / 4 * 4));
      for (unsigned w : back)
        EXPECT(w == value, "round %d: block of %zu bytes reads back wrong", round, bytes);
      blocks.push_back(p);
    }
    for (std::size_t i = 0; i < blocks.size(); i += 2) {
      CU_CHECK(cuMemFree(blocks[i]));
      ++frees;
    }
    frees += static_cast<long>(blocks.size() / 2);  // left to cuCtxDestroy
    CU_CHECK(cuCtxDestroy(ctx));
  }
  std::printf("allocations: %ld\nfrees: %ld\nok\n", allocations, frees);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gpu_test::require_gpu();
  const char* mode = argc > 1 ? argv[1] : "runtime";
  if (std::strcmp(mode, "runtime") == 0) return runtime_rounds();
  if (std::strcmp(mode, "driver") == 0) return driver_rounds();
  std::printf("usage: device_reset [runtime|driver]\n");
  return 2;
}
