// Turn-taking of one device between the processes of a shared budget (see turn.h).
#include "placement/turn.h"

namespace allocshim {

Turn::State Turn::fire(Event e) {
  State s = state_.load(std::memory_order_relaxed);
  const bool waits = waits_.load(std::memory_order_relaxed);
  while (!state_.compare_exchange_weak(s, next(s, e, waits), std::memory_order_relaxed)) {}
  return s;
}

bool Turn::on_busy_wait(std::uint64_t waited_ns, std::uint64_t spilled) {
  // Counted at the safe point that waited, not where memory moves: a synchronization that finds
  // other streams busy moves nothing, but its wait is part of the phase.
  phase_wait_ns_.fetch_add(waited_ns, std::memory_order_relaxed);
  last_wait_ns_.store(waited_ns, std::memory_order_relaxed);
  since_ask_ns_.fetch_add(waited_ns, std::memory_order_relaxed);
  fire(Event::wait);
  return may_ask(long_phase(spilled));
}

bool Turn::end_phase() {
  const State was = fire(Event::end);
  const bool took_over = was == State::taking_over || was == State::stalled;
  last_clean_ns_.store(phase_clean_ns_.exchange(0, std::memory_order_relaxed),
                       std::memory_order_relaxed);
  phase_wait_ns_.store(0, std::memory_order_relaxed);
  last_wait_ns_.store(0, std::memory_order_relaxed);
  since_ask_ns_.store(0, std::memory_order_relaxed);
  asked_.store(false, std::memory_order_relaxed);
  last_handover_.store(took_over, std::memory_order_relaxed);
  if (took_over) gave_room_.store(false, std::memory_order_relaxed);  // what it gave is back
  if (in_vain_.exchange(false, std::memory_order_relaxed)) {
    const std::uint32_t b = std::min(backoff_.load(std::memory_order_relaxed) + 1, kMaxBackoff);
    backoff_.store(b, std::memory_order_relaxed);
    skip_waits_.store((1u << b) - 1, std::memory_order_relaxed);
  }
  const std::uint32_t skip = skip_waits_.load(std::memory_order_relaxed);
  if (skip > 0) skip_waits_.store(skip - 1, std::memory_order_relaxed);
  waits_.store(skip == 0, std::memory_order_relaxed);
  return took_over;
}

}  // namespace allocshim
