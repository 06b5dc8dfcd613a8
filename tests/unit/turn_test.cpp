// Turn-taking of one device (shim/placement/turn.h): one test per transition of the table, then the
// decisions the budget reads from a turn (when a phase is long, may ask, may wait, backs off).
#include "placement/turn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

namespace allocshim {
namespace {

using State = Turn::State;
using Event = Turn::Event;

constexpr std::uint64_t kMs = 1000000;
constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
// Spilled bytes whose long-phase mark is 10 ms of waits.
constexpr std::uint64_t kSpilled = 10 * kMs * Turn::kHandOverBytesPerNs;
static_assert(Turn::long_phase_ns(kSpilled) == 10 * kMs);

// --- The table: every (state, event) pair, with and without waiting for room. ---

TEST(TurnTable, WaitStartsAPhaseFromIdle) {
  EXPECT_EQ(Turn::next(State::idle, Event::wait, true), State::computing);
  EXPECT_EQ(Turn::next(State::idle, Event::wait, false), State::computing);
}

TEST(TurnTable, WaitKeepsAPhaseWhereItIs) {
  for (State s : {State::computing, State::taking_over, State::stalled})
    for (bool waits : {true, false}) EXPECT_EQ(Turn::next(s, Event::wait, waits), s);
}

TEST(TurnTable, TakeOverFromIdleOrComputingWaitsForRoomUnlessThePhaseBacksOff) {
  for (State s : {State::idle, State::computing}) {
    EXPECT_EQ(Turn::next(s, Event::take_over, true), State::taking_over);
    EXPECT_EQ(Turn::next(s, Event::take_over, false), State::stalled);
  }
}

TEST(TurnTable, TakeOverWhileTakingOverOrStalledChangesNothing) {
  for (State s : {State::taking_over, State::stalled})
    for (bool waits : {true, false}) EXPECT_EQ(Turn::next(s, Event::take_over, waits), s);
}

TEST(TurnTable, NothingCameStallsATakeOver) {
  EXPECT_EQ(Turn::next(State::taking_over, Event::nothing_came, true), State::stalled);
}

TEST(TurnTable, NothingCameOutsideATakeOverChangesNothing) {
  for (State s : {State::idle, State::computing, State::stalled})
    EXPECT_EQ(Turn::next(s, Event::nothing_came, true), s);
}

TEST(TurnTable, StepCameMakesAStalledPhaseWaitAgain) {
  EXPECT_EQ(Turn::next(State::stalled, Event::step_came, true), State::taking_over);
  // Even in a phase that backs off: the givers give again, so waiting for the rest pays.
  EXPECT_EQ(Turn::next(State::stalled, Event::step_came, false), State::taking_over);
}

TEST(TurnTable, StepCameOutsideAStalledPhaseChangesNothing) {
  for (State s : {State::idle, State::computing, State::taking_over})
    EXPECT_EQ(Turn::next(s, Event::step_came, true), s);
}

TEST(TurnTable, EndMakesEveryStateIdle) {
  for (State s : {State::idle, State::computing, State::taking_over, State::stalled})
    for (bool waits : {true, false}) EXPECT_EQ(Turn::next(s, Event::end, waits), State::idle);
}

// --- A turn driven by its events. ---

TEST(Turn, ABusyWaitStartsAPhaseAndMayAskOnce) {
  Turn t;
  EXPECT_FALSE(t.computing());
  EXPECT_TRUE(t.on_busy_wait(1 * kMs, kSpilled));  // not asked yet
  EXPECT_EQ(t.state(), State::computing);
  t.on_ask();
  EXPECT_TRUE(t.asked());
  EXPECT_FALSE(t.on_busy_wait(1 * kMs, kSpilled));  // a short phase asks once
}

TEST(Turn, AnAskBelongsToABusyPhaseWhicheverCameFirst) {
  Turn t;
  t.on_ask();
  EXPECT_EQ(t.state(), State::computing);  // so that the phase's end clears the ask
  t.end_phase();
  EXPECT_FALSE(t.asked());
}

TEST(Turn, ACleanWaitStartsAPhaseWithoutAsking) {
  Turn t;
  t.on_clean_wait(1 * kMs);
  EXPECT_EQ(t.state(), State::computing);
  EXPECT_FALSE(t.asked());
}

TEST(Turn, TheLongMarkIsTheWaitsSoFarPlusTheLast) {
  Turn t;
  t.on_busy_wait(3 * kMs, kSpilled);
  EXPECT_FALSE(t.long_phase(kSpilled));  // 3 + 3
  t.on_busy_wait(3 * kMs, kSpilled);
  EXPECT_FALSE(t.long_phase(kSpilled));  // 6 + 3
  t.on_busy_wait(3 * kMs, kSpilled);
  EXPECT_TRUE(t.long_phase(kSpilled));  // 9 + 3
  // Less spilled, a lower mark; the mark never passes kLongPhaseWaitNs.
  EXPECT_TRUE(Turn().long_phase(0));
  EXPECT_EQ(Turn::long_phase_ns(~std::uint64_t{0}), Turn::kLongPhaseWaitNs);
}

TEST(Turn, ALongPhaseThatAskedShortAsksAgainAndThenEveryAskInterval) {
  Turn t;
  t.on_busy_wait(1 * kMs, kSpilled);
  t.on_ask();                    // a short phase's ask
  EXPECT_TRUE(t.may_ask(true));  // long now, not yet taking over: asks for everything
  t.take_over();
  EXPECT_EQ(t.state(), State::taking_over);
  t.on_ask();
  EXPECT_FALSE(t.on_busy_wait(Turn::kAskEveryWaitNs - 1, kSpilled));
  EXPECT_TRUE(t.on_busy_wait(1, kSpilled));  // kAskEveryWaitNs of waits since the ask
}

TEST(Turn, ATakeOverThatGetsNothingStallsAndTheNextPhasesBackOffDoubling) {
  Turn t;
  // Phase 1: takes over, nothing comes at all.
  t.on_busy_wait(1 * kMs, kSpilled);
  t.take_over();
  t.on_nothing_came(true);
  EXPECT_EQ(t.state(), State::stalled);
  EXPECT_FALSE(t.may_wait());
  EXPECT_TRUE(t.end_phase());
  // One phase (2^1 - 1) backs off: its take-over is stalled from the start.
  EXPECT_FALSE(t.may_wait());
  t.take_over();
  EXPECT_EQ(t.state(), State::stalled);
  t.on_nothing_came(true);
  t.end_phase();
  // Then three (2^2 - 1).
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(t.may_wait()) << i;
    t.on_busy_wait(1 * kMs, kSpilled);
    t.end_phase();
  }
  EXPECT_TRUE(t.may_wait());
  t.take_over();
  EXPECT_EQ(t.state(), State::taking_over);
}

TEST(Turn, BackingOffStopsAtItsCap) {
  Turn t;
  for (std::uint32_t i = 0; i < Turn::kMaxBackoff + 3; ++i) {
    t.take_over();
    t.on_nothing_came(true);
    t.end_phase();
    std::uint32_t skipped = 0;
    while (!t.may_wait()) {
      t.end_phase();
      ++skipped;
    }
    EXPECT_EQ(skipped, (1u << std::min(i + 1, Turn::kMaxBackoff)) - 1) << i;
  }
}

TEST(Turn, WhatArrivesLaterInThePhaseCancelsTheBackOff) {
  Turn t;
  t.take_over();
  t.on_nothing_came(true);
  t.on_arrived(false);  // something came after all, less than a step
  EXPECT_EQ(t.state(), State::stalled);
  t.end_phase();
  EXPECT_TRUE(t.may_wait());
}

TEST(Turn, AStepsWorthArrivingMakesAStalledPhaseWaitAgain) {
  Turn t;
  t.take_over();
  t.on_nothing_came(false);
  t.on_arrived(true);
  EXPECT_EQ(t.state(), State::taking_over);
  EXPECT_TRUE(t.may_wait());
}

TEST(Turn, AllBackResetsTheBackOff) {
  Turn t;
  t.take_over();
  t.on_nothing_came(true);
  t.end_phase();  // backoff 1: one phase skips
  t.end_phase();  // skipped
  t.take_over();
  t.on_all_back();  // this take-over got everything
  t.end_phase();
  // A later take-over in vain starts the doubling again from one skipped phase.
  t.take_over();
  t.on_nothing_came(true);
  t.end_phase();
  EXPECT_FALSE(t.may_wait());
  t.end_phase();
  EXPECT_TRUE(t.may_wait());
}

TEST(Turn, ThePhaseAfterATakeOverIsExpectedLong) {
  Turn t;
  t.take_over();
  EXPECT_TRUE(t.end_phase());
  EXPECT_TRUE(t.long_phase(kSpilled));  // before any wait of its own
  EXPECT_FALSE(t.end_phase());
  EXPECT_FALSE(t.long_phase(kSpilled));  // two phases on, forgotten
}

TEST(Turn, ThePhaseAfterALongCleanOneIsExpectedLong) {
  Turn t;
  t.on_clean_wait(Turn::kLongCleanPhaseNs - 1);
  t.end_phase();
  EXPECT_FALSE(t.long_phase(kSpilled));
  t.on_clean_wait(Turn::kLongCleanPhaseNs);
  t.end_phase();
  EXPECT_TRUE(t.long_phase(kSpilled));
}

TEST(Turn, EndingAPhaseClearsItsRequestAndWaits) {
  Turn t;
  t.on_busy_wait(9 * kMs, kSpilled);
  t.on_ask();
  EXPECT_FALSE(t.end_phase());
  EXPECT_FALSE(t.asked());
  EXPECT_EQ(t.state(), State::idle);
  EXPECT_FALSE(t.long_phase(kSpilled));  // the 9 ms went with the phase
}

TEST(Turn, RoomGivenIsForgottenOnceItIsBackOrTheRoomWasTakenOver) {
  Turn t;
  t.on_gave_room();
  EXPECT_TRUE(t.gave_room());
  t.on_got_room_back();
  EXPECT_FALSE(t.gave_room());
  t.on_gave_room();
  t.end_phase();  // a phase that did not take over keeps it
  EXPECT_TRUE(t.gave_room());
  t.take_over();
  t.end_phase();
  EXPECT_FALSE(t.gave_room());
}

TEST(Turn, AnExpectationForgottenAsSeenStaysIfSetAgainMeanwhile) {
  Turn t;
  t.set_expected(64 * kMiB);
  t.forget_expected(64 * kMiB);
  EXPECT_EQ(t.expected(), 0u);
  t.set_expected(64 * kMiB);
  const std::uint64_t seen = t.expected();
  t.set_expected(128 * kMiB);
  t.forget_expected(seen);
  EXPECT_EQ(t.expected(), 128 * kMiB);
}

}  // namespace
}  // namespace allocshim
