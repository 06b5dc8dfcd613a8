// cuGetProcAddress / cuGetProcAddress_v2 and cuGetExportTable.
//
// The resolver answers a base name ("cuMemAlloc") with the variant the requested CUDA version and
// flags select, exactly as the real driver does: the newest variant introduced at or before the
// version, and with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM the _ptsz/_ptds variant where
// one exists. The address returned is the exported symbol's own (the one dlsym gives), because an
// interposer tells variants apart by address.
#include <cstring>

#include "fakecuda.h"
#include "symbols.h"

namespace fakecuda {
namespace {

// One row per (base name, variant): the version that introduced it and whether it is the
// per-thread-default-stream flavour.
struct Row {
  const char* base;
  int version;
  bool per_thread;
  Sym sym;
};

constexpr Row kRows[] = {
    {"cuInit", 2000, false, Sym::cuInit},
    {"cuDriverGetVersion", 2020, false, Sym::cuDriverGetVersion},
    {"cuDeviceGet", 2000, false, Sym::cuDeviceGet},
    {"cuDeviceGetCount", 2000, false, Sym::cuDeviceGetCount},
    {"cuDeviceGetAttribute", 2000, false, Sym::cuDeviceGetAttribute},
    {"cuDeviceGetName", 2000, false, Sym::cuDeviceGetName},
    {"cuDeviceTotalMem", 2000, false, Sym::cuDeviceTotalMem},
    {"cuDeviceTotalMem", 3020, false, Sym::cuDeviceTotalMem_v2},
    {"cuDeviceGetUuid", 11040, false, Sym::cuDeviceGetUuid_v2},
    {"cuDeviceCanAccessPeer", 4000, false, Sym::cuDeviceCanAccessPeer},
    {"cuCtxGetCurrent", 4000, false, Sym::cuCtxGetCurrent},
    {"cuCtxSetCurrent", 4000, false, Sym::cuCtxSetCurrent},
    {"cuCtxGetDevice", 2000, false, Sym::cuCtxGetDevice},
    {"cuCtxSynchronize", 2000, false, Sym::cuCtxSynchronize},
    {"cuCtxSynchronize", 13000, false, Sym::cuCtxSynchronize_v2},
    {"cuDevicePrimaryCtxRetain", 7000, false, Sym::cuDevicePrimaryCtxRetain},
    {"cuDevicePrimaryCtxRelease", 7000, false, Sym::cuDevicePrimaryCtxRelease},
    {"cuDevicePrimaryCtxRelease", 11000, false, Sym::cuDevicePrimaryCtxRelease_v2},
    {"cuDevicePrimaryCtxGetState", 7000, false, Sym::cuDevicePrimaryCtxGetState},
    {"cuDevicePrimaryCtxReset", 7000, false, Sym::cuDevicePrimaryCtxReset},
    {"cuDevicePrimaryCtxReset", 11000, false, Sym::cuDevicePrimaryCtxReset_v2},
    {"cuCtxDestroy", 2000, false, Sym::cuCtxDestroy},
    {"cuCtxDestroy", 4000, false, Sym::cuCtxDestroy_v2},
    {"cuCtxEnablePeerAccess", 4000, false, Sym::cuCtxEnablePeerAccess},
    {"cuCtxGetId", 12000, false, Sym::cuCtxGetId},
    {"cuMemGetInfo", 2000, false, Sym::cuMemGetInfo},
    {"cuMemGetInfo", 3020, false, Sym::cuMemGetInfo_v2},
    {"cuMemAlloc", 2000, false, Sym::cuMemAlloc},
    {"cuMemAlloc", 3020, false, Sym::cuMemAlloc_v2},
    {"cuMemAllocPitch", 2000, false, Sym::cuMemAllocPitch},
    {"cuMemAllocPitch", 3020, false, Sym::cuMemAllocPitch_v2},
    {"cuMemFree", 2000, false, Sym::cuMemFree},
    {"cuMemFree", 3020, false, Sym::cuMemFree_v2},
    {"cuMemAllocManaged", 6000, false, Sym::cuMemAllocManaged},
    {"cuMemHostAlloc", 2020, false, Sym::cuMemHostAlloc},
    {"cuMemAllocHost", 2000, false, Sym::cuMemAllocHost},
    {"cuMemAllocHost", 3020, false, Sym::cuMemAllocHost_v2},
    {"cuMemFreeHost", 2000, false, Sym::cuMemFreeHost},
    {"cuMemGetAddressRange", 2000, false, Sym::cuMemGetAddressRange},
    {"cuMemGetAddressRange", 3020, false, Sym::cuMemGetAddressRange_v2},
    {"cuPointerGetAttribute", 4000, false, Sym::cuPointerGetAttribute},
    {"cuPointerGetAttributes", 7000, false, Sym::cuPointerGetAttributes},
    {"cuMemAdvise", 8000, false, Sym::cuMemAdvise},
    {"cuMemAdvise", 12020, false, Sym::cuMemAdvise_v2},
    {"cuMemPrefetchAsync", 8000, false, Sym::cuMemPrefetchAsync},
    {"cuMemPrefetchAsync", 8000, true, Sym::cuMemPrefetchAsync_ptsz},
    {"cuMemPrefetchAsync", 12020, false, Sym::cuMemPrefetchAsync_v2},
    {"cuMemPrefetchAsync", 12020, true, Sym::cuMemPrefetchAsync_v2_ptsz},
    {"cuMemcpyHtoD", 3020, false, Sym::cuMemcpyHtoD_v2},
    {"cuMemcpyHtoD", 7000, true, Sym::cuMemcpyHtoD_v2_ptds},
    {"cuMemcpyDtoH", 3020, false, Sym::cuMemcpyDtoH_v2},
    {"cuMemcpyDtoD", 3020, false, Sym::cuMemcpyDtoD_v2},
    {"cuMemcpyDtoH", 7000, true, Sym::cuMemcpyDtoH_v2_ptds},
    {"cuMemsetD8", 3020, false, Sym::cuMemsetD8_v2},
    {"cuMemsetD8", 7000, true, Sym::cuMemsetD8_v2_ptds},
    {"cuLaunchKernel", 4000, false, Sym::cuLaunchKernel},
    {"cuLaunchKernel", 7000, true, Sym::cuLaunchKernel_ptsz},
    {"cuFuncGetParamInfo", 12040, false, Sym::cuFuncGetParamInfo},
    {"cuKernelGetParamInfo", 12040, false, Sym::cuKernelGetParamInfo},
    {"cuModuleUnload", 2000, false, Sym::cuModuleUnload},
    {"cuLibraryUnload", 12000, false, Sym::cuLibraryUnload},
    {"cuMemAllocAsync", 11020, false, Sym::cuMemAllocAsync},
    {"cuMemAllocAsync", 11020, true, Sym::cuMemAllocAsync_ptsz},
    {"cuMemAllocFromPoolAsync", 11020, false, Sym::cuMemAllocFromPoolAsync},
    {"cuMemAllocFromPoolAsync", 11020, true, Sym::cuMemAllocFromPoolAsync_ptsz},
    {"cuMemFreeAsync", 11020, false, Sym::cuMemFreeAsync},
    {"cuMemFreeAsync", 11020, true, Sym::cuMemFreeAsync_ptsz},
    {"cuMemPoolCreate", 11020, false, Sym::cuMemPoolCreate},
    {"cuMemPoolDestroy", 11020, false, Sym::cuMemPoolDestroy},
    {"cuMemPoolSetAttribute", 11020, false, Sym::cuMemPoolSetAttribute},
    {"cuMemPoolGetAttribute", 11020, false, Sym::cuMemPoolGetAttribute},
    {"cuMemPoolTrimTo", 11020, false, Sym::cuMemPoolTrimTo},
    {"cuMemPoolSetAccess", 11020, false, Sym::cuMemPoolSetAccess},
    {"cuMemPoolExportToShareableHandle", 11020, false, Sym::cuMemPoolExportToShareableHandle},
    {"cuMemPoolImportFromShareableHandle", 11020, false, Sym::cuMemPoolImportFromShareableHandle},
    {"cuMemPoolExportPointer", 11020, false, Sym::cuMemPoolExportPointer},
    {"cuMemPoolImportPointer", 11020, false, Sym::cuMemPoolImportPointer},
    {"cuDeviceGetDefaultMemPool", 11020, false, Sym::cuDeviceGetDefaultMemPool},
    {"cuMemGetAllocationGranularity", 10020, false, Sym::cuMemGetAllocationGranularity},
    {"cuMemCreate", 10020, false, Sym::cuMemCreate},
    {"cuMemRelease", 10020, false, Sym::cuMemRelease},
    {"cuMemAddressReserve", 10020, false, Sym::cuMemAddressReserve},
    {"cuMemAddressFree", 10020, false, Sym::cuMemAddressFree},
    {"cuMemMap", 10020, false, Sym::cuMemMap},
    {"cuMemUnmap", 10020, false, Sym::cuMemUnmap},
    {"cuMemSetAccess", 10020, false, Sym::cuMemSetAccess},
    {"cuMemExportToShareableHandle", 10020, false, Sym::cuMemExportToShareableHandle},
    {"cuMemImportFromShareableHandle", 10020, false, Sym::cuMemImportFromShareableHandle},
    {"cuMemRetainAllocationHandle", 11000, false, Sym::cuMemRetainAllocationHandle},
    {"cuStreamCreate", 2000, false, Sym::cuStreamCreate},
    {"cuStreamCreateWithPriority", 5050, false, Sym::cuStreamCreateWithPriority},
    {"cuStreamDestroy", 2000, false, Sym::cuStreamDestroy},
    {"cuStreamDestroy", 4000, false, Sym::cuStreamDestroy_v2},
    {"cuStreamSynchronize", 2000, false, Sym::cuStreamSynchronize},
    {"cuStreamSynchronize", 7000, true, Sym::cuStreamSynchronize_ptsz},
    {"cuStreamQuery", 2000, false, Sym::cuStreamQuery},
    {"cuStreamQuery", 7000, true, Sym::cuStreamQuery_ptsz},
    {"cuStreamWaitEvent", 3020, false, Sym::cuStreamWaitEvent},
    {"cuStreamWaitEvent", 7000, true, Sym::cuStreamWaitEvent_ptsz},
    {"cuEventCreate", 2000, false, Sym::cuEventCreate},
    {"cuEventRecord", 2000, false, Sym::cuEventRecord},
    {"cuEventRecord", 7000, true, Sym::cuEventRecord_ptsz},
    {"cuEventQuery", 2000, false, Sym::cuEventQuery},
    {"cuEventSynchronize", 2000, false, Sym::cuEventSynchronize},
    {"cuEventDestroy", 2000, false, Sym::cuEventDestroy},
    {"cuEventDestroy", 4000, false, Sym::cuEventDestroy_v2},
    {"cuEventElapsedTime", 2000, false, Sym::cuEventElapsedTime},
    {"cuIpcGetMemHandle", 4010, false, Sym::cuIpcGetMemHandle},
    {"cuIpcOpenMemHandle", 4010, false, Sym::cuIpcOpenMemHandle},
    {"cuIpcOpenMemHandle", 11000, false, Sym::cuIpcOpenMemHandle_v2},
    {"cuIpcCloseMemHandle", 4010, false, Sym::cuIpcCloseMemHandle},
    {"cuGetProcAddress", 11030, false, Sym::cuGetProcAddress},
    {"cuGetProcAddress", 12000, false, Sym::cuGetProcAddress_v2},
    {"cuGetExportTable", 3000, false, Sym::cuGetExportTable},
    {"cuGetErrorString", 6000, false, Sym::cuGetErrorString},
    {"cuGetErrorName", 6000, false, Sym::cuGetErrorName},
};

void* const kAddresses[] = {
#define FAKECUDA_SYM_ADDRESS(n) reinterpret_cast<void*>(&::n),
    FAKECUDA_SYMBOLS(FAKECUDA_SYM_ADDRESS)
#undef FAKECUDA_SYM_ADDRESS
};

CUresult resolve(const char* symbol, void** pfn, int version, cuuint64_t flags,
                 CUdriverProcAddressQueryResult* status) {
  auto set_status = [&](CUdriverProcAddressQueryResult s) {
    if (status != nullptr) *status = s;
  };
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  const bool want_per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const Row* best = nullptr;
  bool known = false;
  for (const Row& r : kRows) {
    if (std::strcmp(r.base, symbol) != 0) continue;
    known = true;
    if (r.version > version || (r.per_thread && !want_per_thread)) continue;
    // A per-thread variant beats the plain one when asked for; otherwise the newest wins.
    if (best == nullptr || (r.per_thread && !best->per_thread) ||
        (r.per_thread == best->per_thread && r.version > best->version))
      best = &r;
  }
  if (best == nullptr) {
    set_status(known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                     : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = address(best->sym);
  set_status(CU_GET_PROC_ADDRESS_SUCCESS);
  return CUDA_SUCCESS;
}

// What cuGetExportTable hands out for every id: a table of nothing, recognisable by address.
const void* const kExportTable[4] = {};

}  // namespace

void* address(Sym sym) { return kAddresses[static_cast<int>(sym)]; }

}  // namespace fakecuda

using namespace fakecuda;

FAKECUDA_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int version,
                                                  cuuint64_t flags) {
  FAKECUDA_ENTER(cuGetProcAddress);
  return resolve(symbol, pfn, version, flags, nullptr);
}

FAKECUDA_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                                     cuuint64_t flags,
                                                     CUdriverProcAddressQueryResult* status) {
  FAKECUDA_ENTER(cuGetProcAddress_v2);
  return resolve(symbol, pfn, version, flags, status);
}

FAKECUDA_EXPORT CUresult CUDAAPI cuGetExportTable(const void** table, const CUuuid* id) {
  FAKECUDA_ENTER(cuGetExportTable);
  if (table == nullptr || id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *table = kExportTable;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT const void* fakecuda_export_table(void) { return kExportTable; }
