// The simulated device's books, shared by simulated_device.cpp (devices, contexts, classic and VMM
// memory) and simulated_pools.cpp (pools, streams, events). One mutex guards them: replay drives
// the device from one thread, the spill target's workers from a few more.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "sim/simulated_device.h"

namespace allocshim::sim {

// The table's entries, by the file that defines them; together every member of Driver.
// One entry a line, as the list is read and edited (not reflowed).
// clang-format off
#define ALLOCSHIM_SIM_DEVICE_ENTRIES(X)                                                           \
  X(init) X(driver_get_version) X(device_get_count) X(device_get_attribute) X(device_get_name)    \
  X(device_total_mem) X(device_get_uuid) X(ctx_get_device) X(ctx_get_current) X(ctx_set_current) \
  X(ctx_synchronize) X(primary_ctx_retain) X(primary_ctx_release) X(primary_ctx_active)           \
  X(ctx_get_id) X(ctx_enable_peer_access) X(mem_get_info) X(mem_alloc) X(mem_alloc_pitch)         \
  X(mem_free) X(mem_alloc_managed) X(mem_host_alloc) X(mem_alloc_host) X(mem_free_host)           \
  X(mem_get_address_range) X(pointer_get_attribute) X(pointer_get_attributes) X(mem_advise)       \
  X(mem_prefetch_async) X(mem_get_granularity) X(mem_create) X(mem_release)                       \
  X(mem_address_reserve) X(mem_address_free) X(mem_map) X(mem_unmap) X(mem_set_access)           \
  X(mem_export_to_fd) X(mem_import_from_fd) X(mem_retain_allocation_handle)                       \
  X(ipc_get_mem_handle) X(ipc_open_mem_handle) X(ipc_close_mem_handle) X(memcpy_htod)            \
  X(memcpy_dtoh) X(memset_d8) X(memcpy_dtod) X(func_get_param_info) X(kernel_get_param_info)
// clang-format on
// One entry a line, as the list is read and edited (not reflowed).
// clang-format off
#define ALLOCSHIM_SIM_POOL_ENTRIES(X)                                                             \
  X(mem_alloc_async) X(mem_alloc_from_pool_async) X(mem_free_async) X(mem_pool_create)            \
  X(mem_pool_destroy) X(mem_pool_set_release_threshold) X(mem_pool_trim_to)                      \
  X(mem_pool_set_access) X(mem_pool_reserved) X(mem_pool_used) X(mem_pool_set_reuse)              \
  X(mem_pool_export_to_fd) X(mem_pool_import_from_fd) X(mem_pool_export_pointer)                  \
  X(mem_pool_import_pointer) X(stream_create) X(stream_create_with_priority) X(stream_destroy)    \
  X(stream_synchronize) X(stream_query) X(stream_is_capturing) X(thread_relax_capture)           \
  X(stream_wait_event)                                                                            \
  X(event_create) X(event_record) X(event_query) X(event_synchronize) X(event_destroy)            \
  X(event_elapsed_time)
// clang-format on
#define ALLOCSHIM_SIM_COUNT(name) +1
// A new Driver entry the simulator lacks is a compile error here, not a null pointer.
static_assert(sizeof(Driver) == (0 ALLOCSHIM_SIM_DEVICE_ENTRIES(ALLOCSHIM_SIM_COUNT)
                                     ALLOCSHIM_SIM_POOL_ENTRIES(ALLOCSHIM_SIM_COUNT)) *
                                    sizeof(void*),
              "every Driver entry needs a simulated one");
#undef ALLOCSHIM_SIM_COUNT

inline std::size_t align_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

struct PoolState;

// An allocation of mem_alloc*, mem_host_alloc or a pool.
struct Block {
  std::size_t size = 0;       // bytes asked for
  std::size_t counted = 0;    // bytes counted against the device
  int device = -1;            // -1: host or managed memory
  PoolState* pool = nullptr;  // the pool it came from, if any
};

// A physical allocation (mem_create): freed once released and unmapped.
struct Phys {
  std::size_t size = 0;
  int device = -1;
  int refs = 1;
  int maps = 0;
};

struct PoolState {
  int device = -1;  // charged for its blocks; -1: host memory
  std::size_t max_size = 0;
  std::uint64_t release_threshold = 0;
  std::size_t reserved = 0;                   // live + cached block bytes
  std::size_t used = 0;                       // live block bytes
  std::multimap<std::size_t, DevPtr> cached;  // rounded size -> address
  bool destroyed = false;  // destroyed with blocks live: each is given back when freed
};

struct SimulatedDevice::State {
  struct Device {
    std::size_t capacity = 0, used = 0, peak = 0;
  };

  int current() const;  // the calling thread's device (0 when none was made current)
  bool charge(int device, std::size_t bytes);  // false: over capacity; device -1 is never
  void uncharge(int device, std::size_t bytes);
  DevPtr take_addresses(std::size_t bytes, std::size_t alignment);
  // A block of mem_alloc*, mem_host_alloc: `counted` bytes charged to `device`.
  Result add_block(DevPtr* ptr, std::size_t bytes, std::size_t counted, int device);
  Result free_block(DevPtr ptr);
  void phys_unref(MemHandle handle);  // frees the handle if nothing holds it
  // Pools (simulated_pools.cpp).
  void pool_block_freed(PoolState& p, DevPtr ptr, std::size_t length);
  void trim_pool(PoolState& p, std::size_t keep);
  void apply_release_thresholds();  // what a synchronization does

  SimConfig config;
  Driver table{};
  mutable std::mutex mu;
  std::vector<Device> devices;
  DevPtr next_address = DevPtr{1} << 44;
  MemHandle next_handle = 1;
  std::map<DevPtr, Block> blocks;
  std::map<DevPtr, std::size_t> reservations;                    // base -> bytes
  std::map<DevPtr, std::pair<std::size_t, MemHandle>> mappings;  // base -> (bytes, handle)
  std::unordered_map<MemHandle, Phys> phys;
  std::vector<std::unique_ptr<PoolState>> pools;  // never freed: a handle stays a valid address
  std::vector<PoolState*> default_pools;          // per device
  std::unordered_set<void*> streams, events;
  std::uintptr_t next_stream = 0x1000;  // handles, past kStreamLegacy and kStreamPerThread
};

// The process's instance (simulated_device.cpp).
SimulatedDevice::State& state();
// Fills the pool, stream and event entries of `table` (simulated_pools.cpp).
void fill_pool_entries(Driver& table);

}  // namespace allocshim::sim
