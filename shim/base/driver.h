// The driver table: every call the shim makes into the CUDA driver goes through one of these
// pointers. In the preloaded library they point at libcuda's real entry points (shim/driver/
// real_driver.cpp); in tests and `replay --simulate`, at simulated devices (tests/fake, tools/sim).
// Nothing in shim/core or shim/backends may call the driver any other way.
//
// Signatures follow the driver API with the core's own types; where the driver takes a struct the
// core only needs a few fields of, the table takes those fields (PhysSpec, PoolSpec) and the real
// implementation builds the struct. Every entry returns the driver's CUresult unchanged.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/types.h"

namespace allocshim {

// Device attributes the shim asks about, by meaning rather than CU_DEVICE_ATTRIBUTE_* number.
enum class DevAttr : std::uint8_t {
  vmm_supported,              // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  pools_supported,            // MEMORY_POOLS_SUPPORTED
  posix_fd_supported,         // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
  concurrent_managed_access,  // CONCURRENT_MANAGED_ACCESS
  host_numa_id,               // HOST_NUMA_ID
  host_numa_vmm,              // HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  host_numa_pools,            // HOST_NUMA_MEMORY_POOLS_SUPPORTED
  unified_addressing,         // UNIFIED_ADDRESSING
};

// Physical allocation for cuMemCreate.
struct PhysSpec {
  Location location;
  bool posix_fd = false;  // exportable as a POSIX file descriptor (for IPC)
};

// A memory pool for cuMemPoolCreate.
struct PoolSpec {
  Location location;
  bool posix_fd = false;
  std::size_t max_size = 0;  // 0: no limit
};

// A memory pool's reuse policies (CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
// _ALLOW_OPPORTUNISTIC, _ALLOW_INTERNAL_DEPENDENCIES).
enum class PoolReuse : std::uint8_t {
  follow_event_dependencies,
  allow_opportunistic,
  allow_internal_dependencies,
};

// Managed-memory advice (CUmem_advise values 1..6, set/unset pairs).
enum class Advice : std::uint8_t {
  set_read_mostly = 1,
  unset_read_mostly = 2,
  set_preferred_location = 3,
  unset_preferred_location = 4,
  set_accessed_by = 5,
  unset_accessed_by = 6,
};

struct Driver {
  // Devices and contexts.
  Result (*init)(unsigned flags);
  Result (*driver_get_version)(int* version);
  Result (*device_get_count)(int* count);
  Result (*device_get_attribute)(int* value, DevAttr attr, int device);
  Result (*device_get_name)(char* name, int len, int device);
  Result (*device_total_mem)(std::size_t* bytes, int device);
  Result (*device_get_uuid)(unsigned char uuid[16], int device);  // the same GPU in every process
  Result (*ctx_get_device)(int* device);  // device of the calling thread's current context
  Result (*ctx_get_current)(Context* ctx);
  Result (*ctx_set_current)(Context ctx);
  Result (*ctx_synchronize)();
  Result (*primary_ctx_retain)(Context* ctx, int device);
  Result (*primary_ctx_release)(int device);
  Result (*primary_ctx_active)(int device, int* active);  // cuDevicePrimaryCtxGetState's `active`
  // cuCtxGetId (CUDA 12.0+): unique per context made in the process. A primary context that was
  // reset keeps its handle but gets a new id when it is made again.
  Result (*ctx_get_id)(Context ctx, std::uint64_t* id);
  Result (*ctx_enable_peer_access)(Context peer, unsigned flags);
  Result (*mem_get_info)(std::size_t* free, std::size_t* total);  // of the current context's device

  // Classic allocations.
  Result (*mem_alloc)(DevPtr* ptr, std::size_t bytes);
  Result (*mem_alloc_pitch)(DevPtr* ptr, std::size_t* pitch, std::size_t width, std::size_t height,
                            unsigned element_bytes);
  Result (*mem_free)(DevPtr ptr);
  Result (*mem_alloc_managed)(DevPtr* ptr, std::size_t bytes, unsigned flags);
  Result (*mem_host_alloc)(void** ptr, std::size_t bytes, unsigned flags);
  Result (*mem_alloc_host)(void** ptr, std::size_t bytes);
  Result (*mem_free_host)(void* ptr);
  Result (*mem_get_address_range)(DevPtr* base, std::size_t* size, DevPtr ptr);
  // `attribute` is a CUpointer_attribute value; `data` points at the caller's storage for it.
  Result (*pointer_get_attribute)(void* data, int attribute, DevPtr ptr);
  Result (*pointer_get_attributes)(unsigned count, int* attributes, void** data, DevPtr ptr);
  Result (*mem_advise)(DevPtr ptr, std::size_t bytes, Advice advice, Location location);
  Result (*mem_prefetch_async)(DevPtr ptr, std::size_t bytes, Location location, Stream stream);

  // Stream-ordered allocation and pools.
  Result (*mem_alloc_async)(DevPtr* ptr, std::size_t bytes, Stream stream);
  Result (*mem_alloc_from_pool_async)(DevPtr* ptr, std::size_t bytes, Pool pool, Stream stream);
  Result (*mem_free_async)(DevPtr ptr, Stream stream);
  Result (*mem_pool_create)(Pool* pool, const PoolSpec& spec);
  Result (*mem_pool_destroy)(Pool pool);
  Result (*mem_pool_set_release_threshold)(Pool pool, std::uint64_t bytes);
  Result (*mem_pool_trim_to)(Pool pool, std::size_t keep_bytes);
  Result (*mem_pool_set_access)(Pool pool, int device, bool read_write);
  Result (*mem_pool_reserved)(Pool pool, std::uint64_t* bytes);  // RESERVED_MEM_CURRENT
  Result (*mem_pool_used)(Pool pool, std::uint64_t* bytes);      // USED_MEM_CURRENT
  // One of the CU_MEMPOOL_ATTR_REUSE_* flags (the async-pool backend turns internal dependencies
  // off: they would let a block come back ordered behind another stream's work).
  Result (*mem_pool_set_reuse)(Pool pool, PoolReuse which, bool enabled);
  Result (*mem_pool_export_to_fd)(int* fd, Pool pool);
  Result (*mem_pool_import_from_fd)(Pool* pool, int fd);
  Result (*mem_pool_export_pointer)(unsigned char out[kIpcHandleBytes], DevPtr ptr);
  Result (*mem_pool_import_pointer)(DevPtr* ptr, Pool pool,
                                    const unsigned char data[kIpcHandleBytes]);

  // Virtual memory management.
  Result (*mem_get_granularity)(std::size_t* bytes, const PhysSpec& spec);  // minimum granularity
  Result (*mem_create)(MemHandle* handle, std::size_t bytes, const PhysSpec& spec);
  Result (*mem_release)(MemHandle handle);
  Result (*mem_address_reserve)(DevPtr* ptr, std::size_t bytes, std::size_t alignment, DevPtr hint);
  Result (*mem_address_free)(DevPtr ptr, std::size_t bytes);
  Result (*mem_map)(DevPtr ptr, std::size_t bytes, std::size_t offset, MemHandle handle);
  Result (*mem_unmap)(DevPtr ptr, std::size_t bytes);
  Result (*mem_set_access)(DevPtr ptr, std::size_t bytes, int device, bool read_write);
  Result (*mem_export_to_fd)(int* fd, MemHandle handle);
  Result (*mem_import_from_fd)(MemHandle* handle, int fd);
  Result (*mem_retain_allocation_handle)(MemHandle* handle, DevPtr ptr);

  // Streams and events.
  Result (*stream_create)(Stream* stream, unsigned flags);
  Result (*stream_create_with_priority)(Stream* stream, unsigned flags, int priority);
  Result (*stream_destroy)(Stream stream);
  Result (*stream_synchronize)(Stream stream);
  Result (*stream_query)(Stream stream);  // ok when idle, not_ready while work is pending
  // Whether work submitted to `stream` is being captured into a graph (null on a driver without it).
  Result (*stream_is_capturing)(Stream stream, bool* capturing);
  // Lets the calling thread (a thread of the shim) synchronize while the program's threads capture
  // graphs: its stream-capture interaction mode becomes relaxed (null on a driver without it).
  Result (*thread_relax_capture)();
  Result (*stream_wait_event)(Stream stream, Event event, unsigned flags);
  Result (*event_create)(Event* event, unsigned flags);
  Result (*event_record)(Event event, Stream stream);
  Result (*event_query)(Event event);
  Result (*event_synchronize)(Event event);
  Result (*event_destroy)(Event event);
  // Milliseconds between two completed events recorded with timing (cuEventElapsedTime).
  Result (*event_elapsed_time)(float* ms, Event start, Event end);

  // Native IPC.
  Result (*ipc_get_mem_handle)(IpcHandle* handle, DevPtr ptr);
  Result (*ipc_open_mem_handle)(DevPtr* ptr, const IpcHandle& handle, unsigned flags);
  Result (*ipc_close_mem_handle)(DevPtr ptr);

  // Synchronous copies and fills (tests and migration; never on the allocation hot path).
  Result (*memcpy_htod)(DevPtr dst, const void* src, std::size_t bytes);
  Result (*memcpy_dtoh)(void* dst, DevPtr src, std::size_t bytes);
  Result (*memset_d8)(DevPtr dst, unsigned char value, std::size_t bytes);
  // Device to device (promotion of spilled chunks). May return before the copy is done, as
  // cuMemcpyDtoD does: synchronize before relying on the destination.
  Result (*memcpy_dtod)(DevPtr dst, DevPtr src, std::size_t bytes);

  // A kernel's parameter layout (cuFuncGetParamInfo / cuKernelGetParamInfo, CUDA 12.4+): the
  // offset and size of parameter `index`; invalid_value past the last one. Null where the driver
  // lacks them (the use tracker then cannot see what launches point into).
  Result (*func_get_param_info)(void* func, std::size_t index, std::size_t* offset,
                                std::size_t* size);
  Result (*kernel_get_param_info)(void* kernel, std::size_t index, std::size_t* offset,
                                  std::size_t* size);
};

// Stream flags and event flags the core uses (CU_STREAM_NON_BLOCKING, CU_EVENT_DISABLE_TIMING).
inline constexpr unsigned kStreamNonBlocking = 0x1;
inline constexpr unsigned kEventDisableTiming = 0x2;

}  // namespace allocshim
