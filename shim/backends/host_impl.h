// The `host` backend's class, shared by its allocation path (host.cpp, host_allocate.cpp) and its
// migration path (host_migrate.cpp). Internal to shim/backends: everything else uses backends/host.h.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backends/host.h"
#include "backends/host_maker.h"
#include "backends/host_pinner.h"
#include "core/backend.h"
#include "placement/use_tracker.h"

namespace allocshim {

class Budget;

namespace host_detail {

inline constexpr std::size_t kDefaultChunk = std::size_t{2} << 20;

// How the spill target reads the host's available and total memory before pinning ahead
// (os::host_memory; a test may replace it); false: unknown.
using HostMemoryProbe = bool (*)(std::uint64_t* available, std::uint64_t* total);

class HostBackend final : public Backend, public Movable {
 public:
  // `budget` non-null: the spill target (device pieces up to the budget, host chunks of one chunk
  // each, both movable); null: the `host` kind (everything on the host, one physical allocation).
  HostBackend(std::string name, const Driver& driver, Budget* budget);
  ~HostBackend() override;

  bool find(DevPtr ptr, DevPtr* base, std::size_t* size) const override;
  // Gives the host reserve of `device` back to the driver.
  Result trim(int device) override;
  std::size_t reserved(int device) const override {
    const DeviceState* s = devices_.at(device);
    return s ? s->device_bytes.load(std::memory_order_relaxed) : 0;
  }
  Result enable_peer_access(int accessing_device, int peer_device) override;
  bool drop_context(int device, Context ctx, bool alive) override;
  bool physical(DevPtr ptr, DevPtr* base, std::size_t* size) const override;
  void on_exported(DevPtr base) override;

  // The spill target's memory moves (placement/movable.h, host_migrate.cpp); the `host` kind's does not.
  Movable* movable() override { return budget_ ? this : nullptr; }
  void movable(int device, std::vector<MovableAllocation>& out) const override;
  std::size_t host_bytes(int device) const override {
    const DeviceState* s = devices_.at(device);
    return s ? s->host_bytes.load(std::memory_order_relaxed) : 0;
  }
  std::size_t device_bytes(int device) const override {
    const DeviceState* s = devices_.at(device);
    return s ? s->device_bytes.load(std::memory_order_relaxed) : 0;
  }
  Moves promote(int device, const std::vector<DevPtr>& bases, std::size_t max_bytes,
                const Room& room) override;
  Moves demote(int device, const std::vector<DevPtr>& bases, std::size_t want_bytes) override;
  void expect_demotion(int device, std::size_t bytes) override;
  std::size_t host_spare(int device) const override;
  std::size_t host_reserve() const override {
    return host_reserve_.load(std::memory_order_relaxed);
  }
  // Its host side (host.h, set_host_side).
  void configure(const policy::BackendSpec& host_side, policy::Budget::Migrate mode);
  bool pins_ahead_setting() const { return pin_ahead_.load(std::memory_order_relaxed); }
  std::size_t give_host(int device, std::size_t max_bytes, std::vector<Given>& out) override;
  bool adopt_host(int device, std::size_t bytes, int fd) override;

 private:
  // What the tests read and replace of its internals (tests/unit/host_probe.h).
  friend struct HostBackendProbe;

  // A piece of an allocation's range backed by one physical allocation.
  struct Piece {
    std::size_t offset = 0;
    std::size_t bytes = 0;
    MemHandle handle = 0;
    bool on_device = false;
  };
  struct Allocation {
    int device = 0;
    bool exported = false;  // shared with another process: its pieces stay where they are
    std::size_t va_bytes = 0;
    std::size_t size = 0;      // the program's
    std::uint64_t seq = 0;     // allocation order
    UseRecord* use = nullptr;  // what submissions said of it (spill target only)
    std::vector<Piece> pieces;
  };
  struct DeviceState {
    bool ready = false;
    Context ctx = nullptr;
    std::size_t chunk = kDefaultChunk;
    Location host;
    std::atomic<bool> posix_fd{false};  // pieces exportable (IPC) as POSIX file descriptors
    std::uint64_t peers = 0;            // devices granted access besides this one (bit per device)
    DevPtr scratch = 0;  // kMovePiece bytes of VA: a move maps its device-side piece there too
    std::size_t promoted = 0, demoted = 0;
    std::atomic<std::size_t> device_bytes{0}, host_bytes{0};
    // The host reserve: pinned host pieces promotions freed, by size, kept for later demotions and
    // spills (at most [backends.host] host_reserve bytes; under mutex_).
    std::multimap<std::size_t, MemHandle> reserve;
    std::size_t reserve_bytes = 0;
    // Host pieces the pinner made ahead of demotions (pin_ahead), by size; they count against
    // the reserve's bound too (under mutex_).
    std::multimap<std::size_t, MemHandle> ahead;
    std::size_t ahead_bytes = 0;
    bool ahead_armed = true;  // false once given back, until the next demotion
    // When the pinner first found the process idle with a demotion expected (the budget's
    // expected_demotion, pinned ahead for with or without pin_ahead; {}: computing, or
    // not looked at since): the expectation lapses after pin_ahead_idle_ms of it (under mutex_).
    Pinner::Clock::time_point expected_idle{};
    Pinner::Clock::time_point ahead_touched{};  // the last piece pinned ahead or taken
    std::size_t largest = 0;                    // the largest allocation of this device so far
    // This device's allocations in allocs_ by age (seq), oldest first, so that pinning ahead
    // walks the oldest few instead of sorting them all (under mutex_).
    std::map<std::uint64_t, const Allocation*> by_age;
  };
  // Host memory for a run of pieces, taken in order: pieces of the reserve where it holds one of
  // the size, the others pinned by a HostMaker on the budget's pin_threads (host_maker.h).
  struct HostRun {
    std::vector<std::size_t> sizes;
    std::vector<MemHandle> kept;    // per piece: from the reserve (0: none, or taken)
    std::vector<std::size_t> slot;  // per piece not kept: its index in the maker's run
    std::optional<HostMaker> maker;
  };

  Result do_allocate(const AllocRequest& req, FreeSync sync, DevPtr* out,
                     std::uint64_t* cookie) override;
  Result do_deallocate(DevPtr ptr, const Block& block, const FreeRequest& req) override;
  bool device_extent(const AllocRequest& req, std::size_t* range, std::size_t* unit) override;
  // do_allocate's steps. Reserves the range of `a` and maps it: `on_device` bytes on the device (0
  // after when the driver has less), the rest on the host, granted to `peers` too. On failure
  // nothing stays mapped.
  Result map_range(DeviceState& s, std::uint64_t peers, std::size_t chunk, Allocation& a,
                   std::size_t& on_device, DevPtr* out);
  // Maps [on_device, va_bytes) of `a`'s range at `base` as host pieces; on failure what it mapped
  // stays in `a` for the caller to unmap.
  Result map_host_pieces(DeviceState& s, DevPtr base, std::size_t chunk, std::size_t on_device,
                         Allocation& a);
  // Counts the new range `a` (mapped at `base`) and keeps it in allocs_; then may kick the pinner
  // and tells the budget what spilled.
  void enter_allocation(DeviceState& s, std::uint64_t peers, DevPtr base, Allocation&& a,
                        std::size_t on_device);

  Result init(DeviceState& s, int device);
  DeviceState* ready_state(int device, std::size_t* chunk, std::uint64_t* peers, Result* r);
  // Grants `device` and the `peers` read-write access to [ptr, ptr + bytes).
  Result grant(std::uint64_t peers, int device, DevPtr ptr, std::size_t bytes);
  // Creates physical memory of `bytes` at `location`, exportable where `s` allows (any thread).
  Result create(DeviceState& s, std::size_t bytes, const Location& location,
                MemHandle* handle) const;
  // create, then maps it at `at`.
  Result map_new(DeviceState& s, DevPtr at, std::size_t bytes, const Location& location,
                 MemHandle* handle);
  // With mutex_ held: starts `run` for pieces of `sizes` of `device` (counted as reserve hits and
  // misses); end_host_run gives the reserve's pieces not taken back to it and, when pinning ran
  // out of host memory (`host_short`), the whole reserve to the driver.
  void start_host_run(DeviceState& s, int device, std::vector<std::size_t> sizes, HostRun& run);
  static Result take_host(HostRun& run, std::size_t i, MemHandle* handle);
  void end_host_run(DeviceState& s, int device, HostRun& run, bool host_short);
  // The reserve's bound on `device`: the budget's (Budget::reserve_bound), or with a reserve the
  // demotion expected for others, if larger.
  std::size_t reserve_bound(int device) const;
  // With mutex_ held: keeps a host piece in the reserve if the bound allows, else releases it.
  void keep_host(DeviceState& s, int device, std::size_t bytes, MemHandle handle);
  // With mutex_ held: releases reserve pieces past the bound (an expected demotion ended).
  void trim_reserve(DeviceState& s, int device);
  // With mutex_ held: releases every piece of the reserve (and those pinned ahead).
  void drop_reserve(DeviceState& s, int device);

  // Pinning ahead (host_ahead.cpp; docs/design/oversubscription.md, "Pinning ahead").
  // Whether a demotion looks near on `device`, whose largest allocation so far is `largest` (no
  // lock of this backend held: it reads the budget).
  bool demotion_near(int device, std::size_t largest);
  // Whether pinning ahead is on for `device` (pin_ahead, or a demotion expected); kick_ahead,
  // with mutex_ held: if it is, and armed in `s` too, asks the pinner for a pass.
  bool pins_ahead(int device) const;
  void kick_ahead(DeviceState& s, int device);
  // Whether pieces pinned ahead are kept at all (the policy allows pinning ahead of some kind).
  bool keeps_ahead() const;
  // With mutex_ held: the size of the next host piece to pin ahead on `device` (that of `s`), 0
  // for none.
  std::size_t ahead_next(const DeviceState& s, int device) const;
  // The pinner's pass: at most one piece per device; gives back what idles or the host needs.
  Pinner::Clock::time_point ahead_pass();
  // With mutex_ held: releases the pieces pinned ahead on `device`, counted as given back, and
  // has the budget forget the demotion expected there.
  void drop_ahead(DeviceState& s, int device);
  // At exit, the pinner stopped: gives back every piece pinned ahead.
  void close_ahead();
  // Maps the device part [0, bytes) of a new range as pieces of at most kMovePiece (each can be
  // demoted alone); on failure unmaps what it mapped.
  Result map_device_pieces(DeviceState& s, DevPtr base, std::size_t bytes, int device,
                           std::vector<Piece>& pieces);
  // Unmaps and releases every piece and the range.
  void unmap_all(DevPtr base, const Allocation& a);
  // unmap_all for a live allocation: its bytes leave the counters, its device chunks the budget.
  void release(DevPtr base, const Allocation& a);
  // With the lock held, at a safe point: moves one piece into `fresh` (new physical memory of the
  // piece's size on the device or the host) at the same address: the device-side piece of the two
  // is mapped at the scratch range too, the data copied through it and the address remapped. On
  // failure the old mapping is back with its data and `fresh`, unmapped, is still the caller's; on
  // success `old` is the piece's former memory, for the caller to release or keep.
  Result move(DeviceState& s, int device, DevPtr base, Piece& piece, bool to_device,
              MemHandle fresh, MemHandle* old);
  // Tells the use tracker how much of `a` is on the host now (launches naming it then ask whether
  // to bring it back first, and may be timed).
  static void note_place(const Allocation& a);
  // With the lock held: the scratch range and an idle context for a migration on `device`.
  bool prepare_move(DeviceState& s);
  // With the lock held: the allocations at `bases` that may still move (live, of `device`, not
  // exported: an importer maps the pieces it was sent, and a moved piece would be another one).
  std::vector<std::pair<DevPtr, Allocation*>> movable_at(int device,
                                                         const std::vector<DevPtr>& bases);

  Budget* budget_;
  // The host side ([backends.host]) in effect: threads that pin at once (at most one per CPU the
  // process may run on), the host reserve's bytes per device (0 where nothing moves), pinning
  // ahead (only with migrate = "auto" and a reserve), and how long pieces pinned ahead stay unused.
  std::atomic<unsigned> pin_threads_{0};
  std::atomic<std::size_t> host_reserve_{0};
  std::atomic<bool> pin_ahead_{false};
  std::atomic<std::uint32_t> pin_ahead_idle_ms_{0};
  std::atomic<HostMemoryProbe> memory_probe_;
  std::unique_ptr<Pinner> pinner_;  // the spill target's (null for the `host` kind)
  std::atomic<int> allocating_{
      0};                     // do_allocate calls in progress that began with migrate = "auto"
  mutable std::mutex mutex_;  // allocs_, the devices' init and peers, migration
  std::map<DevPtr, Allocation> allocs_;
  std::uint64_t next_seq_ = 0;  // under mutex_
  PerDevice<DeviceState> devices_;
};

// The largest piece a migration moves at once: device parts of a range are mapped in pieces of at
// most this size, so demotion frees room in steps of it and one move stays short (move_bench).
inline constexpr std::size_t kMovePiece = std::size_t{64} << 20;
// The largest piece of whole chunks that one move takes (one chunk where a chunk exceeds kMovePiece).
inline constexpr std::size_t move_piece(std::size_t chunk) {
  return chunk >= kMovePiece ? chunk : kMovePiece - kMovePiece % chunk;
}

}  // namespace host_detail
}  // namespace allocshim
