// Device budgets (oversubscription, docs/oversubscription.md): how many device bytes the shim may
// back per device, what it counts against them, and the accounting of the spill target that serves
// what does not fit.
//
// What counts ("backed" bytes of a device), read without locks from counters that exist anyway:
//   - native-kind backends: their live bytes (cuMemAlloc, pitch, and whatever else they serve);
//   - pooling backends (async_pool, vmm): what they hold from the driver, live and cached (the
//     `reserved` they report in their statistics), never less than their live bytes;
//   - the program's own cuMemCreate with a device location (the core's created_stats_);
//   - the device chunks of the spill target (claimed here, see claim());
//   - requests admitted but not yet visible in the counters above (pending), so two threads
//     admitted at once cannot both take the last room.
// host- and managed-kind backends hold no device memory of their own and are not counted (managed
// pages the driver migrates are the driver's to evict).
//
// The allocation path asks admit() only while a budget exists (one predicted branch otherwise). An
// admission is one relaxed fetch_add on `pending` plus one relaxed load per backend; no lock. Only a
// request that does not fit takes the slow path: the pools' caches are trimmed for this device and
// the request is looked at again, then the core routes it to the spill target (or fails it as
// native would). The estimate for a request is its size rounded up to kBudgetUnit (2 MiB, the VMM
// granularity), plus one unit for pooling backends (a block that starts inside a chunk spans one
// chunk more): what a backend may have to grow by to serve it. Near the limit a request may thus
// spill although it would just have fitted; the limit itself is never passed by admitted requests.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/backend.h"
#include "base/driver.h"
#include "placement/migration.h"
#include "node/node_budget.h"
#include "base/stats.h"
#include "placement/turn.h"
#include "base/types.h"
#include "policy/policy.h"

namespace allocshim {

inline constexpr std::size_t kBudgetUnit = std::size_t{2} << 20;

// Where the budget reads what is backed: the core's fixed backend table and its record of the
// program's own cuMemCreate. The table never moves and its entries are never destroyed while the
// core lives, so reading it without a lock is safe.
struct BudgetSources {
  std::unique_ptr<Backend>* backends = nullptr;
  const std::atomic<std::size_t>* count = nullptr;
  const BackendStats* created = nullptr;
};

class Budget {
 public:
  using Spill = policy::Budget::Spill;
  using Migrate = policy::Budget::Migrate;

  Budget(const Driver& driver, BudgetSources sources);
  Budget(const Budget&) = delete;
  Budget& operator=(const Budget&) = delete;

  // Takes the budget of a (new) policy; limits are resolved per device on first use, against the
  // device's total memory. `spill` is the backend past-budget requests go to (null: none).
  void configure(const policy::Budget& budget, Backend* spill);
  // Whether some device may have a limit (the core's branch on the hot path).
  bool active() const { return active_.load(std::memory_order_relaxed); }
  Spill spill() const { return spill_kind_.load(std::memory_order_relaxed); }
  // The [budget] migrate mode in effect: the policy's where the spill target's memory can move (a
  // budget, spill = "host"), else off. promote: spilled memory moves back to the device at safe
  // points; auto: device memory of the spill target is also demoted to make room.
  Migrate migrate() const { return migrate_.load(std::memory_order_relaxed); }
  // Bytes of pinned host pieces the spill target keeps per device after promotions, for later
  // demotions ([backends.host] host_reserve, read from the spill target; 0 where nothing moves).
  std::uint64_t host_reserve() const;
  // How much of the host pieces promotions free on `device` the spill target keeps: host_reserve,
  // and with one, under a shared budget, every piece freed while a phase takes the room over: it
  // gives that room back at the next turn change, where pinning the pieces anew would stall both
  // processes' moves. (The spill target also keeps up to the demotion it expects.)
  std::uint64_t reserve_bound(int device) const;
  // Whether a request of `bytes` through `api`, which a backend of `kind` would serve, goes to the
  // spill target under migrate = "auto" whether it fits or not, so that its device memory can be
  // demoted later (docs/oversubscription.md, "What can move").
  bool migratable(int device, std::size_t bytes, BackendKind kind, Api api);

  // The limit of `device` in bytes; policy::kUnlimited when it has none.
  std::uint64_t limit(int device);

  // Admission of a request of `bytes` that a backend of `kind` would serve through `api`.
  // True: it fits (or is not counted); finish(ticket) once the backend returned. False: it does not
  // fit even after the pools' caches were trimmed (nothing to finish).
  struct Ticket {
    int device = 0;
    std::uint64_t bytes = 0;
  };
  bool admit(int device, std::size_t bytes, BackendKind kind, Api api, Ticket* ticket);
  void finish(const Ticket& ticket) {
    if (ticket.bytes != 0)
      at(ticket.device).pending.fetch_sub(ticket.bytes, std::memory_order_relaxed);
  }
  // The program's own cuMemCreate of `bytes` on `device`: true if it fits (after trimming caches).
  bool admit_create(int device, std::size_t bytes);

  // Device bytes counted against the budget now, and of them the pools' cached (free) bytes.
  std::uint64_t backed(int device) const;
  std::uint64_t cached(int device) const;
  // Room left under the limit (0 when at or over it; kUnlimited without a limit).
  std::uint64_t headroom(int device);
  // cuMemGetInfo under a budget: total = the limit (never above the device's), free = what is left
  // of it, cached pool memory counted as free (it is given back when needed), never above what the
  // driver reports free. No change for a device without a limit.
  void report(int device, std::size_t* free, std::size_t* total);

  // The spill target's device chunks: claims up to `want` bytes (a multiple of `unit`) of the room
  // left under the limit, and returns what it got; unclaim gives them back. Under a shared budget,
  // what the claim is for says how it treats the other processes:
  enum class Claim : std::uint8_t {
    allocation,  // a new allocation: the lease grows from free room, others are asked for the rest
    quiet,       // the same without asking (the caller asks, and waits, with `waiting` later)
    waiting,     // asks others once and waits while they give the room (NodeBudget::grow)
                 // (never under the spill target's lock: what it gets makes a demotion expected)
    promotion,   // moving spilled memory back: asks nobody (at_safe_point asked once for all of
                 // it), and never grows the lease while this process holds off after giving room
                 // away (NodeBudget::holding), so the room stays given
  };
  std::size_t claim(int device, std::size_t want, std::size_t unit, Claim why = Claim::allocation);
  // The device part of a new allocation of the spill target, claimed before the core asks the
  // spill target for it: up to `bytes` (its range) in `unit`s. With migrate = "auto", other
  // processes sharing the budget are asked once for what is missing and get share_wait_ms to give
  // it (as an admission waits for them: a process idle at its safe points holds colder memory than
  // this one's newest), then this process's own memory is demoted for the rest.
  std::size_t claim_new(int device, std::size_t bytes, std::size_t unit);
  void unclaim(int device, std::size_t bytes) {
    at(device).spill_device.fetch_sub(bytes, std::memory_order_relaxed);
  }

  // Counters for the exit summary and the stats file.
  void on_spilled(int device, std::size_t host_bytes) {
    at(device).spilled_allocs.fetch_add(1, std::memory_order_relaxed);
    at(device).spilled_bytes.fetch_add(host_bytes, std::memory_order_relaxed);
  }
  void on_refused(int device) { at(device).refused.fetch_add(1, std::memory_order_relaxed); }
  // The host reserve of `device` now holds `bytes`; a run of host pieces took `hits` of them from
  // it and pinned `misses` anew.
  void on_reserve_bytes(int device, std::uint64_t bytes);
  void on_reserve_use(int device, std::uint64_t bytes, std::uint64_t hits, std::uint64_t misses);
  // Host pieces pinned ahead of demotions on `device` (pin_ahead): the spill target holds `bytes`
  // of them now; `pinned` were made, `used` taken by demotions, `returned` given back unused.
  void on_ahead(int device, std::uint64_t bytes, std::uint64_t pinned, std::uint64_t used,
                std::uint64_t returned);
  struct DeviceReport {
    std::uint64_t limit, peak_backed, spilled_allocs, spilled_bytes, refused;
    std::uint64_t promoted_bytes, promotions, demoted_bytes, demotions;  // moves of pieces
    std::uint64_t migrate_ns;     // time spent moving pieces (copy and remap)
    std::uint64_t move_failures;  // moves the driver refused (the piece stayed where it was)
    std::uint64_t shim_syncs;     // synchronizations the shim made to reach a safe point
    std::uint64_t skipped_busy;   // stream/event safe points skipped: another stream had work
    std::uint64_t reserve_bytes, reserve_peak;   // the host reserve: now, and at most
    std::uint64_t reserve_hits, reserve_misses;  // host pieces taken from it, and pinned anew
    std::uint64_t ahead_bytes, ahead_peak;  // host pieces pinned ahead and held: now, and at most
    std::uint64_t ahead_pinned, ahead_used, ahead_returned;  // such pieces made, taken, given back
  };
  DeviceReport device_report(int device) const;

  // After a synchronous free (a safe point: the program expects it to wait). Under a shared
  // budget returns unused lease; then runs the safe point if it has anything to do.
  void after_free(int device);
  // Whether synchronous frees must call after_free.
  bool watches_frees() const { return migrate() != Migrate::off || node_.active(); }

  // What moves and when (placement/migration.h): the launch gate, what submissions use, the decisions.
  Migration& migration() { return migration_; }
  const Migration& migration() const { return migration_; }

  // Whether a busy phase of `device` is under way (the program waits for the device at its
  // synchronizations) under a shared budget: the spill target pins for expected demotions only then.
  bool computing(int device) const { return at(device).turn.computing(); }
  // Whether the busy phase of `device` asked other processes for room (it swaps none of its own,
  // and pins nothing ahead while some of its memory is still on the host).
  bool receiving(int device) const { return node_.active() && at(device).turn.asked(); }
  // Bytes this process expects to demote for other processes on `device` once it is idle
  // (expect_demotion); the spill target pins their host pieces while the process computes and
  // none of its own memory waits on the host for room (receiving).
  std::uint64_t expected_demotion(int device) const { return at(device).turn.expected(); }
  // The spill target forgets the expectation it read as `seen`: it lapsed (the process idled
  // pin_ahead_idle_ms unasked) or its pieces went back. One set since then stays.
  void forget_demotion(int device, std::uint64_t seen) { at(device).turn.forget_expected(seen); }

  // The budget shared with other processes ([budget] share, node/node_budget.h).
  const NodeBudget& node() const { return node_; }
  // At exit: leaves the shared region.
  void leave_node() { node_.leave(); }

  // Migration (docs/oversubscription.md, "Migration"). Every call below runs at a safe point: the
  // caller knows `device` idle for the memory that may move (a synchronization the program made, or
  // one the shim made and counted).
  //
  // Moves up to about `bytes` of this process's coldest device-backed memory on `device` (device
  // pieces of the spill target, oldest allocation first) to host memory at the same addresses;
  // returns the bytes moved (whole pieces: may exceed `bytes` by less than one piece).
  std::uint64_t demote(int device, std::uint64_t bytes, std::uint64_t newcomer = 0);
  // Counts a safe point on `device` (-1: every device used) where the program waited `waited_ns`
  // in the turn (a wait that was not busy ends the busy phase), and returns whether it has anything
  // to do: another process asking for room, or spilled memory to promote with room for it (or,
  // where the program waited kBusyWaitNs or more, with room to ask for). A few relaxed loads and,
  // once per busy phase, a few stores.
  bool note_safe_point(int device, std::uint64_t waited_ns = 0);
  // At a safe point on `device` (-1: every device) where the program's own call waited `waited_ns`:
  // answers other processes' requests for room (serve_requests); if there were none, at a busy
  // safe point of a shared budget short of room asks the other members for it (ask_for_room),
  // then lets migration move what it decides (Migration::at_safe_point) within the room the
  // budget gives, or, in a phase taking the room over, waits for the room (take_over).
  void at_safe_point(int device, std::uint64_t waited_ns = 0);
  // Before a kernel launch that names the host-resident allocations `wanted` of `device` (and
  // `named` in all), outside the launch gate: under a shared budget, a phase expected long takes
  // the room over (ask_for_room, take_over); otherwise promotion ahead (Migration::promote_ahead)
  // with the room promotion may take now. Returns the bytes promoted.
  std::uint64_t promote_ahead(int device, const std::vector<DevPtr>& wanted,
                              const std::vector<DevPtr>& named);
  // Gives other processes sharing the budget the room they asked of `device` (-1: every device):
  // lease not backed, then the pools' cached memory, then with migrate = "auto" demoted device
  // memory. Returns whether anything was asked. Only at a safe point (`busy`: see at_safe_point).
  bool serve_requests(int device, bool busy = false);
  // The shim's own safe point while allocating `newcomer` bytes under migrate = "auto":
  // synchronizes the context (counted) and demotes at least `bytes` of what is less dense than the
  // newcomer (Migration::demote) if it can; returns the bytes demoted.
  std::uint64_t make_room(int device, std::uint64_t bytes, std::uint64_t newcomer);
  // When memory moves is migration's decision (placement/migration.h); its bounds, as the budget uses them.
  static constexpr std::uint64_t kPromotePerPoint = Migration::kPromotePerPoint;
  static constexpr std::uint64_t kBusyWaitNs = Migration::kBusyWaitNs;
  // What a demotion for another process moves before giving that much lease back.
  static constexpr std::uint64_t kDemoteStep = std::uint64_t{256} << 20;

  // Sleep (core/sleep.h; budget_sleep.cpp). While asleep the spill target claims no device memory:
  // promotions move nothing back and what it serves stays on the host, so the room sleep gave back
  // stays given. The region shows it (allocshim top).
  void set_asleep(bool on);
  // Only what views show (a process dozing: its memory moved out, its claims still allowed).
  void show_asleep(bool on) { node_.set_asleep(on); }
  bool asleep() const { return asleep_.load(std::memory_order_relaxed); }
  // Whether this process resolved the limit of `device` (it used the device under the budget).
  bool resolved(int device) const {
    return at(device).limit.load(std::memory_order_relaxed) != kUnresolved;
  }
  // Bytes of the spill target's memory of `device` on the host now.
  std::uint64_t host_bytes(int device) const;
  // Moves every device piece of the spill target on `device` to the host (after the context's
  // queued work) and gives the shared budget back every leased byte not backed. Returns the bytes
  // moved.
  std::uint64_t empty_device(int device);
  // Brings the spill target's host pieces of `device` back: asks the other members of a shared
  // budget for the room and waits for it (share_wait_ms after the last that came), then promotes
  // into the room there is. Returns the bytes moved.
  std::uint64_t refill(int device);

  // Counters of the migration path (its ledger reports each move).
  void on_moved(int device, DevPtr at, std::size_t bytes, bool to_device, std::uint64_t ns);
  void on_move_failed(int device, Result r);
  void on_shim_sync(int device) { at(device).shim_syncs.fetch_add(1, std::memory_order_relaxed); }
  void on_skipped_busy(int device) {
    at(device).skipped_busy.fetch_add(1, std::memory_order_relaxed);
  }

  // The exit summary's budget lines ("" without a budget); the stats file reads device_report().
  std::string summary() const;
  // How long a giver waits for the takers' host pieces before a demotion step pins its own
  // (kPieceWaitMs): tests on the fake driver, whose moves are memcpy on a loaded machine, wait longer.
  void set_piece_wait_ms(int ms) { piece_wait_ms_.store(ms, std::memory_order_relaxed); }

 private:
  static constexpr std::uint64_t kUnresolved = ~std::uint64_t{0} - 1;

  struct alignas(64) Device {
    std::atomic<std::uint64_t> limit{kUnresolved};
    std::atomic<std::uint64_t> pending{0};       // admitted, not yet in the backends' counters
    std::atomic<std::uint64_t> spill_device{0};  // device chunks the spill target holds
    std::atomic<std::uint64_t> peak_backed{0};
    std::atomic<std::uint64_t> spilled_allocs{0}, spilled_bytes{0}, refused{0};
    std::atomic<std::uint64_t> promoted_bytes{0}, promotions{0}, demoted_bytes{0}, demotions{0};
    std::atomic<std::uint64_t> migrate_ns{0}, move_failures{0}, shim_syncs{0}, skipped_busy{0};
    std::atomic<std::uint64_t> reserve_bytes{0}, reserve_peak{0}, reserve_hits{0},
        reserve_misses{0};
    std::atomic<std::uint64_t> ahead_bytes{0}, ahead_peak{0}, ahead_pinned{0}, ahead_used{0},
        ahead_returned{0};
    // This process's turns with the other members of a shared budget (placement/turn.h).
    Turn turn;
  };
  Device& at(int device) { return devices_[index(device)]; }
  const Device& at(int device) const { return devices_[index(device)]; }
  static std::size_t index(int device) {
    return device >= 0 && static_cast<std::size_t>(device) < kMaxDevices
               ? static_cast<std::size_t>(device)
               : 0;
  }
  std::uint64_t resolve(int device);
  // Gives the pools' cached memory of `device` back to the driver; true if there was any.
  bool trim_caches(int device);
  // Fits `extra` more bytes under `limit` now (pending already counted): true if they fit, noting
  // the peak. Under a shared budget they must also fit in this process's lease, grown from the node
  // if needed (waiting for other processes with `wait`).
  bool fit(int device, std::uint64_t limit, std::uint64_t extra, bool wait = false);
  // Room promotion may take on `device`: the headroom, but while this process holds off after
  // giving room to another one, only what its own lease leaves.
  std::uint64_t promotion_room(int device);
  // At a busy safe point under a shared budget, with `spilled` bytes on the host, where the program
  // waited `waited_ns`: asks the other members for the room promotion lacks, without waiting for
  // it. A busy phase (it ends at a safe point that is not busy) asks at its first safe point for
  // one safe point's promotion. A long phase (Turn::long_phase) takes the room over (take_over):
  // it asks for everything spilled, again after each Turn::kAskEveryWaitNs it waits while some is
  // missing, and its busy safe points wait for the room and promote it.
  void ask_for_room(int device, std::uint64_t spilled, std::uint64_t waited_ns);
  // Promotion at a safe point: at most `bound`, into the room the budget gives (the pools' cached
  // memory counted), then with `swaps` a rebalance (Migration::at_safe_point). Returns the bytes.
  std::uint64_t promote_at_point(int device, std::uint64_t bound, bool swaps);
  // A phase taking the room over (it asked for everything spilled): promotes what the others give
  // as it arrives, waiting for it while it comes, until nothing is spilled, share_wait_ms passes
  // with nothing arriving (the phase stalls), or moving it all at the hand-over rate would have
  // been done (Turn::long_phase_ns). Returns the bytes promoted.
  std::uint64_t take_over(int device);
  // After a phase taking the room over promoted `got` bytes, however it promoted them: once
  // nothing is spilled any more, the room others gave is expected back at their turn
  // (expect_demotion), so that its host pieces are pinned while this process computes.
  void after_taking(int device, std::uint64_t got);
  // Host pieces passed between members (node_pieces.h; budget_pieces.cpp). The taker sends the
  // givers of `device` what of its host reserve they say their demotions lack (each take-over
  // loop, so pieces its promotions just freed go at once).
  void offer_pieces(int device);
  // The giver, answering a request: demotes `want` bytes in steps of kDemoteStep, each after
  // taking the host pieces the takers sent for it (the first step, and any whose pieces do not
  // come within kPieceWaitMs, pins its own). Returns whether anything moved.
  bool demote_for_others(int device, std::uint64_t want, std::uint64_t before);
  // How long a giver waits for a step's pieces: about what a taker's promotion of one step and
  // the export of its pieces take, a fraction of what pinning a step costs ("What a move costs").
  static constexpr int kPieceWaitMs = 50;
  // Sets the bytes of `device` this process expects to demote for other processes once it is idle
  // (0: none any more): requests it did not meet while busy, room it took over or waited for. The
  // spill target pins their host pieces meanwhile (Movable::expect_demotion).
  void expect_demotion(int device, std::uint64_t bytes);

  const Driver& driver_;
  BudgetSources sources_;
  std::mutex
      mutex_;  // configure and resolve (slow paths); never held while joining a shared budget
  std::uint64_t configured_ = 0;  // under mutex_: configure calls, so resolve sees one it raced
  policy::Budget config_;
  std::atomic<bool> active_{false};
  std::atomic<Migrate> migrate_{Migrate::off};
  std::atomic<bool> asleep_{false};
  std::atomic<int> piece_wait_ms_{kPieceWaitMs};
  std::atomic<Spill> spill_kind_{Spill::none};
  std::atomic<Backend*> spill_{nullptr};
  std::array<Device, kMaxDevices> devices_{};
  NodeBudget node_{driver_};
  // What migration's moves take and give back, and their counters.
  struct Ledger final : MoveLedger {
    explicit Ledger(Budget& b) : budget(b) {}
    std::size_t claim_promotion(int device, std::size_t bytes) override {
      return budget.claim(device, bytes, bytes, Claim::promotion);
    }
    void release_device(int device, std::size_t bytes) override { budget.unclaim(device, bytes); }
    void on_moved(int device, DevPtr at, std::size_t bytes, bool to_device,
                  std::uint64_t ns) override {
      budget.on_moved(device, at, bytes, to_device, ns);
    }
    void on_move_failed(int device, Result r) override { budget.on_move_failed(device, r); }
    Budget& budget;
  };
  Ledger ledger_{*this};
  Migration migration_{driver_, ledger_};
  // The spill target's movable memory (null: none, or not promoting).
  Movable* movable() const;
};

// The budget's spill target (host: split device/host chunks in one range; managed: managed memory
// preferring the host), built by the core when a policy's spill is not "none". Defined with the
// backends (backends/factory.cpp): the core knows them only through these functions.
std::unique_ptr<Backend> make_spill_backend(Budget::Spill spill, const Driver& driver,
                                            Budget& budget, std::string& error);
// Gives the spill target its settings ([backends.host]: the host side of its moves) under the
// migrate mode in effect; at each install, so that a reload changes them.
void configure_spill(Backend& spill, const policy::BackendSpec& host_side, Budget::Migrate mode);
// Lets a backend the policy names read the budget (managed: stripe = "auto").
void attach_budget(Backend& backend, Budget& budget);

}  // namespace allocshim
