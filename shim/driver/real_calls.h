// The libcuda entry points the real driver table calls, and the conversions from the core's types to
// cuda.h's: shared by the files that fill the table (real_driver.cpp, real_memory.cpp).
#pragma once

#include <cuda.h>

#include "base/driver.h"

namespace allocshim::libcuda {

// Typed pointers to libcuda, one per entry point the table uses.
// One entry a line, as the list is read and edited (not reflowed).
// clang-format off
#define ALLOCSHIM_REAL_LIST(X)                                                                      \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGetAttribute) X(cuDeviceGetName)   \
  X(cuDeviceTotalMem_v2) X(cuDeviceGetUuid_v2) X(cuDeviceGet) X(cuCtxGetDevice) X(cuCtxGetCurrent) X(cuCtxSetCurrent)    \
  X(cuCtxSynchronize) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2) X(cuDevicePrimaryCtxGetState) X(cuCtxGetId) \
  X(cuCtxEnablePeerAccess) X(cuMemGetInfo_v2) X(cuMemAlloc_v2) X(cuMemAllocPitch_v2) X(cuMemFree_v2) \
  X(cuMemAllocManaged) X(cuMemHostAlloc) X(cuMemAllocHost_v2) X(cuMemFreeHost)                     \
  X(cuMemGetAddressRange_v2) X(cuPointerGetAttribute) X(cuPointerGetAttributes) X(cuMemAdvise_v2)  \
  X(cuMemPrefetchAsync_v2) X(cuMemAllocAsync) X(cuMemAllocFromPoolAsync) X(cuMemFreeAsync)         \
  X(cuMemPoolCreate) X(cuMemPoolDestroy) X(cuMemPoolSetAttribute) X(cuMemPoolGetAttribute)         \
  X(cuMemPoolTrimTo) X(cuMemPoolSetAccess) X(cuMemPoolExportToShareableHandle)                     \
  X(cuMemPoolImportFromShareableHandle) X(cuMemPoolExportPointer) X(cuMemPoolImportPointer)        \
  X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease) X(cuMemAddressReserve)           \
  X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemExportToShareableHandle)  \
  X(cuMemImportFromShareableHandle) X(cuMemRetainAllocationHandle) X(cuStreamCreate)               \
  X(cuStreamCreateWithPriority) X(cuStreamDestroy_v2) X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamIsCapturing) X(cuStreamWaitEvent) X(cuThreadExchangeStreamCaptureMode) \
  X(cuEventCreate) X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize) X(cuEventDestroy_v2)     \
  X(cuEventElapsedTime)                                                                            \
  X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle_v2) X(cuIpcCloseMemHandle) X(cuMemcpyHtoD_v2)          \
  X(cuMemcpyDtoH_v2) X(cuMemsetD8_v2) X(cuMemcpyDtoD_v2) X(cuFuncGetParamInfo) X(cuKernelGetParamInfo)
// clang-format on

struct Real {
#define X(name) decltype(&::name) name = nullptr;
  ALLOCSHIM_REAL_LIST(X)
#undef X
};
// Filled once by load_real_driver (real_driver.cpp); an entry libcuda lacks stays null.
extern Real g_real;

inline Result call_missing() { return res::not_supported; }
#define CALL(name, ...) \
  (g_real.name ? static_cast<Result>(g_real.name(__VA_ARGS__)) : call_missing())

inline CUmemLocation to_cu(const Location& l) {
  CUmemLocation out{};
  switch (l.type) {
    case Location::Type::device: out.type = CU_MEM_LOCATION_TYPE_DEVICE; break;
    case Location::Type::host: out.type = CU_MEM_LOCATION_TYPE_HOST; break;
    case Location::Type::host_numa: out.type = CU_MEM_LOCATION_TYPE_HOST_NUMA; break;
  }
  out.id = l.id;
  return out;
}

inline CUmemAllocationProp to_cu(const PhysSpec& s) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location = to_cu(s.location);
  p.requestedHandleTypes =
      s.posix_fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return p;
}

inline CUdevice_attribute to_cu(DevAttr a) {
  switch (a) {
    case DevAttr::vmm_supported: return CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
    case DevAttr::pools_supported: return CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED;
    case DevAttr::posix_fd_supported:
      return CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED;
    case DevAttr::concurrent_managed_access: return CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS;
    case DevAttr::host_numa_id: return CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID;
    case DevAttr::host_numa_vmm:
      return CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
    case DevAttr::host_numa_pools: return CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED;
    case DevAttr::unified_addressing: return CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING;
  }
  return CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING;
}

inline CUstream cu(Stream s) { return static_cast<CUstream>(s); }
inline CUevent cu_event(Event e) { return static_cast<CUevent>(e); }
inline CUmemoryPool cu_pool(Pool p) { return static_cast<CUmemoryPool>(p); }

// The table's memory entries (real_memory.cpp).
void fill_memory(Driver& t);
void fill_pools(Driver& t);
void fill_pool_sharing(Driver& t);
void fill_vmm(Driver& t);

}  // namespace allocshim::libcuda
