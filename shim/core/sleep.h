// Sleep and wake (docs/operators.md, "Sleep and wake"): a process's device memory moves to the host
// at the same addresses and its share of a shared budget goes back to the others; woken, the memory
// comes back. Only memory of the spill target moves (docs/oversubscription.md, "What can move");
// what other backends hold stays and is reported.
//
// Asleep (`allocshim ctl PID sleep`): the launch gate stays closed, so every submission of the
// program waits until wake, and the spill target claims no device memory meanwhile (its promotions
// move nothing, what it serves stays on the host). Dozing (the process idled past idle_sleep_ms):
// the same moves without the gate; the program's next submissions bring memory back as migration
// decides, so a process that wakes on its own needs nobody to wake it.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace allocshim {

class Budget;

class Sleeper {
 public:
  explicit Sleeper(Budget& budget) : budget_(budget) {}
  Sleeper(const Sleeper&) = delete;
  Sleeper& operator=(const Sleeper&) = delete;

  enum class State : std::uint8_t { awake, asleep, dozing };
  struct Outcome {
    std::string error;  // empty: done
    State state = State::awake;
    std::uint64_t moved = 0;   // bytes the call moved (to the host by sleep, back by wake)
    std::uint64_t ns = 0;      // how long the call took, waits included
    std::uint64_t device = 0;  // bytes backed on the devices after it, spill target or not
    std::uint64_t host = 0;    // bytes of the spill target on the host after it
  };

  // Closes the launch gate (waiting up to kGateWaitNs for submissions inside to leave), then moves
  // every device piece of the spill target to the host once the queued work is done, and gives
  // the lease back. An error leaves the process as it was, awake.
  Outcome sleep();
  // Brings the memory back (asking a shared budget for room, waiting for it as an allocation
  // would) and opens the gate. What finds no room stays on the host and comes back as migration
  // decides.
  Outcome wake();
  // Where things stand.
  Outcome status() const;
  // At exit: opens the gate if sleep holds it, so that no thread of the program waits there for a
  // wake that can no longer come; the memory stays where it is.
  void let_go();
  State state() const { return state_.load(std::memory_order_relaxed); }

  // Called by the control thread about every tick (core/control.h): a process awake that submitted
  // nothing for `idle_ms` (0: never) dozes; a dozing one that submitted since is awake again.
  void tick(std::uint64_t now_ns, std::uint32_t idle_ms);

  // How long sleep waits for a submission inside the gate (a copy waiting for long work).
  static constexpr std::uint64_t kGateWaitNs = 5'000'000'000;

 private:
  // Moves what can move off every device the process used; returns the bytes.
  std::uint64_t empty_devices();
  // Fills what was left in `o` (device and host bytes, the state).
  void describe(Outcome& o) const;

  Budget& budget_;
  std::mutex mutex_;  // one sleep, wake or doze at a time
  std::atomic<State> state_{State::awake};
  bool gate_held_ = false;  // under mutex_
  // The idle watch (tick, on the control thread only): the submissions seen last, and since when.
  std::uint64_t seen_submissions_ = 0, seen_since_ns_ = 0;
};

const char* state_name(Sleeper::State s);

}  // namespace allocshim
