// A host-only stand-in for the few CUDA runtime calls alloc_latency makes, so that its argument
// parsing, loops, statistics and output run (and are tested) where there is no GPU: blocks come
// from malloc, a fake 16 GiB device counts what is live. Built as alloc_latency_mock
// (alloc_latency_mock.cpp); nothing here is used by the real program.
// MOCK_CUDA_NO_DEVICE=1 in the environment makes cudaGetDeviceCount fail as it does without a driver;
// MOCK_CUDA_FAIL_ABOVE=N makes requests larger than N bytes fail.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInsufficientDriver = 35
};
enum cudaDeviceAttr { cudaDevAttrMemoryPoolsSupported = 115 };
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess = 0 };
#define cudaEnableDefault 0x0
#define cudaStreamNonBlocking 0x1
enum cudaMemPoolAttr { cudaMemPoolAttrReleaseThreshold = 4 };
struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUmemPoolHandle_st;
using cudaMemPool_t = CUmemPoolHandle_st*;
#define cudaStreamLegacy ((cudaStream_t)0x1)

struct cudaDeviceProp {
  char name[256];
  int major, minor;
};

namespace mock_cuda {
inline constexpr std::size_t kTotal = std::size_t{16} << 30;
inline std::atomic<std::size_t> live{0};
// Each block carries its size in front, so a free can count it down.
inline constexpr std::size_t kHeader = 256;
}  // namespace mock_cuda

inline const char* cudaGetErrorName(cudaError_t e) {
  return e == cudaSuccess                 ? "cudaSuccess"
         : e == cudaErrorMemoryAllocation ? "cudaErrorMemoryAllocation"
                                          : "cudaErrorInsufficientDriver";
}
inline const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess                 ? "no error"
         : e == cudaErrorMemoryAllocation ? "out of memory"
                                          : "no driver (mock)";
}
inline cudaError_t cudaGetDeviceCount(int* n) {
  const char* none = std::getenv("MOCK_CUDA_NO_DEVICE");
  if (none && *none == '1') return cudaErrorInsufficientDriver;
  *n = 1;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* d) { return *d = 0, cudaSuccess; }
inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaDriverGetVersion(int* v) { return *v = 13000, cudaSuccess; }
inline cudaError_t cudaRuntimeGetVersion(int* v) { return *v = 13000, cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::memset(p, 0, sizeof *p);
  std::strcpy(p->name, "Mock \"GPU\"");
  p->major = 9;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) {
  return *v = 1, cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(std::size_t* free, std::size_t* total) {
  *total = mock_cuda::kTotal;
  *free = mock_cuda::kTotal - mock_cuda::live.load();
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  // MOCK_CUDA_FAIL_ABOVE=N: requests larger than N bytes fail, as a backend with a size limit would.
  if (const char* limit = std::getenv("MOCK_CUDA_FAIL_ABOVE");
      limit && bytes > std::strtoull(limit, nullptr, 10))
    return cudaErrorMemoryAllocation;
  if (mock_cuda::live.fetch_add(bytes) + bytes > mock_cuda::kTotal) {
    mock_cuda::live.fetch_sub(bytes);
    return cudaErrorMemoryAllocation;
  }
  // Untouched pages beyond the header: a 1 GiB block costs no real memory.
  auto* base = static_cast<unsigned char*>(std::malloc(bytes + mock_cuda::kHeader));
  if (!base) return cudaErrorMemoryAllocation;
  std::memcpy(base, &bytes, sizeof bytes);
  *p = base + mock_cuda::kHeader;
  return cudaSuccess;
}
template <class T>
cudaError_t cudaMalloc(T** p, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  auto* base = static_cast<unsigned char*>(p) - mock_cuda::kHeader;
  std::size_t bytes;
  std::memcpy(&bytes, base, sizeof bytes);
  mock_cuda::live.fetch_sub(bytes);
  std::free(base);
  return cudaSuccess;
}
inline cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t) {
  return cudaMalloc(p, bytes);
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int) {
  return *pool = nullptr, cudaSuccess;
}
inline cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) {
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  return *s = cudaStreamLegacy, cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
// The driver's cuMemAlloc_v2 / cuMemFree_v2, served by the mock's cudaMalloc / cudaFree.
namespace mock_cuda {
inline int mem_alloc(unsigned long long* d, std::size_t bytes) {
  void* p = nullptr;
  const int r = cudaMalloc(&p, bytes) == cudaSuccess ? 0 : 2;
  *d = reinterpret_cast<unsigned long long>(p);
  return r;
}
inline int mem_free(unsigned long long d) {
  return cudaFree(reinterpret_cast<void*>(d)) == cudaSuccess ? 0 : 1;
}
}  // namespace mock_cuda
inline cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned,
                                                    unsigned long long,
                                                    cudaDriverEntryPointQueryResult* found) {
  const std::string name(symbol);
  *fn = name == "cuMemAlloc"  ? reinterpret_cast<void*>(&mock_cuda::mem_alloc)
        : name == "cuMemFree" ? reinterpret_cast<void*>(&mock_cuda::mem_free)
                              : nullptr;
  if (found) *found = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}
