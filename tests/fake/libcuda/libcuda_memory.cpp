// Classic allocations, managed and pinned host memory, pointer queries, copies and native IPC.
#include <cstring>

#include "symbols.h"

using namespace fakecuda;
using allocshim::DevPtr;

FAKECUDA_V1_UNSUPPORTED(cuMemGetInfo, (unsigned int*, unsigned int*))

FAKECUDA_FORWARD(cuMemGetInfo_v2, (size_t * free, size_t* total), drv().mem_get_info(free, total))

FAKECUDA_V1_UNSUPPORTED(cuMemAlloc, (CUdeviceptr_v1*, unsigned int))

FAKECUDA_FORWARD(cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytesize),
                 drv().mem_alloc(dptr, bytesize))

FAKECUDA_V1_UNSUPPORTED(cuMemAllocPitch,
                        (CUdeviceptr_v1*, unsigned int*, unsigned int, unsigned int, unsigned int))

FAKECUDA_FORWARD(cuMemAllocPitch_v2,
                 (CUdeviceptr * dptr, size_t* pitch, size_t width, size_t height,
                  unsigned int element),
                 drv().mem_alloc_pitch(dptr, pitch, width, height, element))

FAKECUDA_V1_UNSUPPORTED(cuMemFree, (CUdeviceptr_v1))

FAKECUDA_FORWARD(cuMemFree_v2, (CUdeviceptr dptr), drv().mem_free(dptr))

FAKECUDA_FORWARD(cuMemAllocManaged, (CUdeviceptr * dptr, size_t bytesize, unsigned int flags),
                 drv().mem_alloc_managed(dptr, bytesize, flags))

FAKECUDA_FORWARD(cuMemHostAlloc, (void** pp, size_t bytesize, unsigned int flags),
                 drv().mem_host_alloc(pp, bytesize, flags))

FAKECUDA_V1_UNSUPPORTED(cuMemAllocHost, (void**, unsigned int))

FAKECUDA_FORWARD(cuMemAllocHost_v2, (void** pp, size_t bytesize),
                 drv().mem_alloc_host(pp, bytesize))

FAKECUDA_FORWARD(cuMemFreeHost, (void* p), drv().mem_free_host(p))

FAKECUDA_V1_UNSUPPORTED(cuMemGetAddressRange, (CUdeviceptr_v1*, unsigned int*, CUdeviceptr_v1))

FAKECUDA_FORWARD(cuMemGetAddressRange_v2, (CUdeviceptr * base, size_t* size, CUdeviceptr dptr),
                 drv().mem_get_address_range(base, size, dptr))

FAKECUDA_FORWARD(cuPointerGetAttribute,
                 (void* data, CUpointer_attribute attribute, CUdeviceptr ptr),
                 drv().pointer_get_attribute(data, attribute, ptr))

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

FAKECUDA_STREAM_PAIR(cuMemPrefetchAsync,
                     (CUdeviceptr ptr, size_t count, CUdevice device, CUstream stream),
                     drv().mem_prefetch_async(ptr, count, device_location(device), stream_))

FAKECUDA_STREAM_PAIR(cuMemPrefetchAsync_v2,
                     (CUdeviceptr ptr, size_t count, CUmemLocation location, unsigned int flags,
                      CUstream stream),
                     flags != 0 ? allocshim::res::invalid_value
                                : drv().mem_prefetch_async(ptr, count, fakecuda::location(location),
                                                           stream_))

// ---- Copies and fills (synchronous; the _ptds variants differ only in their default stream) ----

FAKECUDA_FORWARD_TWINS(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds,
                       (CUdeviceptr dst, const void* src, size_t bytes),
                       drv().memcpy_htod(dst, src, bytes))

FAKECUDA_FORWARD_TWINS(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds,
                       (void* dst, CUdeviceptr src, size_t bytes),
                       drv().memcpy_dtoh(dst, src, bytes))

FAKECUDA_FORWARD(cuMemcpyDtoD_v2, (CUdeviceptr dst, CUdeviceptr src, size_t bytes),
                 drv().memcpy_dtod(dst, src, bytes))

FAKECUDA_FORWARD_TWINS(cuMemsetD8_v2, cuMemsetD8_v2_ptds,
                       (CUdeviceptr dst, unsigned char value, size_t n),
                       drv().memset_d8(dst, value, n))

// ---- Kernels ---------------------------------------------------------------------------------
// A fake kernel is a host function `void kernel(void** params)`: a launch runs it on the calling
// thread before returning, over the "device" memory (host memory in the fake), so a program can
// check what its kernels read while other threads allocate. Its parameter layout is what the
// program registered with fakecuda_set_param_layout.

namespace {
CUresult launch(CUfunction f, void** params, void** extra) {
  if (f == nullptr || (params == nullptr && extra != nullptr)) return CUDA_ERROR_INVALID_VALUE;
  reinterpret_cast<void (*)(void**)>(reinterpret_cast<void*>(f))(params);
  return CUDA_SUCCESS;
}
}  // namespace

#define FAKECUDA_LAUNCH_PARAMS                                                         \
  (CUfunction f, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, \
   unsigned int, unsigned int, CUstream stream, void** params, void** extra)
FAKECUDA_FORWARD(cuLaunchKernel, FAKECUDA_LAUNCH_PARAMS,
                 static_cast<allocshim::Result>(launch(f, params, extra)), stream)
FAKECUDA_FORWARD(cuLaunchKernel_ptsz, FAKECUDA_LAUNCH_PARAMS,
                 static_cast<allocshim::Result>(launch(f, params, extra)), stream)
#undef FAKECUDA_LAUNCH_PARAMS
FAKECUDA_FORWARD(cuFuncGetParamInfo, (CUfunction f, size_t i, size_t* offset, size_t* size),
                 drv().func_get_param_info(reinterpret_cast<void*>(f), i, offset, size))
FAKECUDA_FORWARD(cuKernelGetParamInfo, (CUkernel k, size_t i, size_t* offset, size_t* size),
                 drv().kernel_get_param_info(reinterpret_cast<void*>(k), i, offset, size))
FAKECUDA_FORWARD(cuModuleUnload, (CUmodule), allocshim::res::ok)
FAKECUDA_FORWARD(cuLibraryUnload, (CUlibrary), allocshim::res::ok)

FAKECUDA_EXPORT void fakecuda_set_param_layout(void* function, const size_t* offsets,
                                               const size_t* sizes, int n) {
  std::vector<std::pair<std::size_t, std::size_t>> params;
  for (int i = 0; i < n; ++i) params.emplace_back(offsets[i], sizes[i]);
  fake().set_param_layout(function, std::move(params));
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

FAKECUDA_FORWARD(cuIpcCloseMemHandle, (CUdeviceptr dptr), drv().ipc_close_mem_handle(dptr))
