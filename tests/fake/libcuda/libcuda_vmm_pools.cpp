// Stream-ordered allocation, memory pools and virtual memory management.
#include <cstdint>

#include "symbols.h"

using namespace fakecuda;
using allocshim::DevPtr;

// ---- Stream-ordered allocation ------------------------------------------------------------------

FAKECUDA_STREAM_PAIR(cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytesize, CUstream stream),
                     drv().mem_alloc_async(dptr, bytesize, stream_))

FAKECUDA_STREAM_PAIR(cuMemAllocFromPoolAsync,
                     (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream stream),
                     drv().mem_alloc_from_pool_async(dptr, bytesize, pool, stream_))

FAKECUDA_STREAM_PAIR(cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream),
                     drv().mem_free_async(dptr, stream_))

// ---- Pools --------------------------------------------------------------------------------------

FAKECUDA_EXPORT CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  FAKECUDA_ENTER(cuMemPoolCreate);
  if (pool == nullptr || props == nullptr || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
    return CUDA_ERROR_INVALID_VALUE;
  allocshim::PoolSpec spec;
  spec.location = location(props->location);
  spec.posix_fd = (props->handleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  spec.max_size = props->maxSize;
  allocshim::Pool p = nullptr;
  const CUresult r = cu(drv().mem_pool_create(&p, spec));
  if (r == CUDA_SUCCESS) *pool = static_cast<CUmemoryPool>(p);
  return r;
}

FAKECUDA_FORWARD(cuMemPoolDestroy, (CUmemoryPool pool), drv().mem_pool_destroy(pool))

namespace {

bool reuse_attr(CUmemPool_attribute attr, allocshim::PoolReuse* which) {
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      *which = allocshim::PoolReuse::follow_event_dependencies;
      return true;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      *which = allocshim::PoolReuse::allow_opportunistic;
      return true;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      *which = allocshim::PoolReuse::allow_internal_dependencies;
      return true;
    default: return false;
  }
}

}  // namespace

FAKECUDA_EXPORT CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                                       void* value) {
  FAKECUDA_ENTER(cuMemPoolSetAttribute);
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  allocshim::PoolReuse which{};
  if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    return cu(drv().mem_pool_set_release_threshold(pool, *static_cast<cuuint64_t*>(value)));
  if (reuse_attr(attr, &which))
    return cu(drv().mem_pool_set_reuse(pool, which, *static_cast<int*>(value) != 0));
  // Resetting the high-water marks: the fake keeps none.
  if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH || attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH)
    return CUDA_SUCCESS;
  return CUDA_ERROR_INVALID_VALUE;
}

// The high-water marks read as the current values (the fake does not track peaks).
FAKECUDA_EXPORT CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                                       void* value) {
  FAKECUDA_ENTER(cuMemPoolGetAttribute);
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::uint64_t reserved = 0;
  const CUresult r = cu(drv().mem_pool_reserved(pool, &reserved));  // validates the pool too
  if (r != CUDA_SUCCESS) return r;
  allocshim::PoolReuse which{};
  switch (attr) {
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *static_cast<cuuint64_t*>(value) = reserved; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      *static_cast<cuuint64_t*>(value) = fake().pool_used(pool);
      break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      *static_cast<cuuint64_t*>(value) = fake().pool_release_threshold(pool);
      break;
    default:
      if (!reuse_attr(attr, &which)) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<int*>(value) = fake().pool_reuse(pool, which) ? 1 : 0;
      break;
  }
  return CUDA_SUCCESS;
}

FAKECUDA_FORWARD(cuMemPoolTrimTo, (CUmemoryPool pool, size_t keep),
                 drv().mem_pool_trim_to(pool, keep))

// Pools have no read-only access: PROT_READ is refused, as the driver documents.
FAKECUDA_EXPORT CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map,
                                                    size_t count) {
  FAKECUDA_ENTER(cuMemPoolSetAccess);
  if (map == nullptr && count > 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        map[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ)
      return CUDA_ERROR_INVALID_VALUE;
    const bool rw = map[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (CUresult r = cu(drv().mem_pool_set_access(pool, map[i].location.id, rw))) return r;
  }
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemPoolExportToShareableHandle(void* handle, CUmemoryPool pool,
                                                                  CUmemAllocationHandleType type,
                                                                  unsigned long long flags) {
  FAKECUDA_ENTER(cuMemPoolExportToShareableHandle);
  if (handle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  return cu(drv().mem_pool_export_to_fd(static_cast<int*>(handle), pool));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemPoolImportFromShareableHandle(CUmemoryPool* pool,
                                                                    void* handle,
                                                                    CUmemAllocationHandleType type,
                                                                    unsigned long long flags) {
  FAKECUDA_ENTER(cuMemPoolImportFromShareableHandle);
  if (pool == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  allocshim::Pool p = nullptr;
  const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(handle));
  const CUresult r = cu(drv().mem_pool_import_from_fd(&p, fd));
  if (r == CUDA_SUCCESS) *pool = static_cast<CUmemoryPool>(p);
  return r;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemPoolExportPointer(CUmemPoolPtrExportData* out,
                                                        CUdeviceptr ptr) {
  FAKECUDA_ENTER(cuMemPoolExportPointer);
  static_assert(sizeof(CUmemPoolPtrExportData) == allocshim::kIpcHandleBytes);
  return cu(drv().mem_pool_export_pointer(reinterpret_cast<unsigned char*>(out), ptr));
}

FAKECUDA_FORWARD(cuMemPoolImportPointer,
                 (CUdeviceptr * ptr, CUmemoryPool pool, CUmemPoolPtrExportData* data),
                 drv().mem_pool_import_pointer(ptr, pool, reinterpret_cast<unsigned char*>(data)))

FAKECUDA_EXPORT CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
  FAKECUDA_ENTER(cuDeviceGetDefaultMemPool);
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  allocshim::Pool p = fake().default_pool(dev);
  if (p == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *pool = static_cast<CUmemoryPool>(p);
  return CUDA_SUCCESS;
}

// ---- Virtual memory management --------------------------------------------------------------

namespace {

bool phys_spec(const CUmemAllocationProp* prop, allocshim::PhysSpec* spec) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return false;
  // As driver 580 on the H100 (tools/bench/pin_bench.cu --probe): GPUDirect RDMA and compression
  // are properties of device memory; asked at a host location, cuMemCreate is an invalid value.
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE &&
      (prop->allocFlags.gpuDirectRDMACapable != 0 || prop->allocFlags.compressionType != 0))
    return false;
  spec->location = location(prop->location);
  spec->posix_fd = (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  return true;
}

}  // namespace

FAKECUDA_EXPORT CUresult CUDAAPI cuMemGetAllocationGranularity(
    size_t* granularity, const CUmemAllocationProp* prop, CUmemAllocationGranularity_flags option) {
  FAKECUDA_ENTER(cuMemGetAllocationGranularity);
  (void)option;  // minimum = recommended on the fake, as measured on an H100
  allocshim::PhysSpec spec;
  if (!phys_spec(prop, &spec)) return CUDA_ERROR_INVALID_VALUE;
  return cu(drv().mem_get_granularity(granularity, spec));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                             const CUmemAllocationProp* prop,
                                             unsigned long long flags) {
  FAKECUDA_ENTER(cuMemCreate);
  allocshim::PhysSpec spec;
  if (flags != 0 || !phys_spec(prop, &spec)) return CUDA_ERROR_INVALID_VALUE;
  return cu(drv().mem_create(handle, size, spec));
}

FAKECUDA_FORWARD(cuMemRelease, (CUmemGenericAllocationHandle handle), drv().mem_release(handle))

FAKECUDA_EXPORT CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size,
                                                     size_t alignment, CUdeviceptr addr,
                                                     unsigned long long flags) {
  FAKECUDA_ENTER(cuMemAddressReserve);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return cu(drv().mem_address_reserve(ptr, size, alignment, addr));
}

FAKECUDA_FORWARD(cuMemAddressFree, (CUdeviceptr ptr, size_t size),
                 drv().mem_address_free(ptr, size))

FAKECUDA_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                          CUmemGenericAllocationHandle handle,
                                          unsigned long long flags) {
  FAKECUDA_ENTER(cuMemMap);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return cu(drv().mem_map(ptr, size, offset, handle));
}

FAKECUDA_FORWARD(cuMemUnmap, (CUdeviceptr ptr, size_t size), drv().mem_unmap(ptr, size))

FAKECUDA_EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size,
                                                const CUmemAccessDesc* desc, size_t count) {
  FAKECUDA_ENTER(cuMemSetAccess);
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    const bool write = desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    const bool read = write || desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ;
    const CUresult r =
        cu(allocshim::fake::set_access_flags(ptr, size, desc[i].location.id, read, write));
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemExportToShareableHandle(void* shareable,
                                                              CUmemGenericAllocationHandle handle,
                                                              CUmemAllocationHandleType type,
                                                              unsigned long long flags) {
  FAKECUDA_ENTER(cuMemExportToShareableHandle);
  if (shareable == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  return cu(drv().mem_export_to_fd(static_cast<int*>(shareable), handle));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemImportFromShareableHandle(
    CUmemGenericAllocationHandle* handle, void* os_handle, CUmemAllocationHandleType type) {
  FAKECUDA_ENTER(cuMemImportFromShareableHandle);
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(os_handle));
  return cu(drv().mem_import_from_fd(handle, fd));
}

FAKECUDA_FORWARD(cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle * handle, void* addr),
                 drv().mem_retain_allocation_handle(handle, reinterpret_cast<DevPtr>(addr)))
