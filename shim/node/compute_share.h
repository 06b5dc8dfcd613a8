// GPU time shared between processes ([compute], docs/operators.md, "Compute share and priority").
// While several processes whose policy has a [compute] section want one GPU, they take it in
// exclusive slices: a round of slices per period, each member's slice its part of the period (its
// share where capped, an even split of what is left otherwise). Only members of the highest
// priority that want the GPU take part; the others wait until those stop wanting it. A process
// alone on its GPU runs as if there were no section.
//
// A slice is exclusive because a member without one keeps its launch gate closed
// (base/launch_gate.h): every kernel launch, graph launch, copy and memset of every thread waits
// before its driver call. A member handing its slice on first waits for the work it queued (a
// drain), so that its work does not run into the next slice; the drain is charged to the slice it
// ends, and what a slice overran comes off the member's next one.
//
// Coordination goes through a region file of its own per scope (node_region.h): each member
// writes its demand (when it last wanted the GPU, its share, its priority) without a lock; the
// slice changes hands under the region lock, and only from the sequence number its hander read. A
// thread of the shim ticks: reads the slice and the demands, then closes, opens or hands on.
//
// Nothing another process writes can hang this one: a slice not handed on within kOverduePeriods
// periods of its start is taken over; a region that cannot be joined or read means no slices (the
// process runs as if alone); a drain that outlasts a period hands on anyway.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "node/node_region.h"
#include "policy/policy.h"

namespace allocshim {

class LaunchGate;

class ComputeShare {
 public:
  // What slicing needs of its process: the shim's core, or a test's stand-in.
  struct Process {
    LaunchGate* gate = nullptr;
    // Waits for the work the process queued (its submissions are held at the gate meanwhile).
    std::function<void()> drain;
    // Whether a thread of the process waits inside a synchronization for its work now.
    std::function<bool()> syncing;
    // The GPU the process takes slices of (false: it uses none yet).
    std::function<bool(node::Uuid*)> device;
  };

  explicit ComputeShare(Process process);
  ~ComputeShare();
  ComputeShare(const ComputeShare&) = delete;
  ComputeShare& operator=(const ComputeShare&) = delete;

  // Starts the thread once for `compute` (a later call changes nothing: the section is read at
  // start). False, said once in the log, when slices cannot be taken: the process then runs alone.
  bool start(const policy::Compute& compute);
  // Ends the thread and leaves the region, with the gate open.
  void stop();
  bool running() const { return thread_.joinable(); }
  // In a forked child: forgets the region without touching it (the parent keeps its slot).
  void forget_after_fork();

  // One tick of the thread at `now_ns` (CLOCK_MONOTONIC); public for tests, which drive it.
  void tick(std::uint64_t now_ns);

  struct Report {
    bool active = false;  // taking part in a region
    std::string region;
    std::uint64_t slices = 0;          // slices this process ran
    std::uint64_t used_ns = 0;         // time in them, drains included
    std::uint64_t waited_ns = 0;       // time its work waited for a slice
    std::uint64_t drain_overruns = 0;  // drains that outlasted a period (handed on anyway)
    std::uint64_t taken_over = 0;      // slices taken from a holder that did not hand on
  };
  Report report() const;

  // Each of `n` members' part of a period, in thousandths, from their caps (thousandths): every
  // member gets an even split of what is left, or its cap if that is less (water-filling).
  static void parts(const std::uint32_t* caps, std::size_t n, std::uint32_t* out);

  static constexpr std::uint64_t kTickNs = 250'000;         // while others want the GPU
  static constexpr std::uint64_t kAloneTickNs = 2'000'000;  // while none does
  static constexpr unsigned kOverduePeriods = 3;

 private:
  class Drainer;
  // The members of the top priority that want the GPU, by slot, and each one's part of a period.
  struct Rotation {
    bool below = false;  // this process is of a lower priority than the top: it waits
    std::size_t n = 0, mine = 0;
    int members[node::kSlots];
    std::uint32_t part[node::kSlots];
  };
  // False when fewer than two live members (this one among them) want the GPU: no slices.
  bool rotation(std::uint64_t now, const node::Demand* demand, Rotation& out) const;
  void run();
  bool join_region(const policy::Compute& compute);
  bool attach_device();
  // The gate closed for this process (draining what it queued when it newly closes it).
  void hold();
  // Held, no longer in a slice of its own.
  void wait_turn();
  // The gate open: no slices.
  void release();
  // Ends this member's slice: holds, drains, hands the slice to slot `next` (`wraps`: a new round).
  void hand_on(const node::Slice& slice, int next, bool wraps);

  Process process_;
  policy::Compute compute_;
  node::Region region_;
  int entry_ = -1;  // the GPU's entry in the region, once attached
  std::unique_ptr<Drainer> drainer_;

  // Tick state (the thread, or a test, only).
  bool held_ = false;     // this process's gate is closed for slices
  bool running_ = false;  // in a slice of its own
  std::uint64_t began_ns_ = 0, quantum_ns_ = 0, debt_ns_ = 0, want_ns_ = 0;
  std::uint64_t seen_submissions_ = 0, last_tick_ns_ = 0;

  mutable std::mutex report_mutex_;
  Report report_;

  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace allocshim
