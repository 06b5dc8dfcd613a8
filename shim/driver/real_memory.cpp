// The real driver table's memory entries: allocations of every kind, pools (shared ones too) and
// virtual memory management, each an adapter from the core's types to libcuda's.
#include <cstring>

#include "driver/real_calls.h"

namespace allocshim::libcuda {

// Device, managed and host allocations (stream-ordered ones too), pointer queries, advice and
// prefetching.
void fill_memory(Driver& t) {
  t.mem_get_info = [](std::size_t* f, std::size_t* tot) { return CALL(cuMemGetInfo_v2, f, tot); };
  t.mem_alloc = [](DevPtr* p, std::size_t b) { return CALL(cuMemAlloc_v2, p, b); };
  t.mem_alloc_pitch = [](DevPtr* p, std::size_t* pitch, std::size_t w, std::size_t h, unsigned e) {
    return CALL(cuMemAllocPitch_v2, p, pitch, w, h, e);
  };
  t.mem_free = [](DevPtr p) { return CALL(cuMemFree_v2, p); };
  t.mem_alloc_managed = [](DevPtr* p, std::size_t b, unsigned f) {
    return CALL(cuMemAllocManaged, p, b, f);
  };
  t.mem_host_alloc = [](void** p, std::size_t b, unsigned f) {
    return CALL(cuMemHostAlloc, p, b, f);
  };
  t.mem_alloc_host = [](void** p, std::size_t b) { return CALL(cuMemAllocHost_v2, p, b); };
  t.mem_free_host = [](void* p) { return CALL(cuMemFreeHost, p); };
  t.mem_get_address_range = [](DevPtr* base, std::size_t* size, DevPtr p) {
    return CALL(cuMemGetAddressRange_v2, base, size, p);
  };
  t.pointer_get_attribute = [](void* data, int attr, DevPtr p) {
    return CALL(cuPointerGetAttribute, data, static_cast<CUpointer_attribute>(attr), p);
  };
  t.pointer_get_attributes = [](unsigned n, int* attrs, void** data, DevPtr p) {
    return CALL(cuPointerGetAttributes, n, reinterpret_cast<CUpointer_attribute*>(attrs), data, p);
  };
  t.mem_advise = [](DevPtr p, std::size_t b, Advice a, Location l) {
    return CALL(cuMemAdvise_v2, p, b, static_cast<CUmem_advise>(a), to_cu(l));
  };
  t.mem_prefetch_async = [](DevPtr p, std::size_t b, Location l, Stream s) {
    return CALL(cuMemPrefetchAsync_v2, p, b, to_cu(l), 0u, cu(s));
  };
  t.mem_alloc_async = [](DevPtr* p, std::size_t b, Stream s) {
    return CALL(cuMemAllocAsync, p, b, cu(s));
  };
  t.mem_alloc_from_pool_async = [](DevPtr* p, std::size_t b, Pool pool, Stream s) {
    return CALL(cuMemAllocFromPoolAsync, p, b, cu_pool(pool), cu(s));
  };
  t.mem_free_async = [](DevPtr p, Stream s) { return CALL(cuMemFreeAsync, p, cu(s)); };
}

void fill_pools(Driver& t) {
  t.mem_pool_create = [](Pool* pool, const PoolSpec& spec) {
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes =
        spec.posix_fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    props.location = to_cu(spec.location);
    props.maxSize = spec.max_size;
    CUmemoryPool p = nullptr;
    const Result r = CALL(cuMemPoolCreate, &p, &props);
    *pool = p;
    return r;
  };
  t.mem_pool_destroy = [](Pool p) { return CALL(cuMemPoolDestroy, cu_pool(p)); };
  t.mem_pool_set_release_threshold = [](Pool p, std::uint64_t bytes) {
    cuuint64_t v = bytes;
    return CALL(cuMemPoolSetAttribute, cu_pool(p), CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v);
  };
  t.mem_pool_trim_to = [](Pool p, std::size_t keep) {
    return CALL(cuMemPoolTrimTo, cu_pool(p), keep);
  };
  t.mem_pool_set_access = [](Pool p, int device, bool rw) {
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = device;
    desc.flags = rw ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    return CALL(cuMemPoolSetAccess, cu_pool(p), &desc, 1);
  };
  t.mem_pool_reserved = [](Pool p, std::uint64_t* bytes) {
    cuuint64_t v = 0;
    const Result r =
        CALL(cuMemPoolGetAttribute, cu_pool(p), CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v);
    *bytes = v;
    return r;
  };
  t.mem_pool_used = [](Pool p, std::uint64_t* bytes) {
    cuuint64_t v = 0;
    const Result r = CALL(cuMemPoolGetAttribute, cu_pool(p), CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v);
    *bytes = v;
    return r;
  };
  t.mem_pool_set_reuse = [](Pool p, PoolReuse which, bool enabled) {
    CUmemPool_attribute attr = CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES;
    switch (which) {
      case PoolReuse::follow_event_dependencies:
        attr = CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES;
        break;
      case PoolReuse::allow_opportunistic: attr = CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC; break;
      case PoolReuse::allow_internal_dependencies:
        attr = CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
        break;
    }
    int value = enabled ? 1 : 0;
    return CALL(cuMemPoolSetAttribute, cu_pool(p), attr, &value);
  };
}

// Pools and their allocations shared with other processes.
void fill_pool_sharing(Driver& t) {
  t.mem_pool_export_to_fd = [](int* fd, Pool p) {
    return CALL(cuMemPoolExportToShareableHandle, fd, cu_pool(p),
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0ull);
  };
  t.mem_pool_import_from_fd = [](Pool* p, int fd) {
    CUmemoryPool pool = nullptr;
    const Result r = CALL(cuMemPoolImportFromShareableHandle, &pool,
                          reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0ull);
    *p = pool;
    return r;
  };
  t.mem_pool_export_pointer = [](unsigned char out[kIpcHandleBytes], DevPtr p) {
    static_assert(sizeof(CUmemPoolPtrExportData) == kIpcHandleBytes);
    CUmemPoolPtrExportData data{};
    const Result r = CALL(cuMemPoolExportPointer, &data, p);
    std::memcpy(out, &data, kIpcHandleBytes);
    return r;
  };
  t.mem_pool_import_pointer = [](DevPtr* p, Pool pool, const unsigned char in[kIpcHandleBytes]) {
    CUmemPoolPtrExportData data;
    std::memcpy(&data, in, kIpcHandleBytes);
    return CALL(cuMemPoolImportPointer, p, cu_pool(pool), &data);
  };
}

// Virtual memory management: physical memory, address ranges, mappings, access, export.
void fill_vmm(Driver& t) {
  t.mem_get_granularity = [](std::size_t* bytes, const PhysSpec& spec) {
    const CUmemAllocationProp p = to_cu(spec);
    return CALL(cuMemGetAllocationGranularity, bytes, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  };
  t.mem_create = [](MemHandle* h, std::size_t bytes, const PhysSpec& spec) {
    const CUmemAllocationProp p = to_cu(spec);
    CUmemGenericAllocationHandle handle = 0;
    const Result r = CALL(cuMemCreate, &handle, bytes, &p, 0ull);
    *h = handle;
    return r;
  };
  t.mem_release = [](MemHandle h) { return CALL(cuMemRelease, h); };
  t.mem_address_reserve = [](DevPtr* p, std::size_t b, std::size_t align, DevPtr hint) {
    return CALL(cuMemAddressReserve, p, b, align, hint, 0ull);
  };
  t.mem_address_free = [](DevPtr p, std::size_t b) { return CALL(cuMemAddressFree, p, b); };
  t.mem_map = [](DevPtr p, std::size_t b, std::size_t off, MemHandle h) {
    return CALL(cuMemMap, p, b, off, h, 0ull);
  };
  t.mem_unmap = [](DevPtr p, std::size_t b) { return CALL(cuMemUnmap, p, b); };
  t.mem_set_access = [](DevPtr p, std::size_t b, int device, bool rw) {
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = device;
    desc.flags = rw ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    return CALL(cuMemSetAccess, p, b, &desc, 1);
  };
  t.mem_export_to_fd = [](int* fd, MemHandle h) {
    return CALL(cuMemExportToShareableHandle, fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0ull);
  };
  t.mem_import_from_fd = [](MemHandle* h, int fd) {
    CUmemGenericAllocationHandle handle = 0;
    const Result r = CALL(cuMemImportFromShareableHandle, &handle,
                          reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    *h = handle;
    return r;
  };
  t.mem_retain_allocation_handle = [](MemHandle* h, DevPtr p) {
    CUmemGenericAllocationHandle handle = 0;
    const Result r = CALL(cuMemRetainAllocationHandle, &handle, reinterpret_cast<void*>(p));
    *h = handle;
    return r;
  };
}

}  // namespace allocshim::libcuda
