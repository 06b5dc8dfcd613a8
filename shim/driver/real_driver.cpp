// Adapters from the core's driver table to libcuda. Each entry point is looked up by its exact
// versioned name (cuMemAlloc_v2, cuMemAdvise_v2, ...) so the ABI is the one this file was compiled
// against, whatever a resolver would pick by version number.
#include "driver/real_driver.h"

#include <cuda.h>
#include <dlfcn.h>

#include <cstring>
#include <mutex>

namespace allocshim {
namespace {

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
Real g_real;
Driver g_table;
void* g_handle = nullptr;

Result call_missing() { return res::not_supported; }
#define CALL(name, ...) \
  (g_real.name ? static_cast<Result>(g_real.name(__VA_ARGS__)) : call_missing())

CUmemLocation to_cu(const Location& l) {
  CUmemLocation out{};
  switch (l.type) {
    case Location::Type::device: out.type = CU_MEM_LOCATION_TYPE_DEVICE; break;
    case Location::Type::host: out.type = CU_MEM_LOCATION_TYPE_HOST; break;
    case Location::Type::host_numa: out.type = CU_MEM_LOCATION_TYPE_HOST_NUMA; break;
  }
  out.id = l.id;
  return out;
}

CUmemAllocationProp to_cu(const PhysSpec& s) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location = to_cu(s.location);
  p.requestedHandleTypes =
      s.posix_fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return p;
}

CUdevice_attribute to_cu(DevAttr a) {
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

CUstream cu(Stream s) { return static_cast<CUstream>(s); }
CUevent cu_event(Event e) { return static_cast<CUevent>(e); }
CUmemoryPool cu_pool(Pool p) { return static_cast<CUmemoryPool>(p); }

// Devices, contexts and the driver itself.
void fill_devices(Driver& t) {
  t.init = [](unsigned f) { return CALL(cuInit, f); };
  t.driver_get_version = [](int* v) { return CALL(cuDriverGetVersion, v); };
  t.device_get_count = [](int* n) { return CALL(cuDeviceGetCount, n); };
  t.device_get_attribute = [](int* v, DevAttr a, int d) {
    return CALL(cuDeviceGetAttribute, v, to_cu(a), d);
  };
  t.device_get_name = [](char* n, int len, int d) { return CALL(cuDeviceGetName, n, len, d); };
  t.device_total_mem = [](std::size_t* b, int d) { return CALL(cuDeviceTotalMem_v2, b, d); };
  t.device_get_uuid = [](unsigned char u[16], int d) {
    CUuuid id{};
    const Result r = CALL(cuDeviceGetUuid_v2, &id, d);
    if (r == res::ok) std::memcpy(u, id.bytes, sizeof id.bytes);
    return r;
  };
  t.ctx_get_device = [](int* d) {
    CUdevice dev = 0;
    const Result r = CALL(cuCtxGetDevice, &dev);
    *d = dev;
    return r;
  };
  t.ctx_get_current = [](Context* c) {
    CUcontext ctx = nullptr;
    const Result r = CALL(cuCtxGetCurrent, &ctx);
    *c = ctx;
    return r;
  };
  t.ctx_set_current = [](Context c) { return CALL(cuCtxSetCurrent, static_cast<CUcontext>(c)); };
  t.ctx_synchronize = [] { return CALL(cuCtxSynchronize); };
  t.primary_ctx_retain = [](Context* c, int d) {
    CUcontext ctx = nullptr;
    const Result r = CALL(cuDevicePrimaryCtxRetain, &ctx, d);
    *c = ctx;
    return r;
  };
  t.primary_ctx_release = [](int d) { return CALL(cuDevicePrimaryCtxRelease_v2, d); };
  t.primary_ctx_active = [](int d, int* active) {
    unsigned flags = 0;
    return CALL(cuDevicePrimaryCtxGetState, d, &flags, active);
  };
  t.ctx_get_id = [](Context c, std::uint64_t* id) {
    unsigned long long v = 0;
    const Result r = CALL(cuCtxGetId, static_cast<CUcontext>(c), &v);
    *id = v;
    return r;
  };
  t.ctx_enable_peer_access = [](Context p, unsigned f) {
    return CALL(cuCtxEnablePeerAccess, static_cast<CUcontext>(p), f);
  };
}

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

void fill_streams_events(Driver& t) {
  t.stream_create = [](Stream* s, unsigned f) {
    CUstream st = nullptr;
    const Result r = CALL(cuStreamCreate, &st, f);
    *s = st;
    return r;
  };
  t.stream_create_with_priority = [](Stream* s, unsigned f, int prio) {
    CUstream st = nullptr;
    const Result r = CALL(cuStreamCreateWithPriority, &st, f, prio);
    *s = st;
    return r;
  };
  t.stream_destroy = [](Stream s) { return CALL(cuStreamDestroy_v2, cu(s)); };
  t.stream_synchronize = [](Stream s) { return CALL(cuStreamSynchronize, cu(s)); };
  t.stream_query = [](Stream s) { return CALL(cuStreamQuery, cu(s)); };
  if (g_real.cuStreamIsCapturing)
    t.stream_is_capturing = [](Stream s, bool* capturing) {
      CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
      const Result r = CALL(cuStreamIsCapturing, cu(s), &status);
      *capturing = status != CU_STREAM_CAPTURE_STATUS_NONE;
      return r;
    };
  if (g_real.cuThreadExchangeStreamCaptureMode)
    t.thread_relax_capture = [] {
      CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
      return CALL(cuThreadExchangeStreamCaptureMode, &mode);
    };
  t.stream_wait_event = [](Stream s, Event e, unsigned f) {
    return CALL(cuStreamWaitEvent, cu(s), cu_event(e), f);
  };
  t.event_create = [](Event* e, unsigned f) {
    CUevent ev = nullptr;
    const Result r = CALL(cuEventCreate, &ev, f);
    *e = ev;
    return r;
  };
  t.event_record = [](Event e, Stream s) { return CALL(cuEventRecord, cu_event(e), cu(s)); };
  t.event_query = [](Event e) { return CALL(cuEventQuery, cu_event(e)); };
  t.event_synchronize = [](Event e) { return CALL(cuEventSynchronize, cu_event(e)); };
  t.event_destroy = [](Event e) { return CALL(cuEventDestroy_v2, cu_event(e)); };
  t.event_elapsed_time = [](float* ms, Event a, Event b) {
    return CALL(cuEventElapsedTime, ms, cu_event(a), cu_event(b));
  };
}

// Legacy IPC handles, and the copies and memsets the shim itself issues.
void fill_ipc_copies(Driver& t) {
  t.ipc_get_mem_handle = [](IpcHandle* h, DevPtr p) {
    static_assert(sizeof(CUipcMemHandle) == sizeof(IpcHandle));
    CUipcMemHandle handle{};
    const Result r = CALL(cuIpcGetMemHandle, &handle, p);
    std::memcpy(h, &handle, sizeof handle);
    return r;
  };
  t.ipc_open_mem_handle = [](DevPtr* p, const IpcHandle& h, unsigned f) {
    CUipcMemHandle handle;
    std::memcpy(&handle, &h, sizeof handle);
    return CALL(cuIpcOpenMemHandle_v2, p, handle, f);
  };
  t.ipc_close_mem_handle = [](DevPtr p) { return CALL(cuIpcCloseMemHandle, p); };
  t.memcpy_htod = [](DevPtr dst, const void* src, std::size_t b) {
    return CALL(cuMemcpyHtoD_v2, dst, src, b);
  };
  t.memcpy_dtoh = [](void* dst, DevPtr src, std::size_t b) {
    return CALL(cuMemcpyDtoH_v2, dst, src, b);
  };
  t.memset_d8 = [](DevPtr dst, unsigned char v, std::size_t n) {
    return CALL(cuMemsetD8_v2, dst, v, n);
  };
  t.memcpy_dtod = [](DevPtr dst, DevPtr src, std::size_t b) {
    return CALL(cuMemcpyDtoD_v2, dst, src, b);
  };
}

// Parameter layouts (CUDA 12.4+): absent from older drivers, where launches mark nothing.
void fill_param_info(Driver& t) {
  if (g_real.cuFuncGetParamInfo)
    t.func_get_param_info = [](void* f, std::size_t i, std::size_t* off, std::size_t* size) {
      return CALL(cuFuncGetParamInfo, static_cast<CUfunction>(f), i, off, size);
    };
  if (g_real.cuKernelGetParamInfo)
    t.kernel_get_param_info = [](void* k, std::size_t i, std::size_t* off, std::size_t* size) {
      return CALL(cuKernelGetParamInfo, static_cast<CUkernel>(k), i, off, size);
    };
}

void fill_table() {
  Driver& t = g_table;
  fill_devices(t);
  fill_memory(t);
  fill_pools(t);
  fill_pool_sharing(t);
  fill_vmm(t);
  fill_streams_events(t);
  fill_ipc_copies(t);
  fill_param_info(t);
}

}  // namespace

const Driver* load_real_driver(SymbolLookup lookup, bool may_load, std::string& error) {
  static std::once_flag once;
  static std::string load_error;
  std::call_once(once, [&] {
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!handle && may_load) handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
      const char* why = dlerror();
      load_error = std::string("libcuda.so.1 could not be loaded: ") + (why ? why : "not found");
      return;
    }
#define X(name) g_real.name = reinterpret_cast<decltype(&::name)>(lookup(handle, #name));
    ALLOCSHIM_REAL_LIST(X)
#undef X
    if (!g_real.cuMemAlloc_v2 || !g_real.cuMemFree_v2 || !g_real.cuCtxGetDevice) {
      load_error = "libcuda.so.1 lacks cuMemAlloc_v2/cuMemFree_v2/cuCtxGetDevice";
      return;
    }
    fill_table();
    g_handle = handle;
  });
  if (!g_handle) {
    error = load_error;
    return nullptr;
  }
  return &g_table;
}

void* real_driver_handle() { return g_handle; }

}  // namespace allocshim
