// The backend interface. Each backend kind (native, async_pool, vmm, managed, host) implements the
// private do_* hooks; the public non-virtual entry points are the one place where statistics are
// kept, so backends stay plain (the RMM device_memory_resource shape).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/driver.h"
#include "placement/movable.h"
#include "base/stats.h"
#include "base/types.h"

namespace allocshim {

// One allocation request as the core sees it, after the hook layer converted the driver's arguments.
struct AllocRequest {
  std::size_t size = 0;  // bytes the program asked for (pitch: width * height)
  Api api = Api::alloc;
  int device = 0;                 // device of the current context
  Stream stream = kStreamLegacy;  // the program's stream for Api::async; kStreamLegacy otherwise
  unsigned flags = 0;             // cuMemAllocManaged / cuMemHostAlloc flags
  Pool pool = nullptr;            // cuMemAllocFromPoolAsync: the program's pool; else null
  std::size_t pitch_width = 0;    // Api::pitch only: the request, and where the pitch goes
  std::size_t pitch_height = 0;
  unsigned pitch_element = 0;
  std::size_t* pitch_out = nullptr;
  // The budget's spill target only: the bytes of the range the core claimed for the device before
  // the call (the rest goes to the host), and where the backend writes what it placed there (less
  // when the driver had less than the budget says; the core gives the difference back).
  std::size_t device_part = 0;
  std::size_t* device_placed = nullptr;
};

// How the program freed it: cuMemFree (synchronous) or cuMemFreeAsync on `stream`.
struct FreeRequest {
  Stream stream = kStreamLegacy;
  bool async = false;
};

// What the registry remembers about a live allocation; handed back to the backend at free.
struct Block {
  std::size_t size = 0;       // the program's size
  std::uint32_t backend = 0;  // index in the core's backend table
  std::int16_t device = 0;
  Api api = Api::alloc;
  FreeSync free_sync = FreeSync::device;
  std::uint64_t cookie = 0;  // backend-private (e.g. a chunk index or the real size)
};

// A backend's state of each device, by ordinal: at() answers null for an ordinal out of range (a
// device the program named that the shim cannot serve), so callers need no check of their own.
template <class T>
class PerDevice {
 public:
  T* at(int device) {
    return device >= 0 && static_cast<std::size_t>(device) < kMaxDevices
               ? &items_[static_cast<std::size_t>(device)]
               : nullptr;
  }
  const T* at(int device) const { return const_cast<PerDevice*>(this)->at(device); }
  T& operator[](std::size_t i) { return items_[i]; }
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::array<T, kMaxDevices> items_;
};

class Backend {
 public:
  // How calls are timed for the latency statistics (base/stats.h): `every_call` where each call
  // reaches the driver anyway (a clock read is lost in it), `sampled` where a pool hit costs a few
  // hundred ns and four clock reads would be a good part of it.
  enum class Timing : std::uint8_t { every_call, sampled };

  Backend(std::string name, BackendKind kind, const Driver& driver,
          Timing timing = Timing::every_call)
      : name_(std::move(name)), kind_(kind), driver_(driver), sampled_(timing == Timing::sampled) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  // Serves `req`. On success *out is the device address and *cookie whatever the backend needs back
  // at free. `sync` is the free_sync the policy picked for this allocation.
  Result allocate(const AllocRequest& req, FreeSync sync, DevPtr* out, std::uint64_t* cookie);
  // Frees a block this backend served. Never fails loudly: errors are returned as the driver's code.
  Result deallocate(DevPtr ptr, const Block& block, const FreeRequest& req);

  // Returns cached (free but held) memory of `device` to the driver; -1: every device. Called before
  // retrying an allocation the driver refused, and under memory pressure.
  virtual Result trim(int device) {
    (void)device;
    return res::ok;
  }
  // The budget's spill target: the bytes the range of `req` takes and the unit the device part of it
  // is claimed in, so that the core decides how much of it may be on the device before it calls
  // allocate. False: nothing to claim (another backend, or a request allocate would refuse).
  virtual bool device_extent(const AllocRequest& req, std::size_t* range, std::size_t* unit) {
    (void)req;
    (void)range;
    (void)unit;
    return false;
  }
  // The memory of this backend that migration may move (placement/movable.h); null for most backends.
  virtual Movable* movable() { return nullptr; }
  // If `ptr` lies inside memory this backend handed out, sets the enclosing block's base and size.
  // Used for pointer queries on sub-allocated memory; backends that hand out whole driver
  // allocations return false and the driver answers.
  virtual bool find(DevPtr ptr, DevPtr* base, std::size_t* size) const {
    (void)ptr;
    (void)base;
    (void)size;
    return false;
  }
  // Bytes of device memory this backend holds from the driver on `device` (live + cached).
  virtual std::size_t reserved(int device) const { return stats_.device(device).live_bytes(); }
  // The program enabled peer access from its current device to `peer_device`'s memory: extend it
  // to the memory this backend holds on `peer_device`.
  virtual Result enable_peer_access(int accessing_device, int peer_device) {
    (void)accessing_device;
    (void)peer_device;
    return res::ok;
  }

  // `ctx`, a context of `device`, is being destroyed (core/reset.cpp): the driver frees every
  // block, stream, event and pool of it. `alive`: it still exists (cuDevicePrimaryCtxReset,
  // cuCtxDestroy, before the call), so the backend destroys what it holds there itself; otherwise
  // it is gone already (after the last cuDevicePrimaryCtxRelease) and its
  // streams, events and pools must never be touched again, only forgotten. VMM memory is not the
  // context's and is given back either way. The backend starts afresh at the device's next
  // request. True if the program's blocks of `device` in this backend die with `ctx` (the core
  // drops them through forget()); the default suits backends that hand out the driver's own
  // allocations, which die with it.
  virtual bool drop_context(int device, Context ctx, bool alive) {
    (void)device;
    (void)ctx;
    (void)alive;
    return true;
  }
  // `barrier` frees (backends/free_sync.h). The program synchronized the context of `device`, a
  // synchronization numbered `sync` (StreamTracker::begin_context_sync): frees made before it began
  // are complete. close_epochs: `dying`, a stream of `device` the stream tracker no longer lists,
  // is about to be destroyed, so frees waiting in an open epoch get their events now, on it too,
  // while it can still take one (null: no stream goes; the epochs are closed all the same).
  virtual void context_synchronized(int device, std::uint64_t sync) {
    (void)device;
    (void)sync;
  }
  virtual void close_epochs(int device, Stream dying) {
    (void)device;
    (void)dying;
  }
  // The physical allocation mapped under `ptr` (its address and size), for backends that know it
  // (IPC export: on host-located VMM memory the driver's cuMemGetAddressRange answers base 0).
  virtual bool physical(DevPtr ptr, DevPtr* base, std::size_t* size) const {
    (void)ptr;
    (void)base;
    (void)size;
    return false;
  }
  // The memory pool that serves `device`, for IPC export (shim/ipc), which must export the pool
  // before a pointer in it: only async_pool has one (and only after the device's first allocation).
  virtual Pool ipc_pool(int device) const {
    (void)device;
    return nullptr;
  }
  // The block at `base` was exported to another process (shim/ipc): its physical memory must stay
  // what the importer maps (no migration) for the rest of its life.
  virtual void on_exported(DevPtr base) { (void)base; }
  // A live block the driver freed with its context: it leaves the statistics, and any count the
  // backend keeps of it (on_forget), without a driver call.
  void forget(const Block& block);

  const std::string& name() const { return name_; }
  BackendKind kind() const { return kind_; }
  const BackendStats& stats() const { return stats_; }
  bool timing_sampled() const { return sampled_; }
  // An allocation the core refused for this backend before calling it (past the device budget):
  // the program receives an out-of-memory, so the backend's statistics count it as failed.
  void count_refused(int device) { stats_.device(device).on_failure(); }

 protected:
  const Driver& driver() const { return driver_; }
  BackendStats& mutable_stats() { return stats_; }
  // drop_context: whether state made under `mine` (the context current at the device's first
  // request) lives in `gone`. A null `mine` was the driver's implicit context: the primary one.
  static bool in_context(Context mine, Context gone) { return mine == gone || mine == nullptr; }

 private:
  virtual Result do_allocate(const AllocRequest& req, FreeSync sync, DevPtr* out,
                             std::uint64_t* cookie) = 0;
  virtual Result do_deallocate(DevPtr ptr, const Block& block, const FreeRequest& req) = 0;
  virtual void on_forget(const Block& block) { (void)block; }

  std::string name_;
  BackendKind kind_;
  const Driver& driver_;
  bool sampled_;
  BackendStats stats_;
};

}  // namespace allocshim
