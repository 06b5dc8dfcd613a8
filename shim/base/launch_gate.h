// The gate every work submission passes while migration can move memory (docs/oversubscription.md,
// "Migration"): a kernel launch, a copy, a memset or a graph launch from any thread enters it before
// the driver call and leaves after, and a move closes it, so no submission can reach a piece between
// its unmap and its remap, or read it before its copy has landed.
//
// The submission side touches only its own thread's slot: a sequence number made odd on entry and
// even on exit, then one load of the shared `closed` word, which is written only by moves. The mover
// raises `closed`, then waits until every slot it saw odd has changed (the thread left). Either the
// submitter sees the gate closed and waits, or the mover sees the submitter inside and waits for it
// (the Dekker pattern), which needs the submitter's store ordered before its load. Where the kernel
// offers process-wide barriers (os/process_barrier.h) the mover issues one after raising `closed`
// and the submitter needs only a compiler barrier: nothing locked or fenced on the hot path.
// Elsewhere, and under ThreadSanitizer (which cannot model that barrier), the submitter's store is
// a locked exchange. A thread that waits holds nothing the mover needs: it waits before its driver
// call.
//
// The same slots tell a writer of shared read-side data (the use tracker's snapshot of movable
// ranges) when no submission that could still read an old version is inside: quiesce().
#pragma once

#include <atomic>
#include <cstdint>

#include "base/threads.h"

#if defined(__SANITIZE_THREAD__)
#define ALLOCSHIM_GATE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ALLOCSHIM_GATE_TSAN 1
#endif
#endif

namespace allocshim {

class LaunchGate {
 public:
  LaunchGate();
  LaunchGate(const LaunchGate&) = delete;
  LaunchGate& operator=(const LaunchGate&) = delete;

  // Submission side: enter before the driver call, leave after. Never nested on one thread (the
  // hook layer's re-entrancy guard sends the driver's own calls past the hooks).
  void enter() {
    Slot* s = slot();
    if (__builtin_expect(s == nullptr, 0)) return enter_shared();
    for (;;) {
      announce(*s);
      const std::uint32_t c = closed_.load(std::memory_order_seq_cst);
      if (__builtin_expect(c == 0, 1)) {
        s->submissions.store(s->submissions.load(std::memory_order_relaxed) + 1,
                             std::memory_order_relaxed);
        return;
      }
      s->seq.store(s->seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
      s->waits.store(s->waits.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      wait_open(c);
    }
  }
  void leave() {
    Slot* s = slot();
    if (__builtin_expect(s == nullptr, 0)) return leave_shared();
    s->seq.store(s->seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  // Mover side. Closes the gate and waits, up to `timeout_ns`, for every submission inside to
  // leave. False: some submission stayed inside (a synchronous copy waiting for long work, say);
  // the gate is open again and nothing may move.
  bool close(std::uint64_t timeout_ns);
  void open();
  // How many times the gate has opened: memory may have moved since a submission that saw a
  // smaller number. Read on the line every submission reads anyway.
  std::uint64_t moves() const { return opened_.load(std::memory_order_relaxed); }

  // Waits, up to `timeout_ns`, until every submission inside now has left (new ones may enter).
  // True when they all did.
  bool quiesce(std::uint64_t timeout_ns) const;

  // Threads waiting for the gate to open now (a submission that found it closed).
  std::uint32_t waiting() const { return waiting_.load(std::memory_order_relaxed); }
  // Whether some submission is inside now (a look at every thread's slot: not for hot paths).
  bool anyone_inside() const;

  // Counters summed over threads (statistics; approximate while threads run).
  struct Counts {
    std::uint64_t submissions = 0;  // entries
    std::uint64_t waits = 0;        // entries that found the gate closed
    std::uint64_t closes = 0;       // moves that closed it
    std::uint64_t close_timeouts = 0;
  };
  Counts counts() const;

 private:
  struct alignas(64) Slot {
    std::atomic<std::uint64_t> seq{0};                    // odd while its thread is inside
    std::atomic<std::uint64_t> submissions{0}, waits{0};  // written by the owner only
  };
  // Makes this thread's odd sequence number visible before its load of `closed_`.
  void announce(Slot& s) {
    const std::uint64_t next = s.seq.load(std::memory_order_relaxed) + 1;
    if (__builtin_expect(light_, 1)) {
      // The mover's process barrier (fence()) orders it: only the compiler must not reorder.
      s.seq.store(next, std::memory_order_relaxed);
      std::atomic_signal_fence(std::memory_order_seq_cst);
    } else {
      // A locked exchange orders the store before the load, as a full fence would, for less.
      s.seq.exchange(next, std::memory_order_seq_cst);
    }
  }
  // The mover's side of the Dekker pattern, between raising `closed_` (or publishing) and reading
  // the slots.
  void fence() const;
  // This thread's slot; null for a thread without an id (more than threads::kMax alive), which
  // counts itself in `shared_inside_` instead (a shared written line, for such threads only).
  Slot* slot() {
    const int id = threads::id();
    return __builtin_expect(id >= 0, 1) ? slots_.get(id) : nullptr;
  }
  void enter_shared();
  void leave_shared();
  void wait_open(std::uint32_t seen);
  // Waits until every slot seen inside (and every thread without one) has left; false at
  // `deadline_ns` (CLOCK_MONOTONIC).
  bool wait_inside_left(std::uint64_t deadline_ns) const;

  std::atomic<std::uint32_t> closed_{0};
  bool light_ = false;  // submitters skip the fence: the mover's process barrier stands in for it
  // Written by moves only, before they open: a submission that reads `closed_` open sees it.
  std::atomic<std::uint64_t> opened_{0};
  // Written by moves and by threads without a slot: a line apart from `closed_`, which every
  // submission reads.
  alignas(64) std::atomic<std::uint64_t> closes_{0}, close_timeouts_{0};
  std::atomic<std::uint64_t> shared_inside_{0}, shared_submissions_{0}, shared_waits_{0};
  std::atomic<std::uint32_t> waiting_{0};  // written by waiting threads only
  threads::PerThread<Slot> slots_;
};

// Closes `gate` for a scope (a batch of moves); `ok()` says whether it could.
class GateClosed {
 public:
  GateClosed(LaunchGate& gate, std::uint64_t timeout_ns)
      : gate_(gate), ok_(gate.close(timeout_ns)) {}
  ~GateClosed() {
    if (ok_) gate_.open();
  }
  GateClosed(const GateClosed&) = delete;
  GateClosed& operator=(const GateClosed&) = delete;
  bool ok() const { return ok_; }

 private:
  LaunchGate& gate_;
  bool ok_;
};

}  // namespace allocshim
