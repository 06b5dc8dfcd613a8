#include "base/launch_gate.h"

#include <sched.h>

#include <vector>

#include "base/clock.h"
#include "os/process_barrier.h"

namespace allocshim {

#if defined(ALLOCSHIM_GATE_TSAN)
LaunchGate::LaunchGate() : light_(false) {}
#else
LaunchGate::LaunchGate() : light_(os::process_barrier_ready()) {}
#endif

void LaunchGate::fence() const {
  // Without light submitters both sides use locked operations, which order themselves.
  if (light_) os::process_barrier();
}

void LaunchGate::enter_shared() {
  for (;;) {
    shared_inside_.fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t c = closed_.load(std::memory_order_seq_cst);
    if (c == 0) {
      shared_submissions_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    shared_inside_.fetch_sub(1, std::memory_order_release);
    shared_waits_.fetch_add(1, std::memory_order_relaxed);
    wait_open(c);
  }
}

void LaunchGate::leave_shared() { shared_inside_.fetch_sub(1, std::memory_order_release); }

void LaunchGate::wait_open(std::uint32_t seen) {
  // A move lasts milliseconds: sleep in the kernel until it opens the gate.
  waiting_.fetch_add(1, std::memory_order_relaxed);
  while (seen != 0) {
    closed_.wait(seen, std::memory_order_acquire);
    seen = closed_.load(std::memory_order_acquire);
  }
  waiting_.fetch_sub(1, std::memory_order_relaxed);
}

bool LaunchGate::wait_inside_left(std::uint64_t deadline_ns) const {
  // Snapshot of the slots inside now: only those can still be inside from before the close (a
  // thread entering later sees the gate closed, or for quiesce() reads the new data).
  std::vector<std::pair<const Slot*, std::uint64_t>> inside;
  slots_.for_each([&](const Slot& s) {
    const std::uint64_t seq = s.seq.load(std::memory_order_seq_cst);
    if (seq & 1) inside.emplace_back(&s, seq);
  });
  unsigned spins = 0;
  for (const auto& [s, seq] : inside) {
    while (s->seq.load(std::memory_order_acquire) == seq) {
      if (++spins % 64 == 0 && clock::now_ns() >= deadline_ns) return false;
      sched_yield();
    }
  }
  while (shared_inside_.load(std::memory_order_seq_cst) != 0) {
    if (++spins % 64 == 0 && clock::now_ns() >= deadline_ns) return false;
    sched_yield();
  }
  return true;
}

bool LaunchGate::close(std::uint64_t timeout_ns) {
  closed_.fetch_add(1, std::memory_order_seq_cst);
  fence();
  if (wait_inside_left(clock::now_ns() + timeout_ns)) {
    closes_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  close_timeouts_.fetch_add(1, std::memory_order_relaxed);
  open();
  return false;
}

void LaunchGate::open() {
  opened_.fetch_add(1, std::memory_order_relaxed);
  closed_.fetch_sub(1, std::memory_order_release);
  closed_.notify_all();
}

bool LaunchGate::quiesce(std::uint64_t timeout_ns) const {
  // The caller published with a sequentially consistent store before: after the fence, a
  // submission that entered after this reads the new data.
  fence();
  return wait_inside_left(clock::now_ns() + timeout_ns);
}

bool LaunchGate::anyone_inside() const {
  bool inside = shared_inside_.load(std::memory_order_relaxed) != 0;
  slots_.for_each(
      [&](const Slot& s) { inside = inside || (s.seq.load(std::memory_order_relaxed) & 1); });
  return inside;
}

LaunchGate::Counts LaunchGate::counts() const {
  Counts c;
  slots_.for_each([&](const Slot& s) {
    c.submissions += s.submissions.load(std::memory_order_relaxed);
    c.waits += s.waits.load(std::memory_order_relaxed);
  });
  c.submissions += shared_submissions_.load(std::memory_order_relaxed);
  c.waits += shared_waits_.load(std::memory_order_relaxed);
  c.closes = closes_.load(std::memory_order_relaxed);
  c.close_timeouts = close_timeouts_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace allocshim
