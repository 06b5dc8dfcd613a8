// Internal state of the fake driver, shared by its parts (fake_driver.cpp: instance, devices and
// contexts; fake_memory.cpp: classic allocations, pointer queries, native IPC; fake_vmm.cpp;
// fake_pools.cpp; fake_streams.cpp). Not for tests: they use fake_driver.h.
//
// One mutex guards everything but the call counters. The fake is a test double: simple and
// obviously correct beats fast, and 32 churning threads only need it to be safe.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "fake_driver.h"

namespace allocshim::fake::detail {

inline constexpr std::size_t kPageBytes = 4096;
inline constexpr std::size_t kAllocAlign = 256;  // cudaMalloc's guaranteed alignment
inline constexpr std::size_t kPitchAlign = 512;

inline std::size_t align_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

// Work on a stream is a ticket count: `submitted` tickets were issued, the first `completed` are
// done. A stream that is not held completes each ticket as it is issued.
struct StreamState {
  unsigned flags = 0;
  int device = 0;
  bool held = false;
  bool live = true;
  bool builtin = false;  // the legacy or per-thread stream of a device
  std::uint64_t submitted = 0;
  std::uint64_t completed = 0;

  std::uint64_t submit() {
    ++submitted;
    if (!held) completed = submitted;
    return submitted;
  }
  bool done(std::uint64_t ticket) const { return completed >= ticket; }
};

struct EventState {
  unsigned flags = 0;
  int device = 0;  // of the context it was created in
  // The tickets this event waits for; empty: never recorded (complete, as on a real device).
  std::vector<std::pair<StreamState*, std::uint64_t>> deps;
  bool recorded = false;
  std::uint64_t at_ns = 0;  // the fake's clock when recorded (event_elapsed_time)
};

enum class AllocKind : std::uint8_t { device, managed, host, pool, pool_import, ipc_open };

// A live allocation made by mem_alloc*, mem_host_alloc, a pool, or an IPC/pool import.
struct Alloc {
  AllocKind kind = AllocKind::device;
  std::size_t size = 0;     // bytes asked for
  std::size_t length = 0;   // bytes mapped at the base
  int device = 0;           // -1: host memory
  std::size_t counted = 0;  // bytes counted against the device (or host) capacity
  std::uint64_t buffer_id = 0;
  struct PoolState* pool = nullptr;
  std::size_t pool_offset = 0;  // offset of a pool block in its pool's arena
  std::size_t pitch = 0;
};

// A physical allocation (cuMemCreate / cuMemImportFromShareableHandle).
struct PhysState {
  int fd = -1;
  std::size_t size = 0;
  Location location;
  bool posix_fd = false;
  bool imported = false;
  int refs = 1;  // cuMemCreate/import + cuMemRetainAllocationHandle - cuMemRelease
  int maps = 0;  // live mappings
  std::size_t counted = 0;
  std::uint64_t block_id = 0;
};

// Access bits per granule of a mapping: bit d of `read` / `write` for device d.
struct Access {
  std::uint64_t read = 0;
  std::uint64_t write = 0;
};

struct Mapping {
  std::size_t size = 0;
  std::size_t offset = 0;
  MemHandle handle = 0;
  std::vector<Access> access;  // one per granule
};

struct CachedBlock {
  DevPtr ptr = 0;
  std::size_t length = 0;
  std::size_t offset = 0;
  StreamState* stream = nullptr;
  std::uint64_t ticket = 0;
};

struct PoolState {
  PoolSpec spec;
  bool is_default = false;
  bool imported = false;
  std::uint64_t release_threshold = 0;
  std::size_t reserved = 0;  // live + cached block bytes
  std::size_t used = 0;      // live block bytes
  int arena_fd = -1;         // blocks are slices of one memfd, so the pool can be exported
  std::size_t arena_end = 0;
  std::vector<CachedBlock> cached;
  std::uint64_t read_access = 0;  // bit d: device d may read
  std::uint64_t write_access = 0;
  std::uint64_t id = 0;
  bool reuse[3] = {true, true, true};  // by PoolReuse; recorded, the fake's reuse rule is fixed
  bool destroyed = false;  // destroyed with blocks still live: each is released when freed
  // Exported with mem_pool_export_to_fd at least once. The H100's driver (580, CUDA 13.0) exports
  // a pointer only from a pool already shared this way (CUDA_ERROR_INVALID_VALUE before), as its
  // documentation says ("from an already shared memory pool"); the fake does the same.
  bool shared = false;
};

struct ContextState {
  int device = 0;
  int retains = 0;
  bool active =
      true;  // false once destroyed by its last release (release_destroys), until retained
  std::uint64_t id =
      0;  // cuCtxGetId: a new one each time the context is made again (after a reset)
};

struct State {
  explicit State(const FakeConfig& c);
  ~State();

  // Counts the call and consumes an injected failure; returns ok to go on.
  Result enter(FakeOp op);

  // The calling thread's current device, or -1 (no context and no implicit one).
  int current_device() const;
  bool valid_device(int d) const { return d >= 0 && d < config.devices; }
  bool charge(int device, std::size_t bytes);  // device -1: host; false: over capacity
  void uncharge(int device, std::size_t bytes);

  // Streams (fake_streams.cpp). Resolves a handle (incl. the legacy/per-thread ones) or null.
  StreamState* stream(Stream handle);
  EventState* event(Event handle);  // null (and a stale use counted) if not live
  // Completes the held work a synchronization waits for; counts a blocking wait if there was any.
  void complete(StreamState& s);
  void complete_device(int device);
  // Releases cached pool blocks above each pool's release threshold (what a sync does).
  void apply_release_thresholds();
  bool event_ready(const EventState& e) const;

  // Memory (fake_memory.cpp).
  const Alloc* find_alloc(DevPtr ptr, DevPtr* base) const;  // the allocation containing ptr
  Result map_new(std::size_t length, DevPtr* out);          // fresh shared anonymous memory
  void unmap(DevPtr base, std::size_t length);

  // Pools (fake_pools.cpp).
  PoolState* pool(Pool handle);
  // Frees a pool block (or an imported pool pointer) at `ptr` in stream order on `stream`.
  Result free_pool_block(DevPtr ptr, StreamState& stream);
  PoolState& default_pool(int device);
  void release_block(PoolState& p, const CachedBlock& b);
  // Releases cached blocks whose free has completed until the pool holds at most `keep` bytes.
  void trim_pool(PoolState& p, std::size_t keep);
  int pool_device(const PoolState& p) const;  // the device charged for its blocks; -1: host

  // VMM (fake_vmm.cpp).
  const Mapping* find_mapping(DevPtr ptr, DevPtr* base) const;

  // Context reset (fake_reset.cpp): destroys everything `device`'s primary context owns.
  void reset_context(int device);
  // Counts a use of a handle a reset destroyed (a real driver may crash on it); false otherwise.
  bool stale(const void* handle);

  FakeConfig config;
  std::uint64_t instance_id = 0;
  mutable std::mutex mu;
  std::array<std::atomic<std::uint64_t>, kFakeOpCount> calls{};

  struct Failure {
    Result result = res::ok;
    int count = 0;
    int skip = 0;
  };
  std::mutex fail_mu;
  std::array<Failure, kFakeOpCount> failures{};
  std::atomic<bool> any_failure{false};
  std::array<std::function<void()>, kFakeOpCount> on_call{};  // under fail_mu; any_failure is set
  std::unordered_map<void*, std::vector<std::pair<std::size_t, std::size_t>>>
      layouts[2];  // under mu

  std::vector<std::size_t> capacity, used;
  std::size_t host_used = 0;
  std::uint64_t host_maps = 0;  // mem_map calls that mapped host-located memory
  std::size_t managed_used = 0;
  std::uint64_t next_id = 1;  // buffer ids, handle ids, pool ids
  std::uint64_t blocking_waits = 0;

  std::vector<std::unique_ptr<ContextState>> contexts;  // one primary context per device
  std::vector<std::pair<int, int>> peers;

  std::map<DevPtr, Alloc> allocs;
  std::vector<AdviceRecord> advice;
  std::vector<PrefetchRecord> prefetches;

  std::map<DevPtr, std::size_t> reservations;  // base -> size
  std::map<DevPtr, Mapping> mappings;          // base -> mapping
  std::unordered_map<MemHandle, PhysState> phys;

  // Streams are never deleted before the instance: events may still refer to a destroyed one.
  std::vector<std::unique_ptr<StreamState>> all_streams;
  std::unordered_map<Stream, StreamState*> streams;  // live created streams
  std::vector<StreamState*> legacy, per_thread;      // per device
  std::unordered_map<Event, std::unique_ptr<EventState>> events;
  std::uint64_t clock_ns = 0;  // what events record: moved only by FakeDriver::advance_clock

  std::unordered_map<Pool, std::unique_ptr<PoolState>> pools;  // created and imported pools
  std::vector<std::unique_ptr<PoolState>> default_pools;       // per device, made on first use
  std::vector<std::unique_ptr<PoolState>> dead_pools;          // destroyed; kept for their blocks

  // Handles a context reset destroyed, and their states, kept so that no new handle reuses an
  // address: a later use of one is a stale use (counted), never a different object.
  std::unordered_map<const void*, int> reset_handles;  // handle -> device
  std::vector<std::unique_ptr<EventState>> dead_events;
  std::uint64_t stale_uses = 0;
  std::uint64_t resets = 0;
  std::uint64_t next_context_id = 0;  // cuCtxGetId
};

// The live instance's state; aborts with a message when no FakeDriver exists.
State& state();

// The start of every table entry: the state as `s`, the call counted, and an injected failure
// returned instead of running the entry.
#define FAKE_ENTRY(op) \
  State& s = state();  \
  if (Result fake_entry_r = s.enter(FakeOp::op)) return fake_entry_r

// The table entries, one function per Driver member with the member's exact type. Defined across
// the fake_*.cpp files; a missing one is a link error.
namespace impl {
#define ALLOCSHIM_FAKE_DECLARE(name) extern std::remove_pointer_t<decltype(Driver::name)> name;
ALLOCSHIM_FAKE_OPS(ALLOCSHIM_FAKE_DECLARE)
#undef ALLOCSHIM_FAKE_DECLARE
}  // namespace impl

}  // namespace allocshim::fake::detail
