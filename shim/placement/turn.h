// Turn-taking between the processes of a shared budget, for one device (docs/design/
// oversubscription.md, "The states of a turn", draws it): what this process's busy phase is
// doing, and what it remembers of the phases before. The budget feeds it events from its safe points and
// launches and reads its decisions; moving memory and asking the node stay with the budget.
//
// A busy phase is the run of safe points at which the program waited for the device
// (Migration::busy); a safe point that did not wait ends it. Its mode is one state of the table
// next(); take_over enters `stalled` directly in a phase that backs off (does not wait for room),
// and a launch may take the room over from `idle`. Whether the phase has a request for room out
// at the other members (`asked`) is not a mode: a short phase asks once while computing, a long
// one asks for everything it spilled (again every kAskEveryWaitNs of waits) while taking over.
//
// Every field is a relaxed atomic: safe points may run on several threads at once, and the hot
// path (a safe point with no phase under way) reads one byte. Transitions are compare-exchanges on
// the state, so two events racing both apply in some order.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace allocshim {

class Turn {
 public:
  enum class State : std::uint8_t {
    idle,         // no busy phase under way
    computing,    // a busy phase that moves at its safe points what room it has or asked for
    taking_over,  // a long phase: it asked for everything spilled and waits while the room comes
    stalled,      // a long phase whose wait found nothing: it promotes what arrives, no waiting
  };
  enum class Event : std::uint8_t {
    wait,          // a busy safe point
    take_over,     // the phase is long (or expected to be) and takes the room over
    nothing_came,  // a take-over waited share_wait_ms and no room arrived
    step_came,     // a stalled phase got a demotion step's worth at once: givers give again
    end,           // a safe point that did not wait
  };
  // The one transition table. `waits`: whether this phase may wait for room (not backing off).
  static constexpr State next(State s, Event e, bool waits) {
    switch (e) {
      case Event::end: return State::idle;
      case Event::wait: return s == State::idle ? State::computing : s;
      case Event::take_over:
        return s == State::idle || s == State::computing
                   ? (waits ? State::taking_over : State::stalled)
                   : s;
      case Event::nothing_came: return s == State::taking_over ? State::stalled : s;
      case Event::step_came: return s == State::stalled ? State::taking_over : s;
    }
    return s;
  }

  State state() const { return state_.load(std::memory_order_relaxed); }
  // Whether the phase takes the room over (waiting for it or not).
  bool handing_over() const {
    const State s = state();
    return s == State::taking_over || s == State::stalled;
  }
  // Whether the phase may wait for room now: it is taking over and not stalled, or has not begun
  // to and does not back off.
  bool may_wait() const {
    const State s = state();
    return s == State::taking_over ||
           (s != State::stalled && waits_.load(std::memory_order_relaxed));
  }
  // Whether a busy phase is under way (it waited at a safe point, or took the room over).
  bool computing() const { return state() != State::idle; }
  // Whether the phase has a request for room out at the other members.
  bool asked() const { return asked_.load(std::memory_order_relaxed); }

  // A busy safe point that waited `waited_ns`, with `spilled` bytes of this process on the host.
  // Returns whether the phase may ask the other members for room now (may_ask).
  bool on_busy_wait(std::uint64_t waited_ns, std::uint64_t spilled);
  // The phase asks the other members for room: it counts its waits to the next ask from here. An
  // ask belongs to a busy phase (the phase's end clears it), whatever event came first.
  void on_ask() {
    asked_.store(true, std::memory_order_relaxed);
    since_ask_ns_.store(0, std::memory_order_relaxed);
    fire(Event::wait);
  }
  // The phase takes the room over (Event::take_over).
  void take_over() { fire(Event::take_over); }
  // A take-over's wait found nothing: it stops waiting; `got_none`: nothing came in all of it,
  // so, unless something comes later in the phase, the next phases back off.
  void on_nothing_came(bool got_none) {
    fire(Event::nothing_came);
    if (got_none) in_vain_.store(true, std::memory_order_relaxed);
  }
  // A stalled phase promoted `got` bytes that arrived: the phase did not take over in vain, and
  // with a demotion step's worth (`whole_step`) it waits for the rest again.
  void on_arrived(bool whole_step) {
    in_vain_.store(false, std::memory_order_relaxed);
    if (whole_step) fire(Event::step_came);
  }
  // All of this process's memory came back while taking over: waiting paid, backing off is over.
  void on_all_back() { backoff_.store(0, std::memory_order_relaxed); }
  // A safe point that did not wait: ends the phase (Event::end). Returns whether the phase took
  // the room over. Sets up the next phase: whether it waits (after phases whose take-overs got
  // nothing, the next 1, 3, 7, ... 2^kMaxBackoff - 1 do not), and what it remembers of this one.
  bool end_phase();

  // Whether the phase is long, or expected to be, with `spilled` bytes on the host: its waits so
  // far, with one more like its last, reach long_phase_ns (it decides at its safe points, a wait
  // apart: deciding at the one before its waits pass that mark saves the wait that passes it,
  // read over the link; a phase that ends there loses one take-over, against the half of one it
  // read at least); or the phase before computed long with its memory on the device, or took the
  // room over (a process taking turns with others takes it over every turn); or this one takes it
  // over already (also where a launch did so because the process gave room).
  bool long_phase(std::uint64_t spilled) const {
    return phase_wait_ns_.load(std::memory_order_relaxed) +
                   last_wait_ns_.load(std::memory_order_relaxed) >=
               long_phase_ns(spilled) ||
           last_clean_ns_.load(std::memory_order_relaxed) >= kLongCleanPhaseNs ||
           last_handover_.load(std::memory_order_relaxed) || handing_over();
  }
  // Whether a busy phase may ask now: not yet asked; long, and not yet taking the room over (its
  // asks so far were a short phase's); or taking it over and kAskEveryWaitNs past its last ask.
  bool may_ask(bool long_phase) const {
    return !asked() ||
           (long_phase &&
            (!handing_over() || since_ask_ns_.load(std::memory_order_relaxed) >= kAskEveryWaitNs));
  }

  // This process gave its memory to other members while idle, and has not had all of it back nor
  // taken the room over since: its next phase is expected long at its first launch.
  bool gave_room() const { return gave_room_.load(std::memory_order_relaxed); }
  void on_gave_room() { gave_room_.store(true, std::memory_order_relaxed); }
  void on_got_room_back() {
    if (gave_room_.load(std::memory_order_relaxed))
      gave_room_.store(false, std::memory_order_relaxed);
  }
  // A busy safe point with nothing of this process on the host: how long the program computes with
  // all its memory on the device is what predicts its next phase.
  void on_clean_wait(std::uint64_t waited_ns) {
    phase_clean_ns_.fetch_add(waited_ns, std::memory_order_relaxed);
    fire(Event::wait);
  }

  // Bytes this process expects to demote for other processes once it is idle: the one value both
  // the budget and the spill target read (Budget::expect_demotion).
  std::uint64_t expected() const { return expected_.load(std::memory_order_relaxed); }
  void set_expected(std::uint64_t bytes) { expected_.store(bytes, std::memory_order_relaxed); }
  // Forgets the expectation read as `seen`; one set since then stays.
  void forget_expected(std::uint64_t seen) {
    expected_.compare_exchange_strong(seen, 0, std::memory_order_relaxed);
  }

  // What moving the room over costs per nanosecond when the giver demotes into host pieces it holds
  // (its host reserve) while the taker promotes: both copy at once, each at a little under half the
  // link's one-way rate. A lower value makes a phase pay more than the move over the link first.
  static constexpr std::uint64_t kHandOverBytesPerNs = 24;
  // The waits that make a busy phase with `spilled` bytes on the host long: as long as taking the
  // room over and moving them back takes. A phase that has lost that much to reading over the link
  // would have lost no more by moving at its start, whatever its length; one that ends sooner reads
  // the rest over the link. At most kLongPhaseWaitNs.
  static constexpr std::uint64_t long_phase_ns(std::uint64_t spilled) {
    return std::min(kLongPhaseWaitNs, spilled / kHandOverBytesPerNs);
  }
  // The most a busy phase waits before it is long, however much it spilled.
  static constexpr std::uint64_t kLongPhaseWaitNs = 2000000000;
  // Waits with nothing spilled that make the next phase expected long: several times what moving
  // a few GiB back takes, so that moving everything at the start of such a phase pays.
  static constexpr std::uint64_t kLongCleanPhaseNs = 500000000;
  // How often a long phase asks again: often enough that a turn of seconds gets its memory back
  // early in it, rarely enough that the asks stay a few region operations a second.
  static constexpr std::uint64_t kAskEveryWaitNs = 100000000;
  // After take-overs that got nothing, the phases that do not wait double up to 2^kMaxBackoff - 1.
  static constexpr std::uint32_t kMaxBackoff = 6;

 private:
  // Applies `e` to the state; returns the state it applied to.
  State fire(Event e);

  std::atomic<State> state_{State::idle};
  std::atomic<bool> asked_{false};
  // Whether this phase may wait for room: false in the phases that back off after take-overs that
  // got nothing (the others may be busy too: they give nothing while they compute).
  std::atomic<bool> waits_{true};
  // The take-over got nothing at all and nothing has come since in this phase.
  std::atomic<bool> in_vain_{false};
  std::atomic<std::uint32_t> backoff_{0}, skip_waits_{0};
  // What the program waited at busy safe points with memory spilled: in this phase, at the last of
  // them, since the last ask; what it waited with none spilled: in this phase, in the one before.
  std::atomic<std::uint64_t> phase_wait_ns_{0}, last_wait_ns_{0}, since_ask_ns_{0};
  std::atomic<std::uint64_t> phase_clean_ns_{0}, last_clean_ns_{0};
  std::atomic<bool> last_handover_{false}, gave_room_{false};
  std::atomic<std::uint64_t> expected_{0};
};

}  // namespace allocshim
