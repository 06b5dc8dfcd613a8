// cudart_cost: what the CUDA runtime adds in front of the driver, per allocation call.
//
// A static-cudart program's cudaMalloc runs cudart's own code, then calls the driver entry point it
// got from cuGetProcAddress (under allocshim: the shim's wrapper). This program makes the same
// pairs both ways in one process, linked with -lcuda too:
//   cudaMalloc + cudaFree             vs  cuMemAlloc_v2 + cuMemFree_v2 (called directly)
//   cudaMallocAsync + cudaFreeAsync   vs  cuMemAllocAsync + cuMemFreeAsync (legacy stream)
// Natively the sync pairs cost the driver's ~80 µs and the difference is lost in it; under
// `allocshim run` both reach the same hook, so the difference is cudart's own cost per pair. The
// async pairs give the same difference natively (the driver's warm pool is cheap). Also timed:
// cudaGetDevice, cuCtxGetDevice, cuCtxGetCurrent, and the clock read of alloc_latency.
//
// Each number is the mean of a batch of calls between two clock reads, median of 15 batches (no
// clock read inside). Usage: cudart_cost [--quick] [--sync-sizes LIST-OF-BYTES]. One JSON line per
// item ({"bench":"cudart_cost",...}). Exit status: 0 done, 1 a CUDA call failed, 77 no GPU.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "op_timer.h"

namespace {

bool g_quick = false;

#define CHECK_RT(call)                                                                      \
  do {                                                                                      \
    const cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("FAIL: %s returned %s at %s:%d\n", #call, cudaGetErrorName(e_), __FILE__, \
                  __LINE__);                                                                \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)
#define CHECK_CU(call)                                                                      \
  do {                                                                                      \
    const CUresult e_ = (call);                                                             \
    if (e_ != CUDA_SUCCESS) {                                                               \
      std::printf("FAIL: %s returned %d at %s:%d\n", #call, static_cast<int>(e_), __FILE__, \
                  __LINE__);                                                                \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

template <class F>
double time_ops(const std::string& name, F&& body) {
  return allocshim::bench::time_ops("cudart_cost", name, 1, g_quick, body);
}

std::string size_name(std::size_t b) {
  char buf[32];
  if (b >= (1u << 20))
    std::snprintf(buf, sizeof buf, "%zu MiB", b >> 20);
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%zu KiB", b >> 10);
  else
    std::snprintf(buf, sizeof buf, "%zu B", b);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::size_t> sizes = {256, 1u << 20};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      g_quick = true;
    } else if (std::strcmp(argv[i], "--sync-sizes") == 0 && i + 1 < argc) {
      sizes.clear();
      for (char* s = argv[++i]; *s;) {
        sizes.push_back(std::strtoull(s, &s, 10));
        if (*s == ',') ++s;
      }
    } else {
      std::fprintf(stderr, "usage: cudart_cost [--quick] [--sync-sizes BYTES,...]\n");
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no GPU or driver\n");
    return 77;
  }
  CHECK_RT(cudaFree(nullptr));  // the primary context, current on this thread
  volatile long sink = 0;

  time_ops("steady_clock::now",
           [&] { sink = sink + std::chrono::steady_clock::now().time_since_epoch().count(); });
  time_ops("cudaGetDevice", [&] {
    int d = 0;
    cudaGetDevice(&d);
    sink = sink + d;
  });
  time_ops("cuCtxGetDevice", [&] {
    CUdevice d = 0;
    cuCtxGetDevice(&d);
    sink = sink + d;
  });
  time_ops("cuCtxGetCurrent", [&] {
    CUcontext c = nullptr;
    cuCtxGetCurrent(&c);
    sink = sink + static_cast<long>(reinterpret_cast<std::uintptr_t>(c));
  });

  for (std::size_t size : sizes) {
    time_ops("cudaMalloc+cudaFree " + size_name(size), [&] {
      void* p = nullptr;
      CHECK_RT(cudaMalloc(&p, size));
      CHECK_RT(cudaFree(p));
    });
    time_ops("cuMemAlloc+cuMemFree " + size_name(size), [&] {
      CUdeviceptr p = 0;
      CHECK_CU(cuMemAlloc(&p, size));
      CHECK_CU(cuMemFree(p));
    });
  }

  int dev = 0;
  CHECK_RT(cudaGetDevice(&dev));
  cudaMemPool_t pool;
  CHECK_RT(cudaDeviceGetDefaultMemPool(&pool, dev));
  std::uint64_t threshold = UINT64_MAX;
  CHECK_RT(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  long n = 0;
  time_ops("cudaMallocAsync+cudaFreeAsync 256 B", [&] {
    void* p = nullptr;
    CHECK_RT(cudaMallocAsync(&p, 256, cudaStreamLegacy));
    CHECK_RT(cudaFreeAsync(p, cudaStreamLegacy));
    if (++n % 1024 == 0) CHECK_RT(cudaStreamSynchronize(cudaStreamLegacy));
  });
  time_ops("cuMemAllocAsync+cuMemFreeAsync 256 B", [&] {
    CUdeviceptr p = 0;
    CHECK_CU(cuMemAllocAsync(&p, 256, CU_STREAM_LEGACY));
    CHECK_CU(cuMemFreeAsync(p, CU_STREAM_LEGACY));
    if (++n % 1024 == 0) CHECK_CU(cuStreamSynchronize(CU_STREAM_LEGACY));
  });
  CHECK_RT(cudaStreamSynchronize(cudaStreamLegacy));
  return 0;
}
