#include "core/sleep.h"

#include "core/budget.h"
#include "base/clock.h"
#include "base/log.h"

namespace allocshim {

const char* state_name(Sleeper::State s) {
  switch (s) {
    case Sleeper::State::awake: return "awake";
    case Sleeper::State::asleep: return "asleep";
    case Sleeper::State::dozing: return "dozing";
  }
  return "?";
}

std::uint64_t Sleeper::empty_devices() {
  std::uint64_t moved = 0;
  for (int d = 0; d < static_cast<int>(kMaxDevices); ++d)
    if (budget_.resolved(d)) moved += budget_.empty_device(d);
  return moved;
}

void Sleeper::describe(Outcome& o) const {
  o.state = state();
  for (int d = 0; d < static_cast<int>(kMaxDevices); ++d) {
    if (!budget_.resolved(d)) continue;
    o.device += budget_.backed(d);
    o.host += budget_.host_bytes(d);
  }
}

Sleeper::Outcome Sleeper::sleep() {
  std::lock_guard lock(mutex_);
  Outcome o;
  const std::uint64_t t0 = clock::now_ns();
  if (!budget_.migration().active()) {
    o.error =
        "its policy moves no memory (sleep needs [budget] spill = \"host\" and migrate = "
        "\"promote\" or \"auto\")";
  } else if (!gate_held_) {
    if (!budget_.migration().gate().close(kGateWaitNs)) {
      o.error = "a submission of the program stayed in the driver for " +
                std::to_string(kGateWaitNs / 1'000'000'000) + " s (a copy waiting for long work?)";
    } else {
      gate_held_ = true;
      budget_.set_asleep(true);
      state_.store(State::asleep, std::memory_order_relaxed);
      o.moved = empty_devices();
    }
  }
  o.ns = clock::now_ns() - t0;
  describe(o);
  return o;
}

Sleeper::Outcome Sleeper::wake() {
  std::lock_guard lock(mutex_);
  Outcome o;
  const std::uint64_t t0 = clock::now_ns();
  budget_.set_asleep(false);
  // Moved back with the gate still closed: the program's first launches find their memory there.
  for (int d = 0; d < static_cast<int>(kMaxDevices); ++d)
    if (budget_.resolved(d)) o.moved += budget_.refill(d);
  if (gate_held_) {
    budget_.migration().gate().open();
    gate_held_ = false;
  }
  state_.store(State::awake, std::memory_order_relaxed);
  o.ns = clock::now_ns() - t0;
  describe(o);
  return o;
}

void Sleeper::let_go() {
  std::lock_guard lock(mutex_);
  if (!gate_held_) return;
  budget_.set_asleep(false);
  budget_.migration().gate().open();
  gate_held_ = false;
  state_.store(State::awake, std::memory_order_relaxed);
}

Sleeper::Outcome Sleeper::status() const {
  Outcome o;
  describe(o);
  return o;
}

void Sleeper::tick(std::uint64_t now_ns, std::uint32_t idle_ms) {
  const std::uint64_t n = budget_.migration().gate().counts().submissions;
  if (n != seen_submissions_ || seen_since_ns_ == 0) {
    seen_submissions_ = n;
    seen_since_ns_ = now_ns;
    State dozing = State::dozing;
    if (state_.compare_exchange_strong(dozing, State::awake, std::memory_order_relaxed))
      budget_.show_asleep(false);
    return;
  }
  if (idle_ms == 0 || state() != State::awake ||
      now_ns - seen_since_ns_ < std::uint64_t{idle_ms} * 1'000'000)
    return;
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || gate_held_ || !budget_.migration().active()) return;
  // Dozing before the moves: a submission meanwhile wakes it at the next tick. Claims stay
  // allowed: its next launches bring memory back as migration decides.
  state_.store(State::dozing, std::memory_order_relaxed);
  budget_.show_asleep(true);
  const std::uint64_t t0 = clock::now_ns();
  const std::uint64_t moved = empty_devices();
  if (moved > 0)
    log::write(log::Level::info, "idle for %u ms: %llu bytes moved to the host in %llu ms", idle_ms,
               static_cast<unsigned long long>(moved),
               static_cast<unsigned long long>((clock::now_ns() - t0) / 1'000'000));
}

}  // namespace allocshim
