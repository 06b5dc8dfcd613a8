// One budget per GPU shared by the processes of a user, a group or the whole node
// ([budget] share, docs/oversubscription.md). The shared state is a Region (node_region.h); this is
// one process's side of it: its lease of each device's budget, the requests it makes of others
// and answers, and its counters.
//
// Leases keep the allocation path lock-free: a process takes room from the node in units of
// kLeaseUnit and admits allocations against its own lease with one relaxed load. Only an
// allocation that the lease does not cover goes to the region (grow). When the node has no
// room left, grow asks the members holding leases to give room back (a bit and a byte count in
// their slot) and, for allocations, waits for them to do it, until [budget] share_wait_ms passes
// with no room arriving (not at all once they ask this process for room too), before the request
// spills (or fails, with spill = "none"); it holds no lock while it waits. A member answers at its
// next safe point (Budget::serve_requests): it gives back its lease's slack, trims its pool
// caches, then, at a safe point where it is idle, demotes device memory; one that never reaches a
// safe point delays others by share_wait_ms at most. Busy safe points (Budget::at_safe_point) ask
// others for room to promote.
//
// The region is another process's writing as much as this one's: a region lock that is not
// released, or a file that turns out damaged, is said once on stderr, and the process then keeps
// the lease it has and takes no more (past it, allocations spill or are refused); it never trusts
// a limit above its own policy's.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/driver.h"
#include "node/node_pieces.h"
#include "node/node_region.h"
#include "base/types.h"
#include "policy/policy.h"

namespace allocshim {

// Room is leased from the node in these units (one mutex round per 64 MiB of growth).
inline constexpr std::uint64_t kLeaseUnit = std::uint64_t{64} << 20;
// `bytes` rounded up to whole lease units.
inline constexpr std::uint64_t round_to_lease(std::uint64_t bytes) {
  return (bytes + kLeaseUnit - 1) / kLeaseUnit * kLeaseUnit;
}

class NodeBudget {
 public:
  using Share = policy::Budget::Share;

  explicit NodeBudget(const Driver& driver);
  ~NodeBudget();
  NodeBudget(const NodeBudget&) = delete;
  NodeBudget& operator=(const NodeBudget&) = delete;

  // Takes a policy's sharing; a change of region leaves the old one (a policy reload resolves
  // every device's limit again, which joins the new one).
  void configure(Share share, std::uint32_t wait_ms);
  bool active() const { return active_.load(std::memory_order_relaxed); }
  // [budget] share_wait_ms: how long a process waits for others to give room (Budget::take_over
  // waits that long for each next piece).
  std::uint32_t wait_ms() const { return wait_ms_.load(std::memory_order_relaxed); }

  // Joins the region if needed and attaches `device`: returns the limit in force there (`mine` if
  // this process is the device's first member, else the first member's if smaller). When the
  // region cannot be joined the process keeps a budget of its own (`mine`), said once.
  std::uint64_t attach(int device, std::uint64_t mine);

  // Whether this process's lease covers `bytes` backed on `device` (true when not shared).
  bool covers(int device, std::uint64_t bytes) const {
    const Local& l = at(device);
    return l.entry.load(std::memory_order_relaxed) < 0 ||
           bytes <= l.lease.load(std::memory_order_relaxed);
  }
  // Grows the lease towards `bytes` (rounded up to a unit) with what the node has left, asks the
  // other members for the rest (with `ask`), and with `wait` waits for them while room arrives, up
  // to share_wait_ms after the last. Returns the lease after (>= bytes: covered).
  std::uint64_t grow(int device, std::uint64_t bytes, bool wait, bool ask = true);
  // Gives back the lease above `backed` rounded up to a unit once that slack reaches `keep`
  // (0 at a request of another member: everything not backed).
  void settle(int device, std::uint64_t backed, std::uint64_t keep = 2 * kLeaseUnit);
  // The room the node leaves this process on `device`: the limit less the other members' leases
  // (~0 when not shared).
  std::uint64_t room(int device) const;
  std::uint64_t lease(int device) const { return at(device).lease.load(std::memory_order_relaxed); }

  // Requests of other members (safe points and frees): an in-process copy of this process's
  // request bits, read from the region at most every kPollNs (never a pointer into the region).
  bool asked() const {
    if (__builtin_expect(!polling_.load(std::memory_order_relaxed), 1)) return false;
    if (clock::ticks() >= next_poll_.load(std::memory_order_relaxed)) poll();
    return asked_bits_.load(std::memory_order_relaxed) != 0;
  }
  static constexpr std::uint64_t kPollNs = 1000000;
  // Takes the bytes asked of `device` (0 if none) and clears the request. Another process wrote
  // the number: the caller bounds it by what this process holds.
  std::uint64_t take_request(int device);
  // This process gave `bytes` of `device` to others; `demoted`: some of it by moving its memory
  // to the host (which starts a hold).
  void on_given(int device, std::uint64_t bytes, bool demoted);
  // Whether this process demoted memory of `device` for another one less than kYieldHoldMs ago and
  // has not been busy since (on_busy): then moving its own memory back (the spill target's claims)
  // uses free room only and asks nobody, so that the room stays given while the process idles.
  bool holding(int device) const;
  // At a busy safe point (the program waited for the device): the hold is over, the process takes
  // its turn (Budget::at_safe_point).
  void on_busy(int device);
  static constexpr std::uint64_t kYieldHoldMs = 1000;

  // Host pieces passed between members (node_pieces.h), taker side: connects to the members the
  // last ask on `device` went to; offers them the host pieces `give` hands out, as much as each
  // says its demotion lacks (returns the bytes sent); ends the connections once the take-over ends.
  void connect_givers(int device);
  std::uint64_t offer_pieces(int device, const node::PieceChannel::Give& give);
  void end_offers(int device);
  bool offering(int device) const { return at(device).offering.load(std::memory_order_relaxed); }
  // Giver side: tells the takers of `device` that its demotion lacks `lack` bytes of host pieces
  // and hands what they sent to `take`, waiting up to `wait_ms` for some if none came.
  std::size_t receive_pieces(int device, std::uint64_t lack, int wait_ms,
                             const node::PieceChannel::Take& take);

  // Where the usage this process publishes for views (allocshim top) comes from: called from
  // poll(), at most every node::kPublishNs, for each device attached. Set once, before joining.
  using UsageSource = std::function<node::Usage(int device)>;
  void set_usage_source(UsageSource source) { usage_source_ = std::move(source); }
  // Whether this process sleeps (core/sleep.h), shown to views from the next poll() on.
  void set_asleep(bool on);
  // Reads the region now if a poll is due (what asked() does): the thread of the control socket
  // calls it, so that an idle process still answers and its views stay current.
  void refresh() const { (void)asked(); }

  // At exit: leaves the region (the file goes when the last member leaves); later calls act as
  // if nothing were shared.
  void leave();
  // In a forked child: forgets the parent's membership without touching it.
  void forget_after_fork();

  // The exit summary's lines ("" when nothing is shared) and what the stats file's "node" member
  // shows: whether shared (share != process), how, and per device this process's side of it.
  std::string summary() const;
  bool shared() const { return share_ != Share::process; }
  const char* share_name() const;
  bool joined() const { return join_error_.empty(); }
  std::uint64_t reclaimed_processes() const {
    return reclaimed_processes_.load(std::memory_order_relaxed);
  }
  std::uint64_t reclaimed_bytes() const { return reclaimed_bytes_.load(std::memory_order_relaxed); }
  // Region operations that found its lock held past their wait, or the file damaged.
  std::uint64_t lock_timeouts() const { return lock_timeouts_.load(std::memory_order_relaxed); }
  std::uint64_t damaged() const { return damaged_.load(std::memory_order_relaxed); }
  struct DeviceReport {
    int device;
    std::uint64_t lease, peak_lease, grows, asks, waits, wait_ns, timeouts, requests, given_bytes;
    std::uint64_t pieces_sent, pieces_received;  // bytes of host pieces passed to and from others
  };
  // Devices this process leased or was asked about.
  std::vector<DeviceReport> device_reports() const;

 private:
  struct alignas(64) Local {
    std::atomic<int> entry{-1};  // -1: not shared (or not attached yet)
    std::atomic<std::uint64_t> lease{0};
    std::atomic<std::uint64_t> cap{
        0};  // the limit in force: the shared one, never above this policy's
    std::atomic<std::uint64_t> peak_lease{0}, grows{0}, asks{0}, waits{0}, wait_ns{0}, timeouts{0};
    std::atomic<std::uint64_t> requests{0}, given{0};
    std::atomic<std::uint64_t> pieces_sent{0},
        pieces_received{0};  // bytes of host pieces passed (node_pieces.h)
    std::atomic<std::uint64_t> yielded_ticks{
        0};                             // clock::ticks() of the last demotion for others (0: none)
    std::atomic<bool> offering{false};  // connected to givers about this device (connect_givers)
    // The pids of the members the last ask went to (under mutex_).
    std::array<std::int32_t, node::Region::Grow::kAskedPids> asked_pids{};
    std::array<std::uint64_t, node::Region::Grow::kAskedPids> asked_channels{};
    std::size_t asked = 0;
  };
  Local& at(int device) { return local_[index(device)]; }
  const Local& at(int device) const { return local_[index(device)]; }
  static std::size_t index(int device) {
    return device >= 0 && static_cast<std::size_t>(device) < kMaxDevices
               ? static_cast<std::size_t>(device)
               : 0;
  }
  // Under join_mutex_: joins the region if this process has not (the wait for the region lock
  // holds no lock frees, cuMemGetInfo or safe points need). False: not shared.
  bool join();
  void set_lease(Local& l, std::uint64_t bytes);
  void poll() const;
  void forget_region();
  // Runs `op` (a region operation that tries the region lock once) under mutex_, again until the
  // lock is had or `patient`'s wait is over; mutex_ is not held between tries.
  template <class Op>
  node::Status with_region(bool patient, Op op) const {
    return with_region(
        patient, [](void* o) { return (*static_cast<Op*>(o))(); }, &op);
  }
  node::Status with_region(bool patient, node::Status (*op)(void*), void* ctx) const;
  void count_dead() const;

  const Driver& driver_;
  mutable std::mutex mutex_;      // every slow path; never held while waiting
  std::mutex join_mutex_;         // one join at a time; held while a join waits for the region lock
  std::uint64_t generation_ = 0;  // under mutex_: counts changes of share_ and the leave at exit
  mutable node::Region region_;
  node::PieceChannel pieces_;  // listening while joined
  // The region a join is opening, not yet region_: a child forked meanwhile closes it too.
  std::atomic<node::Region*> joining_{nullptr};
  std::atomic<bool> active_{false};
  Share share_ = Share::process;
  std::atomic<std::uint32_t> wait_ms_{0};
  bool closed_ = false;     // left at exit: nothing is shared any more
  std::string join_error_;  // why the region could not be joined (said once)
  std::string path_;        // the region last joined (the summary names it after leaving too)
  std::atomic<bool> polling_{false};  // joined: asked() reads the region
  mutable std::atomic<std::uint64_t> asked_bits_{0}, next_poll_{0};
  UsageSource usage_source_;
  mutable std::uint64_t next_publish_ns_ = 0;  // under mutex_
  std::atomic<bool> asleep_{false};
  std::uint64_t poll_ticks_ = 0;
  mutable std::atomic<bool> stuck_{false};  // the lock was not released lately: try once only
  mutable std::atomic<bool> said_stuck_{false}, said_damaged_{false};
  mutable std::atomic<std::uint64_t> lock_timeouts_{0}, damaged_{0};
  mutable std::atomic<std::uint64_t> reclaimed_processes_{0}, reclaimed_bytes_{0};
  std::array<Local, kMaxDevices> local_{};
};

}  // namespace allocshim
