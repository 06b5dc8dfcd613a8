// A simulated CUDA device on host memory that fills the driver table (shim/base/driver.h).
//
// Unit and conformance tests of the core and the backends run on it in CI, where no GPU exists; the
// fake libcuda.so.1 (tests/fake/libcuda) exports the real driver ABI on top of the same model, so the
// preload tests drive the real hook layer end to end.
//
// The model, and where it deliberately differs from a real device:
//   - Device "addresses" are host addresses: tests can memset and read every byte they were given.
//     cuMemAlloc memory is a MAP_SHARED anonymous mapping (page aligned, so >= 256-byte aligned like
//     cudaMalloc); shared so that an IPC handle can be reopened after fork.
//   - Each device has a capacity; everything backed by device memory counts against it in the bytes
//     the fake really reserves: cuMemAlloc (rounded up to 256), pool blocks (rounded up to the
//     granularity), cuMemCreate handles with a device location. Host and host-NUMA handles and
//     pinned host memory count against the host capacity; managed memory counts against neither.
//   - VMM: a reservation is PROT_NONE host VA, a physical handle is a memfd, cuMemMap maps it
//     MAP_SHARED|MAP_FIXED into the reservation. Exported handles are dup()ed memfds, so IPC tests
//     can pass them between processes.
//   - Streams and events are counters. Work enqueued on a stream completes at once unless the test
//     holds the stream (hold_stream). An event recorded on the legacy stream also waits for the
//     blocking streams of its device, as on a real device. Synchronizing (context, stream, event,
//     or a cuMemFree, which synchronizes the device) completes the held work it waits for instead of
//     blocking, and counts a blocking wait, so single-threaded tests never deadlock.
//   - Pools keep freed blocks cached (RESERVED_MEM_CURRENT counts them) until a synchronization
//     finds more than the release threshold cached, or trim_to. A freed block is reused on its own
//     stream at once and on other streams once its free has completed.
//   - Only one FakeDriver may exist at a time: the table holds plain function pointers, which reach
//     the instance through a process-wide pointer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string_view>
#include <vector>

#include "base/driver.h"
#include "base/types.h"

namespace allocshim::fake {

// One operation per entry of the driver table, in the table's order.
// One entry a line, as the list is read and edited (not reflowed).
// clang-format off
#define ALLOCSHIM_FAKE_OPS(X)                                                                      \
  X(init) X(driver_get_version) X(device_get_count) X(device_get_attribute) X(device_get_name)      \
  X(device_total_mem) X(device_get_uuid) X(ctx_get_device) X(ctx_get_current) X(ctx_set_current)  \
  X(ctx_synchronize)                                                                               \
  X(primary_ctx_retain) X(primary_ctx_release) X(primary_ctx_active) X(ctx_get_id)                 \
  X(ctx_enable_peer_access)                                                                        \
  X(mem_get_info)                                                                                  \
  X(mem_alloc) X(mem_alloc_pitch) X(mem_free) X(mem_alloc_managed) X(mem_host_alloc)               \
  X(mem_alloc_host) X(mem_free_host) X(mem_get_address_range) X(pointer_get_attribute)             \
  X(pointer_get_attributes) X(mem_advise) X(mem_prefetch_async)                                    \
  X(mem_alloc_async) X(mem_alloc_from_pool_async) X(mem_free_async) X(mem_pool_create)             \
  X(mem_pool_destroy) X(mem_pool_set_release_threshold) X(mem_pool_trim_to) X(mem_pool_set_access) \
  X(mem_pool_reserved) X(mem_pool_used) X(mem_pool_set_reuse) X(mem_pool_export_to_fd) X(mem_pool_import_from_fd)                         \
  X(mem_pool_export_pointer) X(mem_pool_import_pointer)                                            \
  X(mem_get_granularity) X(mem_create) X(mem_release) X(mem_address_reserve) X(mem_address_free)  \
  X(mem_map) X(mem_unmap) X(mem_set_access) X(mem_export_to_fd) X(mem_import_from_fd)              \
  X(mem_retain_allocation_handle)                                                                  \
  X(stream_create) X(stream_create_with_priority) X(stream_destroy) X(stream_synchronize)         \
  X(stream_query) X(stream_is_capturing) X(thread_relax_capture)                                  \
  X(stream_wait_event) X(event_create) X(event_record) X(event_query) X(event_synchronize)         \
  X(event_destroy) X(event_elapsed_time)                                                          \
  X(ipc_get_mem_handle) X(ipc_open_mem_handle) X(ipc_close_mem_handle)                           \
  X(memcpy_htod) X(memcpy_dtoh) X(memset_d8) X(memcpy_dtod)                                       \
  X(func_get_param_info) X(kernel_get_param_info)
// clang-format on

enum class FakeOp : std::uint8_t {
#define ALLOCSHIM_FAKE_OP_ENUM(name) name,
  ALLOCSHIM_FAKE_OPS(ALLOCSHIM_FAKE_OP_ENUM)
#undef ALLOCSHIM_FAKE_OP_ENUM
};
#define ALLOCSHIM_FAKE_OP_COUNT(name) +1
inline constexpr int kFakeOpCount = 0 ALLOCSHIM_FAKE_OPS(ALLOCSHIM_FAKE_OP_COUNT);
#undef ALLOCSHIM_FAKE_OP_COUNT
// A new driver-table entry without a fake operation is a compile error here, not a null pointer.
static_assert(sizeof(Driver) == kFakeOpCount * sizeof(void*),
              "every Driver entry needs a FakeOp (ALLOCSHIM_FAKE_OPS)");

const char* op_name(FakeOp op);
// The op named `name` (e.g. "mem_create"); false if there is none.
bool op_from_name(std::string_view name, FakeOp* op);

inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kGiB = std::size_t{1} << 30;
inline constexpr std::size_t kUnlimitedBytes = std::numeric_limits<std::size_t>::max();

struct FakeConfig {
  int devices = 1;
  std::size_t capacity = kGiB;                  // per device
  std::size_t host_capacity = kUnlimitedBytes;  // pinned host + host/host-NUMA physical handles
  std::size_t granularity = 2 * kMiB;           // VMM and pool granularity (minimum = recommended)
  int driver_version = 13000;
  // Releasing the last reference to a primary context destroys it, as on a real driver; off by
  // default, since tests that never retain rely on the implicit context.
  bool release_destroys = false;
  // A thread that never made a context current behaves as if device 0's primary context were
  // current (what the CUDA runtime arranges lazily); false: such calls fail with invalid_context.
  bool implicit_context = true;
  // VMM mappings stay PROT_NONE until mem_set_access gives some device access, so a backend that
  // forgets cuMemSetAccess faults in tests as it would on a GPU. Off: mappings are usable at once.
  bool strict_access = false;
  // Answers of device_get_attribute, indexed by DevAttr (all capabilities on, NUMA id 0).
  int attributes[8] = {1, 1, 1, 1, 0, 1, 1, 1};
};

// Recorded managed-memory calls, for assertions.
struct AdviceRecord {
  DevPtr ptr;
  std::size_t bytes;
  Advice advice;
  Location location;
};
struct PrefetchRecord {
  DevPtr ptr;
  std::size_t bytes;
  Location location;
  Stream stream;
};

namespace detail {
struct State;
}

// cuMemSetAccess with the driver's three access levels (none, read, read-write); the table's
// mem_set_access has two (read_write false revokes). Counted as FakeOp::mem_set_access.
Result set_access_flags(DevPtr ptr, std::size_t bytes, int device, bool read, bool write);

class FakeDriver {
 public:
  explicit FakeDriver(FakeConfig config = {});
  ~FakeDriver();
  FakeDriver(const FakeDriver&) = delete;
  FakeDriver& operator=(const FakeDriver&) = delete;

  // The live instance (null when none).
  static FakeDriver* current();

  // The driver table; valid while this instance lives.
  const Driver& driver() const { return table_; }
  const FakeConfig& config() const;

  // Failure injection: the next `count` calls of `op` after `skip` successful ones return `result`
  // without effect. Calls are counted whether or not they fail.
  void fail_next(FakeOp op, Result result, int count = 1, int skip = 0);
  void clear_failures();
  // Runs `fn` on the calling thread at every call of `op`, before its effect (null: none): a test
  // can hold a thread inside a driver call to see what other threads do meanwhile.
  void on_call(FakeOp op, std::function<void()> fn);
  std::uint64_t calls(FakeOp op) const;
  std::uint64_t total_calls() const;
  void reset_calls();

  // Device memory accounting.
  std::size_t capacity(int device) const;
  void set_capacity(int device, std::size_t bytes);
  std::size_t used(int device) const;  // bytes counted against the device
  std::size_t host_used() const;       // pinned host + host-located physical handles
  std::size_t managed_used() const;
  std::size_t live_allocations() const;  // cuMemAlloc/pitch/managed/host/pool blocks in use

  // Streams and events. `stream` may be a created stream, kStreamLegacy or kStreamPerThread (of the
  // calling thread's current device; the per-thread stream is one stream shared by all threads).
  void hold_stream(Stream stream);
  void release_stream(Stream stream);
  // Synchronizations that found held work and completed it (a real device would have blocked).
  std::uint64_t blocking_waits() const;
  std::size_t live_streams() const;
  std::size_t live_events() const;
  // True if `event` has completed (what event_query answers, without counting a call).
  bool event_complete(Event event) const;
  // The time events record (event_elapsed_time): it moves only here, so a test says how long the
  // work between two events took.
  void advance_clock(std::uint64_t ns);

  // VMM state.
  std::size_t live_handles() const;  // physical handles not yet freed (released and unmapped)
  std::size_t reservations() const;
  // Mappings of host-located physical memory made so far (on a real device mapping host memory
  // and granting access to it is what a move costs besides the copy).
  std::uint64_t host_maps() const;
  std::size_t mappings() const;
  bool is_mapped(DevPtr ptr) const;
  // Whether `device` may access the mapped address `ptr` (read_write: for writing).
  bool has_access(DevPtr ptr, int device, bool read_write) const;

  // Pools.
  Pool default_pool(int device) const;  // the pool mem_alloc_async uses on `device`
  std::size_t live_pools() const;       // created (not default) pools
  std::uint64_t pool_reserved(Pool pool) const;
  std::uint64_t pool_used(Pool pool) const;
  std::uint64_t pool_release_threshold(Pool pool) const;
  bool pool_access(Pool pool, int device) const;
  // The reuse policy last set with mem_pool_set_reuse (all enabled on a new pool, as on CUDA).
  bool pool_reuse(Pool pool, PoolReuse which) const;

  // Kernel parameter layouts (func_get_param_info, or kernel_get_param_info with `kernel`): the
  // (offset, size) of each parameter of `function`. A handle without one is unknown to the driver.
  void set_param_layout(void* function, std::vector<std::pair<std::size_t, std::size_t>> params,
                        bool kernel = false);

  // Managed memory, contexts, peers.
  std::vector<AdviceRecord> advice() const;
  std::vector<PrefetchRecord> prefetches() const;
  bool peer_enabled(int from_device, int to_device) const;
  // Makes `device`'s primary context current on the calling thread (test convenience).
  void set_current_device(int device);

  // cuDevicePrimaryCtxReset: the context's streams, events and memory
  // pools (created and default) are destroyed, and its memory freed: cuMemAlloc, managed and pool
  // blocks of `device`. Pinned host memory and VMM handles and mappings are left alone (they are
  // not the context's in the fake). A later use of a destroyed handle fails with the driver's
  // error and is counted: a real driver may crash on it instead, so tests require stale_uses() == 0.
  void reset_device(int device);
  // The same for the fake libcuda's entry points: an invalid device or context is refused.
  Result reset_primary_context(int device);
  Result destroy_context(Context ctx);
  std::uint64_t stale_uses() const;
  std::uint64_t resets() const;

  detail::State& state() { return *state_; }

 private:
  std::unique_ptr<detail::State> state_;
  Driver table_{};
};

}  // namespace allocshim::fake
