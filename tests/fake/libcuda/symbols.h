// Internal to the fake libcuda: the list of every exported driver symbol (one counter each), and
// the helpers its entry points share.
#pragma once

// The real driver's own build mode: no renaming macros, so each definition below carries its exact
// symbol name (cuMemAlloc is the 32-bit v1, cuMemAlloc_v2 the current one) and every variant,
// _ptsz/_ptds included, has its declaration.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "fake_driver.h"

#define FAKECUDA_EXPORT extern "C" __attribute__((visibility("default")))

// Every exported driver entry point, by exact symbol name.
// One entry a line, as the list is read and edited (not reflowed).
// clang-format off
#define FAKECUDA_SYMBOLS(X)                                                                          \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetAttribute)        \
  X(cuDeviceGetName) X(cuDeviceTotalMem) X(cuDeviceTotalMem_v2) X(cuDeviceGetUuid_v2)               \
  X(cuDeviceCanAccessPeer)                                                                          \
  X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize)                       \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuDevicePrimaryCtxRelease_v2)          \
  X(cuDevicePrimaryCtxGetState) X(cuDevicePrimaryCtxReset) X(cuDevicePrimaryCtxReset_v2)            \
  X(cuCtxDestroy) X(cuCtxDestroy_v2) X(cuCtxEnablePeerAccess) X(cuCtxGetId)                       \
  X(cuMemGetInfo) X(cuMemGetInfo_v2) X(cuMemAlloc) X(cuMemAlloc_v2) X(cuMemAllocPitch)              \
  X(cuMemAllocPitch_v2) X(cuMemFree) X(cuMemFree_v2) X(cuMemAllocManaged) X(cuMemHostAlloc)         \
  X(cuMemAllocHost) X(cuMemAllocHost_v2) X(cuMemFreeHost) X(cuMemGetAddressRange)                   \
  X(cuMemGetAddressRange_v2) X(cuPointerGetAttribute) X(cuPointerGetAttributes) X(cuMemAdvise)      \
  X(cuMemAdvise_v2) X(cuMemPrefetchAsync) X(cuMemPrefetchAsync_ptsz) X(cuMemPrefetchAsync_v2)       \
  X(cuMemPrefetchAsync_v2_ptsz) X(cuMemcpyHtoD_v2) X(cuMemcpyHtoD_v2_ptds) X(cuMemcpyDtoH_v2)      \
  X(cuMemcpyDtoH_v2_ptds) X(cuMemcpyDtoD_v2) X(cuMemsetD8_v2) X(cuMemsetD8_v2_ptds)                                    \
  X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz) X(cuMemAllocFromPoolAsync)                             \
  X(cuMemAllocFromPoolAsync_ptsz) X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) X(cuMemPoolCreate)       \
  X(cuMemPoolDestroy) X(cuMemPoolSetAttribute) X(cuMemPoolGetAttribute) X(cuMemPoolTrimTo)          \
  X(cuMemPoolSetAccess) X(cuMemPoolExportToShareableHandle) X(cuMemPoolImportFromShareableHandle)  \
  X(cuMemPoolExportPointer) X(cuMemPoolImportPointer) X(cuDeviceGetDefaultMemPool)                  \
  X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease) X(cuMemAddressReserve)            \
  X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemExportToShareableHandle)   \
  X(cuMemImportFromShareableHandle) X(cuMemRetainAllocationHandle)                                  \
  X(cuStreamCreate) X(cuStreamCreateWithPriority) X(cuStreamDestroy) X(cuStreamDestroy_v2)          \
  X(cuStreamSynchronize) X(cuStreamSynchronize_ptsz) X(cuStreamWaitEvent) X(cuStreamWaitEvent_ptsz) \
  X(cuStreamQuery) X(cuStreamQuery_ptsz) X(cuStreamIsCapturing) X(cuCtxSynchronize_v2)              \
  X(cuThreadExchangeStreamCaptureMode)                                                              \
  X(cuEventCreate) X(cuEventRecord) X(cuEventRecord_ptsz) X(cuEventQuery) X(cuEventSynchronize)     \
  X(cuEventDestroy) X(cuEventDestroy_v2) X(cuEventElapsedTime)                                     \
  X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcOpenMemHandle_v2) X(cuIpcCloseMemHandle)        \
  X(cuGetProcAddress) X(cuGetProcAddress_v2) X(cuGetExportTable) X(cuGetErrorString)                \
  X(cuGetErrorName) X(cuLaunchKernel) X(cuLaunchKernel_ptsz) X(cuFuncGetParamInfo)                  \
  X(cuKernelGetParamInfo) X(cuModuleUnload) X(cuLibraryUnload)
// clang-format on

namespace fakecuda {

enum class Sym : int {
#define FAKECUDA_SYM_ENUM(name) name,
  FAKECUDA_SYMBOLS(FAKECUDA_SYM_ENUM)
#undef FAKECUDA_SYM_ENUM
      count
};

// Counts a call of `sym` (and remembers its stream argument when it has one).
void enter(Sym sym);
void enter(Sym sym, CUstream stream);
// The exported address of `sym`: the very address dlsym returns for it (see CMakeLists: the
// library is linked -Bsymbolic, so an interposer's definition never replaces it here).
void* address(Sym sym);
const char* name(Sym sym);

// The simulated device (created from the environment on first use, never destroyed: programs and
// interposers may call the driver from exit handlers).
const allocshim::Driver& drv();
allocshim::fake::FakeDriver& fake();

inline CUresult cu(allocshim::Result r) { return static_cast<CUresult>(r); }
// A null stream is the legacy stream for plain entry points and the calling thread's stream for
// _ptsz/_ptds ones; CU_STREAM_LEGACY/CU_STREAM_PER_THREAD have the core's values already.
inline allocshim::Stream legacy(CUstream s) { return s ? s : allocshim::kStreamLegacy; }
inline allocshim::Stream per_thread(CUstream s) { return s ? s : allocshim::kStreamPerThread; }
allocshim::Location location(const CUmemLocation& l);

// `make` fills a handle of the fake driver's type (Ours); on success the caller gets it as the
// CUDA type (Theirs), and `out` is left alone on failure, as the driver does.
template <class Ours, class Theirs, class Make>
CUresult hand_out(Theirs* out, Make make) {
  Ours h = nullptr;
  const CUresult r = cu(make(&h));
  if (r == CUDA_SUCCESS) *out = static_cast<Theirs>(h);
  return r;
}

}  // namespace fakecuda

#define FAKECUDA_ENTER(sym, ...) ::fakecuda::enter(::fakecuda::Sym::sym __VA_OPT__(, ) __VA_ARGS__)

// An entry point that takes `stream` and its _ptsz twin: they differ only in what a null stream
// means (see legacy, per_thread), so `call` is written once, with that stream as `stream_`.
#define FAKECUDA_STREAM_PAIR(name, params, call)                      \
  FAKECUDA_EXPORT CUresult CUDAAPI name params {                      \
    FAKECUDA_ENTER(name, stream);                                     \
    const allocshim::Stream stream_ = ::fakecuda::legacy(stream);     \
    return ::fakecuda::cu(call);                                      \
  }                                                                   \
  FAKECUDA_EXPORT CUresult CUDAAPI name##_ptsz params {               \
    FAKECUDA_ENTER(name##_ptsz, stream);                              \
    const allocshim::Stream stream_ = ::fakecuda::per_thread(stream); \
    return ::fakecuda::cu(call);                                      \
  }

// An entry point that only forwards to the fake driver: `call` with the entry point's own
// `params`; what follows `call` goes to FAKECUDA_ENTER (the stream a call is ordered on).
#define FAKECUDA_FORWARD(name, params, call, ...)    \
  FAKECUDA_EXPORT CUresult CUDAAPI name params {     \
    FAKECUDA_ENTER(name __VA_OPT__(, ) __VA_ARGS__); \
    return ::fakecuda::cu(call);                     \
  }

// Two entry points that behave the same in the fake (a version and its successor, or a _ptds
// twin of a synchronous call): one forwarding definition for both.
#define FAKECUDA_FORWARD_TWINS(name, twin, params, call, ...)     \
  FAKECUDA_FORWARD(name, params, call __VA_OPT__(, ) __VA_ARGS__) \
  FAKECUDA_FORWARD(twin, params, call __VA_OPT__(, ) __VA_ARGS__)

// A 32-bit v1 entry point: it cannot describe 64-bit memory, and exists (as in the real library)
// so that a resolver asked for an old version returns a distinct address. `params` are unnamed.
#define FAKECUDA_V1_UNSUPPORTED(name, params)    \
  FAKECUDA_EXPORT CUresult CUDAAPI name params { \
    FAKECUDA_ENTER(name);                        \
    return CUDA_ERROR_NOT_SUPPORTED;             \
  }
