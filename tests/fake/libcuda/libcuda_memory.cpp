// Classic allocations, managed and pinned host memory, pointer queries, copies and native IPC.
#include <cstring>

#include "symbols.h"

using namespace fakecuda;
using allocshim::DevPtr;

FAKECUDA_EXPORT CUresult CUDAAPI cuMemGetInfo(unsigned int* free, unsigned int* total) {
  FAKECUDA_ENTER(cuMemGetInfo);
  (void)free;
  (void)total;
  return CUDA_ERROR_NOT_SUPPORTED;  // 32-bit v1 (see cuDeviceTotalMem)
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  FAKECUDA_ENTER(cuMemGetInfo_v2);
  return cu(drv().mem_get_info(free, total));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytesize) {
  FAKECUDA_ENTER(cuMemAlloc);
  (void)dptr;
  (void)bytesize;
  return CUDA_ERROR_NOT_SUPPORTED;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  FAKECUDA_ENTER(cuMemAlloc_v2);
  return cu(drv().mem_alloc(dptr, bytesize));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemAllocPitch(CUdeviceptr_v1* dptr, unsigned int* pitch,
                                                 unsigned int width, unsigned int height,
                                                 unsigned int element) {
  FAKECUDA_ENTER(cuMemAllocPitch);
  (void)dptr, (void)pitch, (void)width, (void)height, (void)element;
  return CUDA_ERROR_NOT_SUPPORTED;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width,
                                                    size_t height, unsigned int element) {
  FAKECUDA_ENTER(cuMemAllocPitch_v2);
  return cu(drv().mem_alloc_pitch(dptr, pitch, width, height, element));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemFree(CUdeviceptr_v1 dptr) {
  FAKECUDA_ENTER(cuMemFree);
  (void)dptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  FAKECUDA_ENTER(cuMemFree_v2);
  return cu(drv().mem_free(dptr));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize,
                                                   unsigned int flags) {
  FAKECUDA_ENTER(cuMemAllocManaged);
  return cu(drv().mem_alloc_managed(dptr, bytesize, flags));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  FAKECUDA_ENTER(cuMemHostAlloc);
  return cu(drv().mem_host_alloc(pp, bytesize, flags));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemAllocHost(void** pp, unsigned int bytesize) {
  FAKECUDA_ENTER(cuMemAllocHost);
  (void)pp;
  (void)bytesize;
  return CUDA_ERROR_NOT_SUPPORTED;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytesize) {
  FAKECUDA_ENTER(cuMemAllocHost_v2);
  return cu(drv().mem_alloc_host(pp, bytesize));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemFreeHost(void* p) {
  FAKECUDA_ENTER(cuMemFreeHost);
  return cu(drv().mem_free_host(p));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemGetAddressRange(CUdeviceptr_v1* base, unsigned int* size,
                                                      CUdeviceptr_v1 dptr) {
  FAKECUDA_ENTER(cuMemGetAddressRange);
  (void)base, (void)size, (void)dptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size,
                                                         CUdeviceptr dptr) {
  FAKECUDA_ENTER(cuMemGetAddressRange_v2);
  return cu(drv().mem_get_address_range(base, size, dptr));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                                       CUdeviceptr ptr) {
  FAKECUDA_ENTER(cuPointerGetAttribute);
  return cu(drv().pointer_get_attribute(data, attribute, ptr));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuPointerGetAttributes(unsigned int count,
                                                        CUpointer_attribute* attributes,
                                                        void** data, CUdeviceptr ptr) {
  FAKECUDA_ENTER(cuPointerGetAttributes);
  static_assert(sizeof(CUpointer_attribute) == sizeof(int));
  return cu(drv().pointer_get_attributes(count, reinterpret_cast<int*>(attributes), data, ptr));
}

// ---- Managed memory: advice and prefetch (v1 takes a device, v2 a CUmemLocation) ---------------

namespace {

allocshim::Location device_location(CUdevice device) {
  // CU_DEVICE_CPU (-1) names the host in the v1 calls.
  if (device == CU_DEVICE_CPU) return {allocshim::Location::Type::host, 0};
  return {allocshim::Location::Type::device, device};
}

CUresult advise(CUdeviceptr ptr, size_t count, CUmem_advise advice, allocshim::Location where) {
  return cu(drv().mem_advise(ptr, count, static_cast<allocshim::Advice>(advice), where));
}

}  // namespace

FAKECUDA_EXPORT CUresult CUDAAPI cuMemAdvise(CUdeviceptr ptr, size_t count, CUmem_advise advice,
                                             CUdevice device) {
  FAKECUDA_ENTER(cuMemAdvise);
  return advise(ptr, count, advice, device_location(device));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemAdvise_v2(CUdeviceptr ptr, size_t count, CUmem_advise advice,
                                                CUmemLocation location) {
  FAKECUDA_ENTER(cuMemAdvise_v2);
  return advise(ptr, count, advice, fakecuda::location(location));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr ptr, size_t count, CUdevice device,
                                                    CUstream stream) {
  FAKECUDA_ENTER(cuMemPrefetchAsync, stream);
  return cu(drv().mem_prefetch_async(ptr, count, device_location(device), legacy(stream)));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemPrefetchAsync_ptsz(CUdeviceptr ptr, size_t count,
                                                         CUdevice device, CUstream stream) {
  FAKECUDA_ENTER(cuMemPrefetchAsync_ptsz, stream);
  return cu(drv().mem_prefetch_async(ptr, count, device_location(device), per_thread(stream)));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemPrefetchAsync_v2(CUdeviceptr ptr, size_t count,
                                                       CUmemLocation location, unsigned int flags,
                                                       CUstream stream) {
  FAKECUDA_ENTER(cuMemPrefetchAsync_v2, stream);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return cu(drv().mem_prefetch_async(ptr, count, fakecuda::location(location), legacy(stream)));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemPrefetchAsync_v2_ptsz(CUdeviceptr ptr, size_t count,
                                                            CUmemLocation location,
                                                            unsigned int flags, CUstream stream) {
  FAKECUDA_ENTER(cuMemPrefetchAsync_v2_ptsz, stream);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return cu(drv().mem_prefetch_async(ptr, count, fakecuda::location(location), per_thread(stream)));
}

// ---- Copies and fills (synchronous; the _ptds variants differ only in their default stream) ----

FAKECUDA_EXPORT CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
  FAKECUDA_ENTER(cuMemcpyHtoD_v2);
  return cu(drv().memcpy_htod(dst, src, bytes));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src,
                                                      size_t bytes) {
  FAKECUDA_ENTER(cuMemcpyHtoD_v2_ptds);
  return cu(drv().memcpy_htod(dst, src, bytes));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
  FAKECUDA_ENTER(cuMemcpyDtoH_v2);
  return cu(drv().memcpy_dtoh(dst, src, bytes));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  FAKECUDA_ENTER(cuMemcpyDtoD_v2);
  return cu(drv().memcpy_dtod(dst, src, bytes));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void* dst, CUdeviceptr src, size_t bytes) {
  FAKECUDA_ENTER(cuMemcpyDtoH_v2_ptds);
  return cu(drv().memcpy_dtoh(dst, src, bytes));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
  FAKECUDA_ENTER(cuMemsetD8_v2);
  return cu(drv().memset_d8(dst, value, n));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, size_t n) {
  FAKECUDA_ENTER(cuMemsetD8_v2_ptds);
  return cu(drv().memset_d8(dst, value, n));
}

// ---- Native IPC ------------------------------------------------------------------------------

namespace {

CUresult ipc_open(CUdeviceptr* dptr, const CUipcMemHandle& handle, unsigned int flags) {
  static_assert(sizeof(CUipcMemHandle) == sizeof(allocshim::IpcHandle));
  allocshim::IpcHandle h;
  std::memcpy(h.bytes, &handle, sizeof(h.bytes));
  return cu(drv().ipc_open_mem_handle(dptr, h, flags));
}

}  // namespace

FAKECUDA_EXPORT CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  FAKECUDA_ENTER(cuIpcGetMemHandle);
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  allocshim::IpcHandle h;
  const CUresult r = cu(drv().ipc_get_mem_handle(&h, dptr));
  if (r == CUDA_SUCCESS) std::memcpy(handle, h.bytes, sizeof(h.bytes));
  return r;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr* dptr, CUipcMemHandle handle,
                                                    unsigned int flags) {
  FAKECUDA_ENTER(cuIpcOpenMemHandle);
  return ipc_open(dptr, handle, flags);
}

FAKECUDA_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* dptr, CUipcMemHandle handle,
                                                       unsigned int flags) {
  FAKECUDA_ENTER(cuIpcOpenMemHandle_v2);
  return ipc_open(dptr, handle, flags);
}

FAKECUDA_EXPORT CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  FAKECUDA_ENTER(cuIpcCloseMemHandle);
  return cu(drv().ipc_close_mem_handle(dptr));
}
