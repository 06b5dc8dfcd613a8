// Who decides what moves, and when (docs/oversubscription.md, "Migration"). The budget (core/
// budget.h) asks this module at its safe points and when an allocation needs room; the spill
// target's mechanism (core/movable.h) does the moving. Every move batch runs with the launch gate
// closed, so no submission of any thread can touch a piece while it moves.
//
// The decisions, all from what submissions said (core/use_tracker.h):
//   - Demotion (room for a new allocation, or for another process): the least recently used
//     allocations first, then the least often used, then the oldest.
//   - Promotion into free room: the most recently used first.
//   - Rebalancing at a safe point (migrate = "auto"): an allocation on the host that submissions
//     used in the current or previous epoch takes the place of device-resident ones that nothing
//     used for `cold_epochs`. Everything a cycle touches (a training step) is never cold, so such a
//     program keeps a stable split instead of moving the same bytes every step.
//   - Hysteresis: when something a rebalance demoted is used again within cold_epochs, the swap was
//     a mistake (a regret); cold_epochs doubles, up to kMaxColdEpochs, so a program whose cycle is
//     longer than the threshold stops being rebalanced instead of thrashing.
//   - Epochs advance at safe points, at most one per kEpochNs, so a program that synchronizes
//     after every kernel does not age its data in microseconds.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/driver.h"
#include "core/launch_gate.h"
#include "core/movable.h"
#include "core/use_tracker.h"

namespace allocshim {

// Set while some core may move memory: the hook layer sends submissions through the gate only then
// (one relaxed load per submission otherwise).
extern std::atomic<bool> g_submissions_watched;
inline bool submissions_watched() { return g_submissions_watched.load(std::memory_order_relaxed); }

class Migration {
 public:
  explicit Migration(const Driver& driver) : uses_(driver, gate_) {}
  Migration(const Migration&) = delete;
  Migration& operator=(const Migration&) = delete;

  // The spill target whose memory moves (null: nothing moves) and whether rebalancing is on.
  void configure(Movable* target, bool rebalance);
  bool active() const { return target_.load(std::memory_order_acquire) != nullptr; }

  LaunchGate& gate() { return gate_; }
  UseTracker& uses() { return uses_; }
  const UseTracker& uses() const { return uses_; }

  // At a safe point (a synchronization the program made): the epoch may advance.
  void on_safe_point();

  // The decisions; each runs the mechanism with the gate closed and returns the bytes moved.
  std::size_t demote(int device, std::size_t want_bytes);
  std::size_t promote(int device, std::size_t max_bytes);
  // Swaps recently used host-resident allocations with cold device-resident ones, at most
  // `max_bytes` promoted; `room` is what the budget lets promotion take now.
  std::size_t rebalance(int device, std::size_t max_bytes, std::uint64_t room);

  struct Counts {
    std::uint64_t epoch = 0, cold_epochs = 0;
    std::uint64_t rebalances = 0, rebalance_bytes = 0, regrets = 0;
    std::uint64_t gate_timeouts = 0;  // moves skipped: a submission stayed inside the gate
    LaunchGate::Counts gate;
    UseTracker::Counts uses;
  };
  Counts counts() const;
  // The exit summary's line ("" when nothing was tracked).
  std::string summary() const;

  static constexpr std::uint64_t kEpochNs = 10'000'000;
  static constexpr std::uint64_t kColdEpochs = 2;
  static constexpr std::uint64_t kMaxColdEpochs = 64;
  // A rebalance alternates demotion and promotion in steps of this size.
  static constexpr std::size_t kRebalanceStep = std::size_t{256} << 20;
  // How long a move waits for submissions inside the gate before it gives up: long enough for any
  // launch, short enough that an allocation waiting for room is not held by a long synchronous copy.
  static constexpr std::uint64_t kCloseTimeoutNs = 50'000'000;
  // Tests advance epochs at every safe point, or wait longer for the gate.
  void set_epoch_ns(std::uint64_t ns) { epoch_ns_.store(ns, std::memory_order_relaxed); }
  void set_close_timeout_ns(std::uint64_t ns) { close_timeout_ns_.store(ns, std::memory_order_relaxed); }

 private:
  // The movable allocations of `device`, in the order a decision wants.
  std::vector<MovableAllocation> list(int device) const;
  static std::vector<DevPtr> bases(const std::vector<MovableAllocation>& v);
  void note_regrets();

  LaunchGate gate_;
  UseTracker uses_;
  std::atomic<Movable*> target_{nullptr};
  std::atomic<bool> rebalance_{false};
  std::atomic<std::uint64_t> epoch_ns_{kEpochNs};
  std::atomic<std::uint64_t> close_timeout_ns_{kCloseTimeoutNs};
  std::atomic<std::uint64_t> last_epoch_at_{0};
  std::atomic<std::uint64_t> cold_epochs_{kColdEpochs};
  std::atomic<std::uint64_t> rebalances_{0}, rebalance_bytes_{0}, regrets_seen_{0}, gate_timeouts_{0};
};

}  // namespace allocshim
