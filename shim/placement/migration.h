// Who decides what moves, and when (docs/oversubscription.md, "Migration"). The budget (core/
// budget.h) asks this module at its safe points and when an allocation needs room; the spill
// target's mechanism (placement/movable.h) does the moving. Every move batch runs with the launch gate
// closed, so no submission of any thread can touch a piece while it moves.
//
// The decisions, all from what submissions said (placement/use_tracker.h). An allocation's density is
// its rate (submissions naming it per epoch, a moving average) per byte: what keeping it on the
// host would cost per byte, since every use of host memory crosses the link.
//   - Demotion (room for a new allocation, or for another process): the least dense first, then
//     the least recently used, then the oldest. For a new allocation, only what is less dense than
//     the newcomer would be if used once in this epoch: a program that grows past its budget
//     after using what it has (a model's weights, then buffers written once) spills the newcomer,
//     as a static split would, while data written once and left (the reuse pattern) makes room.
//     A launch that then reads the newcomer brings it back ahead if it is the denser.
//   - Promotion into free room: the densest first.
//   - Rebalancing at a safe point (migrate = "auto"): a host-resident allocation used since the
//     last epoch takes the place of device-resident ones at most 1/factor as dense. A cycle that
//     uses everything alike (a training step) keeps its split; one whose hot data sits on the host
//     gets it back.
//   - Promotion ahead (migrate = "auto"): a kernel launch that names a host-resident allocation
//     asks, once per allocation and epoch, before its driver call; the same rule as a rebalance
//     decides, on the rates of past epochs (in a cycle, what a launch names now would otherwise
//     always beat what the cycle uses next), and nothing the launch names makes room. A yes moves
//     with the gate closed and the context synchronized, so the kernel reads device memory.
//   - Hysteresis: a rebalance (or promotion ahead) that promotes what a swap demoted less than
//     kRegretEpochs ago is a regret (the two were swapping places); the factor doubles at each,
//     and at kMaxFactor swapping stops, so no program thrashes for long.
//   - Trials (migration_trial.cpp): counts cannot say what a kernel does with a buffer (a matrix
//     product re-reads an operand many times; a multi-tensor kernel touches a little of each of
//     its many buffers). So a swap made while the program runs steadily is a trial: the program's
//     submission rate after it (base/throughput.h) is compared with the rate before it, and a
//     swap that did not make the program faster is undone. When the counts find nothing to swap
//     but used data sits on the host, a trial explores: the host-resident allocation with the
//     most shares (UseRecord::kWhole) on the host comes back in place of the least shared device
//     data. A verdict holds what it placed against the counts' swaps for a while (a kept trial's
//     demoted data may still be explored back); an undone trial holds what it demoted on the
//     device, and what it promoted is not explored again for a while, longer after each failure,
//     as is any exploration after failures in a row: trials cost a bounded share of the run.
//   - Epochs advance at safe points, at most one per kEpochNs, so a program that synchronizes
//     after every kernel does not age its data in microseconds.
//   - When, at a safe point (at_safe_point): promotion into free room, bounded per point (more at
//     a busy point, in proportion to the program's own wait), then a rebalance once per epoch.
//     What the budget keeps is what is not migration's to decide: other processes' requests for
//     room, and asking them for room (core/budget.h).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/driver.h"
#include "placement/host_cost.h"
#include "base/launch_gate.h"
#include "placement/movable.h"
#include "placement/step.h"
#include "base/throughput.h"
#include "placement/use_tracker.h"
#include "policy/policy.h"

namespace allocshim {

// Set while some core may move memory: the hook layer sends submissions through the gate only then
// (one relaxed load per submission otherwise).
extern std::atomic<bool> g_submissions_watched;
inline bool submissions_watched() { return g_submissions_watched.load(std::memory_order_relaxed); }

class Migration {
 public:
  // `ledger` accounts for the room promotions take and for every move (core/budget.h).
  Migration(const Driver& driver, MoveLedger& ledger);
  Migration(const Migration&) = delete;
  Migration& operator=(const Migration&) = delete;

  // The spill target whose memory moves (null: nothing moves) and the migrate mode in effect.
  void configure(Movable* target, policy::Budget::Migrate mode);
  bool active() const { return target_.load(std::memory_order_acquire) != nullptr; }

  LaunchGate& gate() { return gate_; }
  UseTracker& uses() { return uses_; }
  const UseTracker& uses() const { return uses_; }
  HostCost& host_cost() { return host_cost_; }

  // At a safe point of `device` (a synchronization the program made): the epoch may advance, and
  // with it the rates of that device's allocations.
  void on_safe_point(int device);

  // When memory moves at a safe point of `device` (the context idle): promotes the densest spilled
  // memory while `room()` (the bytes promotion may take now, asked again after each step) allows,
  // at most `bound` (promote_bound of the program's wait there, unless the budget knows better),
  // then, if `swaps`, rebalances once per epoch. Returns the bytes promoted.
  std::size_t at_safe_point(int device, std::uint64_t bound,
                            const std::function<std::uint64_t()>& room, bool swaps);
  // Whether such a safe point may have anything to do, with `room` bytes promotion could take: a
  // few relaxed loads.
  bool wants_safe_point(int device, std::uint64_t room) const;
  // A safe point where the program waited kBusyWaitNs or more is busy: it is using the device.
  static constexpr bool busy(std::uint64_t waited_ns) { return waited_ns >= kBusyWaitNs; }
  // What one safe point promotes at most.
  static constexpr std::uint64_t promote_bound(std::uint64_t waited_ns) {
    return busy(waited_ns) ? std::max(kPromotePerPoint, waited_ns * kPromoteBytesPerWaitNs)
                           : kPromotePerPoint;
  }

  // The decisions; each runs the mechanism with the gate closed and returns the bytes moved.
  // `newcomer`: the size of the new allocation the room is for (0: room for another process).
  std::size_t demote(int device, std::size_t want_bytes, std::size_t newcomer = 0);
  std::size_t promote(int device, std::size_t max_bytes);
  // Swaps recently used host-resident allocations with cold device-resident ones, at most
  // `max_bytes` promoted; `room` is what the budget lets promotion take now.
  std::size_t rebalance(int device, std::size_t max_bytes, std::uint64_t room);
  // Before a launch that names the host-resident allocations `wanted` (and, in all, `named`):
  // brings back those of them the rule above lets displace device data not in `named`, at most
  // `max_bytes`. The caller is outside the gate. Returns the bytes promoted.
  std::size_t promote_ahead(int device, const std::vector<DevPtr>& wanted,
                            const std::vector<DevPtr>& named, std::size_t max_bytes,
                            std::uint64_t room);

  struct Counts {
    std::uint64_t epoch = 0, factor = 0;
    std::uint64_t rebalances = 0, rebalance_bytes = 0, regrets = 0;
    std::uint64_t ahead = 0, ahead_bytes = 0, ahead_declined = 0;  // promotions ahead of a launch
    std::uint64_t gate_timeouts = 0;  // moves skipped: a submission stayed inside the gate
    // Swaps measured against the program's rate: explored (tried without the counts' backing),
    // kept, undone, and abandoned (something else moved before the verdict).
    std::uint64_t trials = 0, explored = 0, kept = 0, undone = 0, abandoned = 0, trial_bytes = 0;
    LaunchGate::Counts gate;
    UseTracker::Counts uses;
    HostCost::Counts host_cost;
  };
  Counts counts() const;
  // Each movable allocation of `device` as the policy sees it now (the stats file lists them, so a
  // run shows what was placed where and why).
  struct Listed {
    DevPtr base = 0;
    std::size_t device_bytes = 0, host_bytes = 0;
    std::uint64_t seq = 0, uses = 0, epochs = 0, last_epoch = 0, rate = 0, share_rate = 0;
    std::uint32_t cost = 0;  // UseRecord::cost (0: never timed)
    // Its profile in the learned step (placement/step.h; all 0: not named in it, or none learned).
    std::uint32_t step_uses = 0, step_first = 0, step_last = 0, idle_from = 0, idle_len = 0;
    std::uint64_t step_bins = 0;
  };
  std::vector<Listed> listing(int device) const;
  // The exit summary's lines ("" when nothing was tracked).
  std::string summary() const;
  // Where an allocation with `device_bytes` and `host_bytes` is at each of a step's parts, from its
  // profile's bins: '#' used there on the device, 'h' used there with some of it on the host, '.'
  // not used there.
  static std::string place_over_step(std::uint64_t bins, std::size_t device_bytes,
                                     std::size_t host_bytes);

  // The step learned last (placement/step.h; `repeats` false: none yet, or none repeats), and
  // the epoch its recording ended in (0: none ended yet).
  LearnedStep learned_step(std::uint64_t* epoch = nullptr) const;
  // The first recording begins at a safe point once this many epochs passed (the program's own
  // warm-up allocates and launches once), and another this many epochs after each, so that a
  // program whose step changes is learned again.
  static constexpr std::uint64_t kLearnAfterEpochs = 8;
  static constexpr std::uint64_t kRelearnEpochs = 256;

  static constexpr std::uint64_t kEpochNs = 10'000'000;
  // What an idle safe point promotes at most (docs/design/oversubscription.md, "Safe points: when
  // memory moves").
  static constexpr std::uint64_t kPromotePerPoint = std::uint64_t{256} << 20;
  // What a rebalance may promote at one safe point: data used while on the host is read over the
  // link at every use, which costs about what moving it once does, so once the policy finds it
  // hot it comes back at one safe point.
  static constexpr std::uint64_t kRebalancePerPoint = std::uint64_t{4} << 30;
  // A safe point where the program waited this long is busy: the process is using the device (a
  // synchronization with nothing to wait for returns in microseconds).
  static constexpr std::uint64_t kBusyWaitNs = 1000000;
  // What a busy safe point may promote per nanosecond the program waited there: about half of what
  // moves run at while another process's kernels share the GPU, so promotion adds about half the
  // program's own wait at most (chosen with share_bench; its results hold the numbers).
  static constexpr std::uint64_t kPromoteBytesPerWaitNs = 4;
  // The least room worth a promotion: one chunk of the spill target.
  static constexpr std::uint64_t kMinRoom = std::uint64_t{2} << 20;
  // The rate (x16, as update_rates keeps it) of one use in the current epoch: a newcomer's.
  static constexpr std::uint64_t kOneUseRate = 4;
  static constexpr std::uint64_t kFactor = 2;
  static constexpr std::uint64_t kMaxFactor = 64;
  static constexpr std::uint64_t kRegretEpochs = 8;
  // A rebalance alternates demotion and promotion in steps of this size.
  static constexpr std::size_t kRebalanceStep = std::size_t{256} << 20;
  // How long a move waits for submissions inside the gate before it gives up: long enough for any
  // launch, short enough that an allocation waiting for room is not held by a long synchronous copy.
  static constexpr std::uint64_t kCloseTimeoutNs = 50'000'000;
  // A trial keeps an explored swap when the program got this much faster, and undoes a swap the
  // counts asked for when it got this much slower (in thousandths of the rate before): less
  // than that is noise between cycles.
  static constexpr std::uint64_t kTrialGainPermille = 30;
  // How long a verdict holds: a kept swap, and what an undone one brought back.
  static constexpr std::uint64_t kHoldEpochs = 1024;
  static constexpr std::uint64_t kRetryEpochs = 64;
  // A trial with no verdict after this many epochs is abandoned: a program whose safe points
  // all find a stream busy never gives one, and a running trial holds promotions back.
  static constexpr std::uint64_t kTrialMaxEpochs = 64;
  // Waits after failures double up to kRetryEpochs << kMaxBackoff.
  static constexpr std::uint32_t kMaxBackoff = 8;
  // Tests advance epochs at every safe point, or wait longer for the gate, or keep the time.
  void set_epoch_ns(std::uint64_t ns) { epoch_ns_.store(ns, std::memory_order_relaxed); }
  void set_clock(std::uint64_t (*now_ns)()) { clock_.store(now_ns, std::memory_order_relaxed); }
  void set_close_timeout_ns(std::uint64_t ns) {
    close_timeout_ns_.store(ns, std::memory_order_relaxed);
  }

 private:
  // The movable allocations of `device`, in the order a decision wants.
  std::vector<MovableAllocation> list(int device) const;
  static std::vector<DevPtr> bases(const std::vector<MovableAllocation>& v);
  // With the gate closed: the movable allocations of `device` that `keep` accepts, sorted by
  // `order`, handed to `move`; what it moved (0 when the gate could not close).
  template <class Keep, class Order, class Move>
  std::size_t move_closed(int device, Keep keep, Order order, Move move);
  void update_rates(int device);
  // A swap: host-resident allocations to promote (densest first), device-resident ones to demote
  // for them (least dense first), the bytes promoted and the bytes demotion must free.
  struct Plan {
    std::vector<MovableAllocation> promote, demote;
    std::size_t want = 0, displace = 0;
  };
  // Each of `hot` (densest first) may displace the data of `cool` (least dense first) at most
  // 1/factor as dense; the plan stops at the first that would need more than `room` and such data.
  static Plan plan(const std::vector<MovableAllocation>& hot,
                   const std::vector<MovableAllocation>& cool, std::size_t max_bytes,
                   std::uint64_t room, std::uint64_t factor);
  // Counts a regret for each planned promotion of what a swap demoted lately (raising the factor).
  void note_regrets(const Plan& p, std::uint64_t now, std::uint64_t factor);
  // The mechanism's promotions and demotions on `t`, accounted with the ledger; the bytes moved.
  std::size_t to_device(Movable& t, int device, const std::vector<DevPtr>& order,
                        std::size_t max_bytes);
  std::size_t to_host(Movable& t, int device, const std::vector<DevPtr>& order,
                      std::size_t want_bytes);
  void account(int device, const Movable::Moves& m, bool to_device);
  // With the gate closed: runs `p` on `t`; returns the bytes promoted.
  std::size_t swap(Movable* t, int device, const Plan& p, std::uint64_t room, std::uint64_t now,
                   std::size_t* demoted = nullptr);
  // `swap` with the gate closed (0 when it could not close).
  std::size_t closed_swap(Movable* t, int device, const Plan& p, std::uint64_t room,
                          std::uint64_t now, std::size_t* demoted = nullptr);
  // promote_ahead, with the decisions held and no trial running.
  std::size_t promote_ahead_decided(Movable* t, int device, const std::vector<DevPtr>& wanted,
                                    const std::vector<DevPtr>& named, std::size_t max_bytes,
                                    std::uint64_t room);
  // A planned swap carried out: regrets noted, the gate closed, the moves counted in swaps/bytes,
  // and a trial begun if the program ran steadily before it (deciding_ held).
  std::size_t carry_out(Movable* t, int device, const Plan& p, std::uint64_t room,
                        std::uint64_t now, std::uint64_t factor, std::atomic<std::uint64_t>& swaps,
                        std::atomic<std::uint64_t>& bytes);

  // Trials (migration_trial.cpp).
  struct Trial {
    bool active = false, explore = false;
    int device = 0;
    double before = 0;               // submissions per second before the swap
    std::uint64_t changes = 0;       // placement changes counted right after it
    std::uint64_t publications = 0;  // of the movable set then: its records live while unchanged
    std::uint64_t epoch = 0;         // when it began
    std::vector<MovableAllocation> promoted, demoted;
    std::size_t promoted_bytes = 0, demoted_bytes = 0;
  };
  // Placement changes so far: moves and movable allocations made or freed.
  std::uint64_t changes() const {
    return changes_.load(std::memory_order_relaxed) + uses_.publications();
  }
  // The program's rate over a window with no change since, if one was measured.
  bool steady_rate(double& out);
  // With a trial of `device` running: its verdict once measured (undoing it if so). True while a
  // trial occupies the decisions.
  bool trial_step(int device, std::uint64_t room);
  // Ends a running trial without a verdict when something else moved or it ran too long; the
  // swap stays, held a while. True if it ended it.
  bool abandon_trial_if_stale();
  // A swap the counts did not ask for, as a trial; the bytes promoted.
  std::size_t explore(int device, std::uint64_t room);
  // Starts a trial of the swap `p` just made.
  void begin_trial(int device, bool explore, double before, const Plan& p, std::size_t promoted,
                   std::size_t demoted);
  // Whether a verdict holds `a` where `on_host` says, in epoch `now`.
  static bool held(const MovableAllocation& a, bool on_host, std::uint64_t now);
  static void hold(const std::vector<MovableAllocation>& v, bool on_host, std::uint64_t until);
  std::uint64_t now_ns() const { return clock_.load(std::memory_order_relaxed)(); }
  // Learning the step (migration_step.cpp), at every safe point: notes it on the tape, arms a
  // recording when one is due, and while one runs, looks (once an epoch) whether it holds a step.
  void learn_at_safe_point();
  void finish_learning(const LearnedStep& s, std::uint64_t epoch);

  LaunchGate gate_;
  UseTracker uses_;
  HostCost host_cost_;
  std::atomic<std::uint64_t (*)()> clock_;
  std::atomic<std::uint64_t> changes_{0};
  std::mutex throughput_mutex_;  // throughput_: sampled at epochs, read by decisions
  Throughput throughput_;
  std::atomic<bool> deciding_{false};       // one thread runs rebalances and trials at a time
  Trial trial_;                             // only with deciding_ set
  std::atomic<bool> trial_running_{false};  // trial_.active, for safe points that do not decide
  std::uint64_t explore_after_ = 0;         // no exploration before this epoch (deciding_ set)
  std::uint32_t explore_failures_ = 0;      // explorations undone in a row (deciding_ set)
  std::atomic<std::uint64_t> trials_{0}, explored_{0}, kept_{0}, undone_{0}, abandoned_{0},
      trial_bytes_{0};
  std::atomic<Movable*> target_{nullptr};
  MoveLedger& ledger_;
  std::atomic<bool> rebalance_{false};  // migrate = "auto": swaps demote as well as promote
  std::atomic<std::uint64_t> epoch_ns_{kEpochNs};
  std::atomic<std::uint64_t> close_timeout_ns_{kCloseTimeoutNs};
  std::atomic<std::uint64_t> last_epoch_at_{0};
  std::atomic<std::uint64_t> factor_{kFactor};
  std::atomic<std::uint64_t> rebalances_{0}, rebalance_bytes_{0}, regrets_{0}, gate_timeouts_{0};
  std::atomic<std::uint64_t> ahead_{0}, ahead_bytes_{0}, ahead_declined_{0};
  // Learning: one safe point at a time runs it (try-locked), the result is read under its own lock.
  std::mutex learn_mutex_;
  std::uint64_t learn_at_ = kLearnAfterEpochs;   // the epoch the next recording starts at
  std::uint64_t learn_looked_ = 0;               // the epoch a running recording was last read in
  std::uint64_t learn_armed_ = 0;                // the epoch the running recording began in
  mutable std::atomic<bool> step_stale_{false};  // the program left the learned step: learn anew
  mutable std::mutex learned_mutex_;
  std::shared_ptr<const LearnedStep> learned_;
  std::uint64_t learned_epoch_ = 0;
  // The learned step, when one repeats: decisions then weigh uses per step (list()).
  std::shared_ptr<const LearnedStep> step_in_force() const;
  // Per device, the last epoch a safe point rebalanced in.
  std::array<std::atomic<std::uint64_t>, kMaxDevices> rebalanced_epoch_{};
  bool rebalance_due(int device) const;
};

}  // namespace allocshim
