// Processes under one shared budget with migrate = "auto" (docs/design/oversubscription.md,
// "Shared budgets"): a member asked for room demotes its cold memory at an idle safe point, busy
// safe points ask others for room and promote into it, and two processes take turns. On the fake
// driver, each process with its own core and simulated device.
#include "node_budget_peer.h"

namespace allocshim {
namespace {

// Under migrate = "auto": the child holds 384 MiB of device memory it does not use (a cold
// allocation) and reaches safe points; the parent, holding 64 MiB of its own, allocates 384 MiB
// more. It asks the child first, which demotes the 320 MiB missing to its host memory (same
// addresses, same bytes) and gives the lease back; the parent's allocation waits for it and is
// served from the device, none of it spilled, and its own older 64 MiB stay where they are.
TEST_F(NodeBudgetTest, AProcessAskedForRoomDemotesItsColdMemoryAtItsNextSafePoint) {
  Peer peer;
  spawn_holder(
      peer, shared_auto(5000), 384 * kMiB, [](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
        // Filled before its first safe point, the only place it can demote.
        fake::testing::fill(fake.driver(), a, 384 * kMiB, 5);
        CHILD_CHECK(core.budget().device_report(0).spilled_allocs == 0);  // all on the device
        safe_points_until(core, [&] { return core.budget().device_report(0).demoted_bytes != 0; });
        CHILD_CHECK(core.budget().device_report(0).demoted_bytes ==
                    320 * kMiB);  // what was asked, whole pieces
        CHILD_CHECK(core.budget().node().lease(0) == 64 * kMiB);
        CHILD_CHECK(fake.used(0) == 64 * kMiB);
        CHILD_CHECK(fake::testing::verify(fake.driver(), a, 384 * kMiB, 5));
        const std::string json = core.stats_json();
        CHILD_CHECK(json.find("\"requests\":1,") != std::string::npos);
        CHILD_CHECK(json.find("\"given_bytes\":335544320") != std::string::npos);
        // Later safe points do not take the room back while the parent holds it.
        for (int i = 0; i < 5; ++i) core.at_safe_point(-1);
        CHILD_CHECK(core.budget().device_report(0).promoted_bytes == 0);
        return child_done(p, core, a);
      });
  {
    FakeDriver fake;
    // As in TwoProcessesTakeTurnsAtTheirBusySafePoints: a wait the child's demotion ends, also
    // under TSan on a loaded machine.
    Core core(fake.driver(), load(shared_auto(60000)));
    DevPtr mine = 0, b = 0;
    ASSERT_EQ(try_alloc(core, 64 * kMiB, &mine), res::ok);
    ASSERT_EQ(try_alloc(core, 384 * kMiB, &b), res::ok);
    EXPECT_EQ(core.budget().device_report(0).spilled_allocs, 0u)
        << "served from the device, all of it";
    EXPECT_EQ(core.budget().device_report(0).demoted_bytes, 0u)
        << "the other process's memory moved";
    EXPECT_EQ(fake.used(0), 448 * kMiB);
    EXPECT_EQ(fake.host_used(), 0u);
    expect_waited_once(core, false);
    finish(peer);
    ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
    ASSERT_EQ(core.free(mine, FreeRequest{}), res::ok);
  }
}

// The same child never reaches a safe point, or reaches only busy ones (it waits for the device
// there: it keeps its memory): the parent's allocation waits share_wait_ms, then takes the room
// there is and spills the rest to the host; the child keeps what it holds.
TEST_F(NodeBudgetTest, AProcessThatNeverReachesAnIdleSafePointDelaysADemotionRequestByTheWaitOnly) {
  for (const bool busy : {false, true}) {
    SCOPED_TRACE(busy ? "busy safe points" : "no safe point");
    Peer peer;
    spawn_holder(peer, shared_auto(150), 384 * kMiB,
                 [busy](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
                   if (busy) {
                     const auto asked = [&] {
                       const auto reports = core.budget().node().device_reports();
                       return !reports.empty() && reports[0].requests != 0;
                     };
                     busy_safe_points_until(core, asked);
                     CHILD_CHECK(asked());
                   }
                   CHILD_CHECK(p.recv(p.to_child[0]) == 'x');
                   CHILD_CHECK(core.budget().node().asked() ==
                               !busy);  // busy: taken, and answered with slack only
                   CHILD_CHECK(core.budget().device_report(0).demoted_bytes == 0);
                   CHILD_CHECK(fake.used(0) == 384 * kMiB);
                   CHILD_CHECK(core.free(a, FreeRequest{}) == res::ok);
                   return 0;
                 });
    FakeDriver fake;
    Core core(fake.driver(), load(shared_auto(150)));
    DevPtr b = 0;
    ASSERT_EQ(try_alloc(core, 384 * kMiB, &b), res::ok);
    EXPECT_EQ(fake.used(0), 128 * kMiB) << "the room the node had";
    EXPECT_EQ(core.budget().device_report(0).spilled_bytes, 256 * kMiB);
    expect_waited_once(core, true);
    peer.tell_child('x');
    EXPECT_EQ(peer.join(), 0);
    ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
  }
}

// A process asked for room while it computes keeps its memory, and pins meanwhile the host pieces
// of the demotion those requests make certain, all of them added up (pin_ahead is off): when the
// requester asks again, at its busy safe points once this one is idle, the demotion takes those
// pieces and pins none.
TEST_F(NodeBudgetTest, AProcessAskedWhileItComputesPinsTheHostPiecesOfTheComingDemotion) {
  Peer peer;
  spawn_holder(peer, shared_auto(5000), 384 * kMiB,
               [](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
                 fake::testing::fill(fake.driver(), a, 384 * kMiB, 6);
                 const auto report = [&] { return core.budget().device_report(0); };
                 // Busy while the parent's two allocations ask for the 64 and 192 MiB the node lacks.
                 p.send(p.to_parent[1], 'b');
                 // (An ask taken twice counts twice: a loaded machine may pin a piece more.)
                 busy_safe_points_until(core, [&] { return report().ahead_bytes >= 256 * kMiB; });
                 CHILD_CHECK(report().ahead_bytes >= 256 * kMiB);
                 CHILD_CHECK(report().demoted_bytes == 0);
                 CHILD_CHECK(fake.used(0) == 384 * kMiB);
                 p.send(p.to_parent[1], 'p');
                 // Idle: the parent's busy safe points ask again, and the demotion only copies.
                 CHILD_CHECK(idle_until_demoted(core, 256 * kMiB));
                 CHILD_CHECK(report().ahead_used == 4);
                 CHILD_CHECK(report().reserve_misses == 0);
                 CHILD_CHECK(fake.host_used() == 256 * kMiB + report().ahead_bytes);
                 CHILD_CHECK(fake::testing::verify(fake.driver(), a, 384 * kMiB, 6));
                 return child_done(p, core, a);
               });
  {
    FakeDriver fake;
    Core core(fake.driver(), load(shared_auto(150)));
    DevPtr b = 0, c = 0;
    ASSERT_EQ(peer.hear_from_child(), 'b');
    ASSERT_EQ(try_alloc(core, 192 * kMiB, &b), res::ok);
    ASSERT_EQ(try_alloc(core, 192 * kMiB, &c), res::ok);
    // The child kept its memory: 256 MiB of the parent's is on the host (the second allocation
    // demoted 128 MiB of the first for its own).
    EXPECT_EQ(const_cast<Backend*>(testing::spill_target(core))->movable()->host_bytes(0),
              256 * kMiB);
    fake::testing::fill(fake.driver(), b, 192 * kMiB, 9);
    fake::testing::fill(fake.driver(), c, 192 * kMiB, 10);
    ASSERT_EQ(peer.hear_from_child(), 'p');
    busy_safe_points_until(
        core, [&] { return core.budget().device_report(0).promoted_bytes == 256 * kMiB; });
    EXPECT_EQ(core.budget().device_report(0).promoted_bytes, 256 * kMiB);
    EXPECT_EQ(fake.used(0), 384 * kMiB);
    EXPECT_TRUE(fake::testing::verify(fake.driver(), b, 192 * kMiB, 9));
    EXPECT_TRUE(fake::testing::verify(fake.driver(), c, 192 * kMiB, 10));
    finish(peer);
    ASSERT_EQ(core.free(c, FreeRequest{}), res::ok);
    ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
  }
}

// A process waiting for room from others, with memory of its own on the host, pins nothing for a
// demotion others expect of it: the givers pin for the room it waits for meanwhile, and its
// pinning would slow theirs. Once its memory is back, the host pieces its promotions freed (the
// reserve) and what it pins then cover that demotion. The parent spilled 384 MiB (the
// child reached no safe point) and computes, asking for it; the child, computing too, asks the
// parent for 64 MiB more, which the parent, busy, expects to give later. Then the child idles
// and gives the parent its room.
TEST_F(NodeBudgetTest, AProcessWaitingForRoomPinsNothingAheadUntilItsMemoryIsBack) {
  Peer peer;
  spawn_holder(peer, shared_auto(150), 448 * kMiB, [](Peer& p, FakeDriver&, Core& core, DevPtr a) {
    CHILD_CHECK(p.recv(p.to_child[0]) == 's');  // the parent spilled, and computes
    DevPtr c = 0;
    CHILD_CHECK(try_alloc(core, 64 * kMiB, &c) == res::ok);  // asks the parent, busy
    p.send(p.to_parent[1], 'c');
    CHILD_CHECK(p.recv(p.to_child[0]) == 'i');
    idle_until_readable(core, p.to_child[0]);  // gives the parent its room
    CHILD_CHECK(p.recv(p.to_child[0]) == 'x');
    CHILD_CHECK(core.free(c, FreeRequest{}) == res::ok);
    CHILD_CHECK(core.free(a, FreeRequest{}) == res::ok);
    return 0;
  });
  FakeDriver fake;
  Core core(fake.driver(), load(shared_auto(150)));
  const auto report = [&] { return core.budget().device_report(0); };
  const DevPtr b = spilled_set(core, 448 * kMiB, 384 * kMiB);
  ASSERT_NE(b, 0u);
  core.at_safe_point(0, 5000000);  // computing: asks the child
  peer.tell_child('s');
  busy_safe_points_until(core, [&] {  // takes the child's request, busy
    pollfd said{peer.to_parent[0], POLLIN, 0};
    return ::poll(&said, 1, 0) == 1;
  });
  ASSERT_EQ(peer.hear_from_child(), 'c');
  ASSERT_GT(core.budget().expected_demotion(0), 0u);
  const auto t0 = std::chrono::steady_clock::now();
  busy_safe_points_until(
      core, [&] { return std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(300); });
  EXPECT_EQ(report().ahead_pinned, 0u) << "pinned ahead while it waited for room";
  peer.tell_child('i');
  const auto covered = [&] {
    return report().reserve_bytes + report().ahead_bytes >= core.budget().expected_demotion(0);
  };
  busy_safe_points_until(core, [&] { return report().promoted_bytes == 384 * kMiB && covered(); });
  EXPECT_EQ(report().promoted_bytes, 384 * kMiB);
  EXPECT_TRUE(covered()) << "its memory is back: the demotion expected of it only copies";
  peer.tell_child('x');
  EXPECT_EQ(peer.join(), 0);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
}

// Room a process waited for at an allocation came from another one, which asks for it back at its
// turn: once it computes (not while it idles: the others' moves would stall), the process pins
// the host pieces for giving it (all its device memory here, within the host reserve), so that
// the turn change takes them and pins nothing. What the change did not need stays pinned (until
// unused for pin_ahead_idle_ms, as PinAhead's tests check) but nothing more is pinned.
TEST_F(NodeBudgetTest, AProcessThatGotRoomFromAnotherPinsTheHostPiecesForGivingItBack) {
  Peer peer;
  spawn_holder(
      peer, shared_auto(5000), 384 * kMiB, [](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
        fake::testing::fill(fake.driver(), a, 384 * kMiB, 4);
        CHILD_CHECK(idle_until_demoted(core, 256 * kMiB));  // for the parent's allocation
        CHILD_CHECK(p.recv(p.to_child[0]) == 'p');
        // Its turn: it takes the room back.
        busy_safe_points_until(
            core, [&] { return core.budget().device_report(0).promoted_bytes == 256 * kMiB; });
        CHILD_CHECK(core.budget().device_report(0).promoted_bytes == 256 * kMiB);
        CHILD_CHECK(fake::testing::verify(fake.driver(), a, 384 * kMiB, 4));
        return child_done(p, core, a);
      });
  {
    FakeDriver fake;
    Core core(fake.driver(), load(shared_auto(60000)));
    const DevPtr b = parent_set(fake, core, 384 * kMiB);
    const auto report = [&] { return core.budget().device_report(0); };
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(report().ahead_bytes, 0u) << "nothing pinned while it idles";
    busy_safe_points_until(core, [&] { return report().ahead_bytes == 384 * kMiB; });
    EXPECT_EQ(report().ahead_bytes, 384 * kMiB)
        << "pinned for giving back all of its device memory";
    EXPECT_EQ(fake.host_used(), 384 * kMiB);
    core.at_safe_point(0);  // idle: its turn is over
    peer.tell_child('p');
    ASSERT_TRUE(idle_until_demoted(core, 256 * kMiB));
    EXPECT_EQ(report().ahead_used, 4u);
    EXPECT_EQ(report().reserve_misses, 0u) << "the turn change pinned nothing";
    EXPECT_TRUE(fake::testing::verify(fake.driver(), b, 384 * kMiB, 8));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(report().ahead_bytes, 128 * kMiB)
        << "what the change did not take stays, and no more is pinned";
    EXPECT_EQ(report().ahead_pinned, 6u);
    finish(peer);
    ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
  }
}

// An expected demotion lapses once the process has idled pin_ahead_idle_ms without being asked:
// the others need no room from it. A process that got room and then idles pins nothing when it
// computes later, its pinner stops looking whether it computes, and its budget expects nothing
// more (a later request would add to what is left).
TEST_F(NodeBudgetTest, AnExpectedDemotionNobodyAsksForLapsesWhileTheProcessIdles) {
  Peer peer;
  spawn_holder(peer, shared_auto(5000), 384 * kMiB,
               [](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
                 fake::testing::fill(fake.driver(), a, 384 * kMiB, 4);
                 CHILD_CHECK(idle_until_demoted(core, 256 * kMiB));  // for the parent's allocation
                 CHILD_CHECK(fake::testing::verify(fake.driver(), a, 384 * kMiB, 4));
                 return child_done(p, core, a);
               });
  {
    FakeDriver fake;
    Core core(fake.driver(),
              load(shared_auto(60000) + "[backends.host]\npin_ahead_idle_ms = 100\n"));
    const DevPtr b =
        parent_set(fake, core, 384 * kMiB);  // got room from the child: expects to give it
    std::this_thread::sleep_for(std::chrono::seconds(1));  // idle, nobody asks
    EXPECT_EQ(core.budget().expected_demotion(0), 0u) << "the budget still expects what lapsed";
    const auto start = std::chrono::steady_clock::now();
    busy_safe_points_until(core, [&] {
      return std::chrono::steady_clock::now() - start > std::chrono::milliseconds(500);
    });
    EXPECT_EQ(core.budget().device_report(0).ahead_pinned, 0u)
        << "pinned for an expectation that lapsed";
    EXPECT_EQ(fake.host_used(), 0u);
    finish(peer);
    ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
  }
}

// Two processes under migrate = "auto" that each keep more than half the budget hot take turns:
// a busy safe point (the program waited for the device) asks the other process, idle at its safe
// points, for room, and promotes its own memory into it; a process that gave room while idle
// asks for it back at its next busy safe point; idle safe points ask nobody. Memory that comes
// back to the host takes the host pieces its promotion freed (the host reserve).
TEST_F(NodeBudgetTest, TwoProcessesTakeTurnsAtTheirBusySafePoints) {
  Peer peer;
  spawn_holder(
      peer, shared_auto(5000), 384 * kMiB, [](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
        fake::testing::fill(fake.driver(), a, 384 * kMiB, 7);  // before its first safe point
        // Idle: the parent's allocation asks for room, given by demotion.
        safe_points_until(core, [&] { return core.budget().device_report(0).demoted_bytes != 0; });
        CHILD_CHECK(core.budget().device_report(0).demoted_bytes == 256 * kMiB);
        CHILD_CHECK(p.recv(p.to_child[0]) == 'd');  // the parent holds its set, idle
        // Busy: the hold ends, the parent is asked once and gives the room, promoted as it comes.
        busy_safe_points_until(
            core, [&] { return core.budget().device_report(0).promoted_bytes == 256 * kMiB; });
        CHILD_CHECK(core.budget().device_report(0).promoted_bytes == 256 * kMiB);
        CHILD_CHECK(fake.used(0) == 384 * kMiB);
        CHILD_CHECK(fake::testing::verify(fake.driver(), a, 384 * kMiB, 7));
        CHILD_CHECK(core.budget().device_report(0).reserve_bytes == 256 * kMiB);
        p.send(p.to_parent[1], 'e');
        // Idle again: the parent's next busy safe point takes the room back.
        safe_points_until(
            core, [&] { return core.budget().device_report(0).demoted_bytes == 512 * kMiB; });
        CHILD_CHECK(core.budget().device_report(0).demoted_bytes == 512 * kMiB);
        CHILD_CHECK(core.budget().device_report(0).reserve_hits ==
                    4);  // no pinning the second time
        CHILD_CHECK(fake::testing::verify(fake.driver(), a, 384 * kMiB, 7));
        const std::string json = core.stats_json();
        CHILD_CHECK(json.find("\"requests\":2,") !=
                    std::string::npos);  // the allocation, one busy point
        return child_done(p, core, a);
      });
  {
    FakeDriver fake;
    // The allocation waits for the child's demotion, which under TSan on a loaded machine took
    // longer than 5 s; the wait ends as soon as the room is given.
    Core core(fake.driver(), load(shared_auto(60000)));
    const DevPtr b = parent_set(fake, core, 384 * kMiB);
    for (int i = 0; i < 5; ++i) core.at_safe_point(0);  // idle: asks nobody
    peer.tell_child('d');
    safe_points_until(core, [&] { return core.budget().device_report(0).demoted_bytes != 0; });
    EXPECT_EQ(core.budget().device_report(0).demoted_bytes, 256 * kMiB);
    EXPECT_TRUE(fake::testing::verify(fake.driver(), b, 384 * kMiB, 8));
    ASSERT_EQ(peer.hear_from_child(), 'e');
    // Gave while idle, busy again: asks the child back.
    busy_safe_points_until(
        core, [&] { return core.budget().device_report(0).promoted_bytes == 256 * kMiB; });
    EXPECT_EQ(core.budget().device_report(0).promoted_bytes, 256 * kMiB);
    EXPECT_EQ(fake.used(0), 384 * kMiB);
    check_and_free_set(fake, core, peer, b, 384 * kMiB);
  }
}

// A short busy phase asks once, for one safe point's promotion: moving more would cost it more
// than reading the rest over the link. One that keeps waiting asks again, for everything spilled,
// once its waits, with one more like the last, reach the time moving that back takes, and waits
// at that safe point for what the other process gives: a process with 384 MiB on the host gets
// the first 256 MiB from its first ask, and the other 128 MiB at the safe point where its waits
// reach 5 ms and the next 1 ms wait would pass 5.6, not at that next one, after 2 s or a
// wall-clock second.
TEST_F(NodeBudgetTest, ALongBusyPhaseAsksAgainForWhatItSpilled) {
  Peer peer;
  // The child's take-over waits share_wait_ms at most for each piece the parent gives, and the
  // moves of the fake driver take seconds under TSan on a loaded machine: the wait is long.
  spawn_holder(
      peer, shared_auto(60000), 448 * kMiB, [](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
        fake::testing::fill(fake.driver(), a, 448 * kMiB, 7);
        safe_points_until(core, [&] { return core.budget().device_report(0).demoted_bytes != 0; });
        CHILD_CHECK(core.budget().device_report(0).demoted_bytes ==
                    384 * kMiB);                    // room for the parent
        CHILD_CHECK(p.recv(p.to_child[0]) == 'd');  // the parent holds its set, idle
        const auto asks = [&] {
          const auto reports = core.budget().node().device_reports();
          return reports.empty() ? 0 : reports[0].asks;
        };
        const auto promoted = [&] { return core.budget().device_report(0).promoted_bytes; };
        // Short: the first busy safe point asks for one safe point's promotion (256 MiB); the child
        // makes no safe point until the parent gave it, then takes it at one 1 ms safe point.
        core.at_safe_point(0, 1000000);
        CHILD_CHECK(asks() == 1);
        p.send(p.to_parent[1], 'a');
        CHILD_CHECK(p.recv(p.to_child[0]) == 'g');
        core.at_safe_point(0, 1000000);
        CHILD_CHECK(promoted() == 256 * kMiB);
        p.send(p.to_parent[1], 'p');
        // 128 MiB still spilled: long once the waits, with one more like the last, reach 5.6 ms
        // (Turn::long_phase_ns). 4 ms in all, 1 ms each, stays short and asks nothing more.
        constexpr std::uint64_t kLong = 128 * kMiB / Turn::kHandOverBytesPerNs, kMs = 1000000;
        static_assert(4 * kMs + 1 * kMs < kLong);
        for (int i = 0; i < 2; ++i) core.at_safe_point(0, kMs);
        CHILD_CHECK(asks() == 1);
        // Long at the next 1 ms wait: the waits are 5 ms and the next would pass 5.6. It asks again
        // there, for the rest, and takes the room over: that safe point waits for the parent's
        // demotion and promotes what it gives. Waiting for the waits to pass 5.6 asks at the second.
        static_assert(5 * kMs < kLong && 5 * kMs + 1 * kMs >= kLong);
        int points = 0;
        while (asks() < 2 && points < 400) {
          core.at_safe_point(0, kMs);
          ++points;
        }
        std::fprintf(stderr, "busy safe points until the second ask: %d\n", points);
        CHILD_CHECK(points == 1);
        CHILD_CHECK(promoted() == 384 * kMiB);
        const auto end = std::chrono::steady_clock::now() + kPeerWait;
        while (promoted() < 384 * kMiB && std::chrono::steady_clock::now() < end) {
          core.at_safe_point(0, 5000000);
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        CHILD_CHECK(promoted() == 384 * kMiB);
        CHILD_CHECK(fake.used(0) == 448 * kMiB);
        CHILD_CHECK(fake::testing::verify(fake.driver(), a, 448 * kMiB, 7));
        return child_done(p, core, a, 'e');
      });
  {
    FakeDriver fake;
    Core core(
        fake.driver(),
        load(shared_auto(60000)));  // as in the test above: the child's demotion ends the wait
    const DevPtr b = parent_set(fake, core, 448 * kMiB);
    peer.tell_child('d');
    ASSERT_EQ(peer.hear_from_child(), 'a');
    ASSERT_TRUE(idle_until_demoted(core, 256 * kMiB));  // answers the child's request
    peer.tell_child('g');
    // No safe point until the child took the room (past its hold, an idle parent takes free room).
    ASSERT_EQ(peer.hear_from_child(), 'p');
    // Idle until the child has everything back (it may take some room back meanwhile, and give it
    // again: its hold ends after a second).
    const char said = idle_until_child_speaks(core, peer);
    EXPECT_GE(core.budget().device_report(0).demoted_bytes, 384 * kMiB);
    ASSERT_EQ(said, 'e');
    check_and_free_set(fake, core, peer, b, 448 * kMiB);
  }
}

// A phase that took the room over predicts the next one takes it over too (a process taking
// turns with another takes it over every turn): the child's first busy phase waits 50 ms at each
// safe point with memory spilled until it is long, asks for everything and gets it back; the
// parent then takes the room back. The child's next phase asks for all 384 MiB at its first busy
// safe point, a 1 ms one (promote_bound(1 ms), what a phase that is not taking over asks for
// there, is 256 MiB), and promotes them there, waiting while the parent demotes.
TEST_F(NodeBudgetTest, APhaseThatTookTheRoomOverPredictsTheNextOneTakesItOver) {
  static_assert(Migration::promote_bound(1000000) < 384 * kMiB);
  Peer peer;
  spawn_holder(
      peer, shared_auto(60000), 448 * kMiB, [](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
        fake::testing::fill(fake.driver(), a, 448 * kMiB, 7);
        const auto report = [&] { return core.budget().device_report(0); };
        const auto idle_until = [&](auto done) {
          const auto end = std::chrono::steady_clock::now() + kPeerWait;
          while (!done() && std::chrono::steady_clock::now() < end) {
            core.at_safe_point(-1);
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        };
        idle_until([&] { return report().demoted_bytes >= 384 * kMiB; });  // room for the parent
        CHILD_CHECK(report().demoted_bytes == 384 * kMiB);
        CHILD_CHECK(p.recv(p.to_child[0]) == 'd');  // the parent holds its set, idle
        // Slow with memory spilled: 50 ms waits until everything is back.
        for (int i = 0; i < 2400 && report().promoted_bytes < 384 * kMiB; ++i) {
          core.at_safe_point(0, 50000000);
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        CHILD_CHECK(report().promoted_bytes == 384 * kMiB);
        p.send(p.to_parent[1], 'p');
        idle_until([&] { return fake.used(0) == 64 * kMiB; });  // the parent takes its room back
        CHILD_CHECK(fake.used(0) == 64 * kMiB);
        CHILD_CHECK(p.recv(p.to_child[0]) == 'q');  // the parent is idle again, at its safe points
        const std::uint64_t before = report().promoted_bytes;
        core.at_safe_point(0, 1000000);
        CHILD_CHECK(report().promoted_bytes - before == 384 * kMiB);
        CHILD_CHECK(fake::testing::verify(fake.driver(), a, 448 * kMiB, 7));
        return child_done(p, core, a, 'e');
      });
  {
    FakeDriver fake;
    Core core(fake.driver(), load(shared_auto(60000)));
    const DevPtr b = parent_set(fake, core, 448 * kMiB);
    peer.tell_child('d');
    ASSERT_EQ(idle_until_child_speaks(core, peer), 'p');
    // Busy until all of its set is back (its phase too gets long and asks for the rest).
    const auto end = std::chrono::steady_clock::now() + kPeerWait;
    while (fake.used(0) < 448 * kMiB && std::chrono::steady_clock::now() < end) {
      core.at_safe_point(0, 50000000);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(fake.used(0), 448 * kMiB);
    peer.tell_child('q');
    const std::uint64_t gave = core.budget().device_report(0).demoted_bytes;
    ASSERT_EQ(idle_until_child_speaks(core, peer), 'e');  // answers the child's one request
    EXPECT_EQ(core.budget().device_report(0).demoted_bytes - gave, 384 * kMiB);
    check_and_free_set(fake, core, peer, b, 448 * kMiB);
  }
}

// What a phase computed with all its memory on the device predicts the next one, and such a phase
// takes the room over: the child ran 600 ms of busy safe points with nothing spilled, then idled
// and gave the parent 384 MiB. Its next phase asks for all of it at once (the parent gives 384 MiB
// for that one request, not 256 MiB) and waits while the parent demotes, promoting what arrives:
// when its first busy safe point returns, or, if the phase starts with a launch that names the
// spilled memory, before that launch runs, everything is back (promote_bound(5 ms), what a phase
// that is not taking over promotes at a safe point, is 256 MiB). Having taken the room over, it
// pins while it computes the rest of what giving back all its device memory needs (its
// promotions' 384 MiB of host pieces are in the reserve: one 64 MiB piece more).
TEST_F(NodeBudgetTest, APhaseAfterOneThatComputedLongTakesTheRoomOverAtOnce) {
  static_assert(Migration::promote_bound(5000000) < 384 * kMiB);
  for (const bool at_launch : {false, true}) {
    SCOPED_TRACE(at_launch ? "the first launch" : "the first busy safe point");
    Peer peer;
    spawn_holder(
        peer, shared_auto(60000), 448 * kMiB,
        [at_launch](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
          fake::testing::fill(fake.driver(), a, 448 * kMiB, 7);
          const auto report = [&] { return core.budget().device_report(0); };
          for (int i = 0; i < 120; ++i)
            core.at_safe_point(0, 5000000);  // computing, nothing spilled
          p.send(p.to_parent[1], 'c');
          const auto end = std::chrono::steady_clock::now() + kPeerWait;
          while (report().demoted_bytes < 384 * kMiB && std::chrono::steady_clock::now() < end) {
            core.at_safe_point(-1);  // idle: gives the parent room
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          CHILD_CHECK(report().demoted_bytes == 384 * kMiB);
          CHILD_CHECK(p.recv(p.to_child[0]) ==
                      'd');  // the parent holds its set, idle at its safe points
          if (at_launch) {
            CHILD_CHECK(core.budget().promote_ahead(0, {a}, {a}) == 384 * kMiB);
            CHILD_CHECK(core.budget().receiving(0));
            // The launch's phase ends at an idle safe point, as one that waited at busy ones does:
            // its asks are over.
            core.at_safe_point(0);
            CHILD_CHECK(!core.budget().receiving(0));
          } else {
            core.at_safe_point(0, 5000000);
          }
          CHILD_CHECK(report().promoted_bytes == 384 * kMiB);
          CHILD_CHECK(fake.used(0) == 448 * kMiB);
          CHILD_CHECK(fake::testing::verify(fake.driver(), a, 448 * kMiB, 7));
          // The host pieces for giving all 448 MiB back: those its promotions freed, less any it
          // passed to the parent's demotion (as many as came before the parent's steps: timing),
          // and the rest pinned ahead while it computes.
          const std::uint64_t passed = core.budget().node().device_reports()[0].pieces_sent;
          CHILD_CHECK(report().reserve_bytes + passed == 384 * kMiB);
          const auto held = [&] { return report().reserve_bytes + report().ahead_bytes; };
          const auto pinned = std::chrono::steady_clock::now() + kPeerWait;
          while (held() != 448 * kMiB && std::chrono::steady_clock::now() < pinned) {
            core.at_safe_point(0, 5000000);  // computing
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          CHILD_CHECK(report().ahead_bytes == 64 * kMiB + passed);
          CHILD_CHECK(held() == 448 * kMiB);
          return child_done(p, core, a, 'e');
        });
    FakeDriver fake;
    Core core(fake.driver(), load(shared_auto(60000)));
    const auto [b, said] = hold_set_while_child_takes_over(fake, core, peer, 448 * kMiB);
    ASSERT_EQ(said, 'e');  // answers the child's request meanwhile
    EXPECT_EQ(core.budget().device_report(0).demoted_bytes, 384 * kMiB);
    const auto reports = core.budget().node().device_reports();
    ASSERT_FALSE(reports.empty());
    EXPECT_EQ(reports[0].requests, 1u);
    check_and_free_set(fake, core, peer, b, 448 * kMiB);
  }
}

// A member that gave its memory to another while idle takes the room back at its first launch
// that names the memory, before the kernel runs, with no phase of its own to go by: the child
// gives the parent 384 MiB without having computed before, and its first launch gets all of it
// back, waiting while the parent demotes (without the prior it would read its memory over the
// link until a busy safe point found the phase long, and the launch would take nothing).
TEST_F(NodeBudgetTest, AMemberThatGaveRoomTakesItBackAtItsFirstLaunch) {
  Peer peer;
  spawn_holder(peer, shared_auto(60000), 448 * kMiB, child_gives_room_then_launches);
  FakeDriver fake;
  Core core(fake.driver(), load(shared_auto(60000)));
  const auto [b, said] = hold_set_while_child_takes_over(fake, core, peer, 448 * kMiB);
  ASSERT_EQ(said, 'e');  // answers the child's request meanwhile
  EXPECT_EQ(core.budget().device_report(0).demoted_bytes, 384 * kMiB);
  check_and_free_set(fake, core, peer, b, 448 * kMiB);
}

// Room given and had back is no prior: the child gives the parent 384 MiB, and once the parent
// frees its set, promotes all of it back at idle safe points. Its memory spilled later for a
// reason of its own (an allocation past the room the parent holds, which waits the child's
// share_wait_ms of 300 ms for nothing) is read over the link like any phase's with no evidence:
// the first launch that names it asks nobody.
TEST_F(NodeBudgetTest, RoomGivenAndHadBackIsNoReasonToTakeTheRoomOver) {
  Peer peer;
  spawn_holder(
      peer, shared_auto(300), 448 * kMiB, [](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
        const auto report = [&] { return core.budget().device_report(0); };
        const auto asks = [&] { return core.budget().node().device_reports()[0].asks; };
        fake::testing::fill(fake.driver(), a, 448 * kMiB, 7);
        p.send(p.to_parent[1], 'c');
        CHILD_CHECK(idle_until_demoted(core, 384 * kMiB));  // gives the parent room
        CHILD_CHECK(p.recv(p.to_child[0]) == 'd');          // the parent freed it
        safe_points_until(core, [&] { return report().promoted_bytes == 384 * kMiB; });
        CHILD_CHECK(report().promoted_bytes == 384 * kMiB);  // all of it back, no take-over
        core.at_safe_point(-1);
        p.send(p.to_parent[1], 'b');
        CHILD_CHECK(p.recv(p.to_child[0]) == 'h');  // the parent holds the rest of the room
        DevPtr c = 0;
        CHILD_CHECK(try_alloc(core, 128 * kMiB, &c) == res::ok);  // waits 300 ms for nothing
        const std::uint64_t asked = asks();
        CHILD_CHECK(core.budget().promote_ahead(0, {a, c}, {a, c}) == 0);
        CHILD_CHECK(asks() == asked);
        CHILD_CHECK(!core.budget().receiving(0));
        CHILD_CHECK(fake::testing::verify(fake.driver(), a, 448 * kMiB, 7));
        CHILD_CHECK(core.free(c, FreeRequest{}) == res::ok);
        return child_done(p, core, a);
      });
  FakeDriver fake;
  Core core(fake.driver(),
            load(shared_auto(60000)));  // a wait the child's demotion ends, also under load
  ASSERT_EQ(peer.hear_from_child(), 'c');
  const DevPtr b = parent_set(fake, core, 448 * kMiB);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
  peer.tell_child('d');
  ASSERT_EQ(peer.hear_from_child(), 'b');
  DevPtr h = 0;
  ASSERT_EQ(try_alloc(core, 64 * kMiB, &h), res::ok);
  peer.tell_child('h');
  finish(peer);  // no safe point meanwhile: the child's allocation gets nothing from here
  ASSERT_EQ(core.free(h, FreeRequest{}), res::ok);
}

// A free that gives room back while another member waits for room demotes nothing at that free:
// a program freeing tends to free more (at its end), and demoting would copy memory about to be
// freed. The child takes the room over while the parent, asked for 384 MiB, frees its 192 and
// 256 MiB allocations one after the other: the child gets all of it from the frees, and the
// parent moves none of its memory (answering at the first free would demote 192 MiB of the
// second allocation before it is freed).
TEST_F(NodeBudgetTest, AFreeThatGivesRoomToAWaitingMemberDemotesNothing) {
  Peer peer;
  spawn_holder(peer, shared_auto(60000), 448 * kMiB, child_gives_room_then_launches);
  FakeDriver fake;
  Core core(fake.driver(), load(shared_auto(60000)));
  ASSERT_EQ(peer.hear_from_child(), 'c');
  DevPtr x = 0, y = 0;
  ASSERT_EQ(try_alloc(core, 192 * kMiB, &x), res::ok);
  ASSERT_EQ(try_alloc(core, 256 * kMiB, &y), res::ok);
  ASSERT_EQ(fake.used(0), 448 * kMiB) << "the child made room";
  peer.tell_child('d');
  // No safe point until the child's request is there: then the frees are the only answer.
  const auto end = std::chrono::steady_clock::now() + kPeerWait;
  while (!core.budget().node().asked() && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(core.budget().node().asked());
  ASSERT_EQ(core.free(x, FreeRequest{}), res::ok);
  ASSERT_EQ(core.free(y, FreeRequest{}), res::ok);
  ASSERT_EQ(idle_until_child_speaks(core, peer), 'e');
  EXPECT_EQ(core.budget().device_report(0).demoted_bytes, 0u);
  EXPECT_EQ(fake.host_used(), 0u);
  finish(peer);
}

// The room a giver frees for a take-over is the taker's as soon as it is free, however slowly the
// taker's moves go: its first promotion claims all of it. The child's promotions take 300 ms a
// piece here, six pieces in all, longer than the parent's hold after giving (kYieldHoldMs); the
// parent, idle, would otherwise move its own memory back into what the child had not claimed yet,
// and the child's take-over would wait share_wait_ms for its last pieces.
TEST_F(NodeBudgetTest, TheRoomGivenForATakeOverIsClaimedAsSoonAsItIsFree) {
  static_assert(6 * 300 > NodeBudget::kYieldHoldMs);
  // The waits only bound what nobody gives: long, so that a sanitizer's slow moves never pass them.
  const std::string policy = shared_auto(60000);
  Peer peer;
  spawn_holder(peer, policy, 448 * kMiB, [](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
    const auto report = [&] { return core.budget().device_report(0); };
    if (const int failed = child_gives_room(p, fake, core, a)) return failed;
    fake.on_call(FakeOp::memcpy_dtod,
                 [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); });
    core.at_safe_point(0, 5000000);  // takes the room over
    fake.on_call(FakeOp::memcpy_dtod, nullptr);
    CHILD_CHECK(report().promoted_bytes == 384 * kMiB);
    CHILD_CHECK(fake::testing::verify(fake.driver(), a, 448 * kMiB, 7));
    return child_done(p, core, a, 'e');
  });
  FakeDriver fake;
  Core core(fake.driver(), load(policy));
  const auto [b, said] = hold_set_while_child_takes_over(fake, core, peer, 448 * kMiB);
  ASSERT_EQ(said, 'e');  // answers the child's request meanwhile
  EXPECT_EQ(core.budget().device_report(0).promoted_bytes, 0u)
      << "took none of the room it gave back";
  check_and_free_set(fake, core, peer, b, 448 * kMiB);
}

// A phase that takes the room over keeps every host piece its promotions free, past host_reserve
// (128 MiB here), except those it passes to the giver (as many as the giver's reserve may keep):
// it gives that room back at the next turn change, and the pieces pinned anew there would stall
// both processes' moves. Once that hand-over is no longer expected (nobody asked while it idled
// pin_ahead_idle_ms), the reserve keeps host_reserve's worth again.
TEST_F(NodeBudgetTest, ATakeOverKeepsTheHostPiecesForGivingTheRoomBack) {
  const std::string policy =
      shared_auto(60000) + "[backends.host]\nhost_reserve = \"128MiB\"\npin_ahead_idle_ms = 100\n";
  Peer peer;
  spawn_holder(peer, policy, 448 * kMiB, [](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
    const auto report = [&] { return core.budget().device_report(0); };
    if (const int failed = child_gives_room(p, fake, core, a)) return failed;
    CHILD_CHECK(report().reserve_bytes == 0);
    CHILD_CHECK(core.budget().promote_ahead(0, {a}, {a}) == 384 * kMiB);  // takes the room over
    const std::uint64_t passed = core.budget().node().device_reports()[0].pieces_sent;
    CHILD_CHECK(passed <= 128 * kMiB);
    CHILD_CHECK(report().reserve_bytes + passed == 384 * kMiB);
    core.at_safe_point(0, 5000000);  // computing
    CHILD_CHECK(fake::testing::verify(fake.driver(), a, 448 * kMiB, 7));
    core.at_safe_point(-1);  // idle: the phase ends, and nobody asks
    const auto kept = [&] { return report().reserve_bytes + report().ahead_bytes <= 128 * kMiB; };
    const auto end = std::chrono::steady_clock::now() + kPeerWait;
    while (!kept() && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHILD_CHECK(kept());
    CHILD_CHECK(report().reserve_bytes > 0);
    return child_done(p, core, a);
  });
  FakeDriver fake;
  Core core(fake.driver(), load(policy));
  const auto [b, said] = hold_set_while_child_takes_over(fake, core, peer, 448 * kMiB);
  ASSERT_EQ(said, 'g');  // answers the child's take-over meanwhile
  free_set_after_child(fake, core, peer, b, 448 * kMiB);
}

// A giver demotes into the host pieces the taker's promotions free instead of pinning its own: the
// parent gives the child's take-over 384 MiB in two steps; the first pins its four 64 MiB pieces,
// the child promotes into that room and passes the two pieces the second step lacks, and no
// more. Both sets keep their data.
TEST_F(NodeBudgetTest, AGiverDemotesIntoTheHostPiecesTheTakerPasses) {
  Peer peer;
  spawn_holder(
      peer, shared_auto(60000), 448 * kMiB, [](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
        if (const int failed = child_gives_room(p, fake, core, a)) return failed;
        CHILD_CHECK(core.budget().promote_ahead(0, {a}, {a}) == 384 * kMiB);  // takes the room over
        CHILD_CHECK(core.budget().node().device_reports()[0].pieces_sent ==
                    128 * kMiB);  // the second step's
        CHILD_CHECK(core.budget().node().device_reports()[0].pieces_received == 0);
        CHILD_CHECK(fake::testing::verify(fake.driver(), a, 448 * kMiB, 7));
        return child_done(p, core, a);
      });
  FakeDriver fake;
  Core core(fake.driver(), load(shared_auto(60000)));
  core.budget().set_piece_wait_ms(30000);  // the child's moves are memcpy on a loaded machine
  const auto [b, said] = hold_set_while_child_takes_over(fake, core, peer, 448 * kMiB);
  ASSERT_EQ(said, 'g');  // answers the child's take-over meanwhile
  const Budget::DeviceReport r = core.budget().device_report(0);
  EXPECT_EQ(r.demoted_bytes, 384 * kMiB);
  EXPECT_EQ(r.reserve_misses, 4u) << "pinned the first step only";
  EXPECT_EQ(r.reserve_hits, 2u) << "the second step took the child's pieces";
  EXPECT_EQ(core.budget().node().device_reports()[0].pieces_received, 128 * kMiB);
  EXPECT_EQ(core.budget().node().device_reports()[0].pieces_sent, 0u);
  free_set_after_child(fake, core, peer, b, 448 * kMiB);
}

// Pieces pass both ways, one turn change after the other: the child takes the room over and
// passes the parent two pieces, which the parent demotes into; at the parent's turn (its first
// launch takes the room over, since it gave room) its promotions free its four own pieces and
// those two, and the child, giving the room back with four pieces of its own, lacks two: the
// parent passes two (its own: an imported piece cannot be exported again,
// Migrate.OnlyTheHostPiecesThisProcessPinnedArePassedOn), and the child pins nothing anew.
TEST_F(NodeBudgetTest, PiecesPassBothWaysAtConsecutiveTurnChanges) {
  Peer peer;
  spawn_holder(
      peer, shared_auto(60000), 448 * kMiB, [](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
        const auto report = [&] { return core.budget().device_report(0); };
        const auto pieces = [&] { return core.budget().node().device_reports()[0]; };
        if (const int failed = child_gives_room(p, fake, core, a)) return failed;
        CHILD_CHECK(report().reserve_misses == 6);  // its 384 MiB pinned anew
        core.budget().set_piece_wait_ms(
            30000);  // the parent's moves are memcpy on a loaded machine
        CHILD_CHECK(core.budget().promote_ahead(0, {a}, {a}) == 384 * kMiB);  // takes the room over
        CHILD_CHECK(pieces().pieces_sent == 128 * kMiB);
        core.at_safe_point(-1);  // idle: its turn is over
        p.send(p.to_parent[1], 't');
        idle_until_readable(core, p.to_child[0]);  // gives the room back
        CHILD_CHECK(p.recv(p.to_child[0]) == 'b');
        CHILD_CHECK(report().demoted_bytes == 2 * 384 * kMiB);
        CHILD_CHECK(pieces().pieces_received == 128 * kMiB);
        CHILD_CHECK(report().reserve_misses == 6);  // nothing pinned anew for giving the room back
        CHILD_CHECK(fake::testing::verify(fake.driver(), a, 448 * kMiB, 7));
        return child_done(p, core, a);
      });
  FakeDriver fake;
  Core core(fake.driver(), load(shared_auto(60000)));
  core.budget().set_piece_wait_ms(30000);
  const auto [b, said] = hold_set_while_child_takes_over(fake, core, peer, 448 * kMiB);
  ASSERT_EQ(said, 't');  // answers the child's take-over meanwhile
  ASSERT_EQ(core.budget().node().device_reports()[0].pieces_received, 128 * kMiB);
  // Its turn: it gave the child room, so its first launch takes the room over.
  EXPECT_EQ(core.budget().promote_ahead(0, {b}, {b}), 384 * kMiB);
  EXPECT_EQ(core.budget().node().device_reports()[0].pieces_sent, 128 * kMiB);
  EXPECT_TRUE(fake::testing::verify(fake.driver(), b, 448 * kMiB, 8));
  peer.tell_child('b');
  finish(peer);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
}

// A request made before the giver's last gives arrived, for more than the giver now holds, still
// gets the rest: the child takes the room over, then the parent's turn asks it for 256 MiB (a short
// phase) and, turning long before those arrive, for all 384 MiB it spilled. The child, holding
// 192 MiB once it gave the 256, gives the other 128 too (the request's bytes less the room nobody
// leases, then bounded by what it holds, not the other way round, which gave nothing), and the
// parent's take-over gets everything within its wait.
TEST_F(NodeBudgetTest, ARequestForMoreThanTheGiverHoldsStillGetsTheRest) {
  Peer peer;
  spawn_holder(
      peer, shared_auto(60000), 448 * kMiB, [](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
        if (const int failed = child_gives_room(p, fake, core, a)) return failed;
        CHILD_CHECK(core.budget().promote_ahead(0, {a}, {a}) == 384 * kMiB);  // takes it over
        core.at_safe_point(-1);  // idle: its turn is over
        p.send(p.to_parent[1], 't');
        idle_until_readable(core, p.to_child[0]);  // answers the parent's requests
        CHILD_CHECK(p.recv(p.to_child[0]) == 'b');
        CHILD_CHECK(fake::testing::verify(fake.driver(), a, 448 * kMiB, 7));
        return child_done(p, core, a);
      });
  FakeDriver fake;
  Core core(fake.driver(), load(shared_auto(60000)));
  const auto [b, said] = hold_set_while_child_takes_over(fake, core, peer, 448 * kMiB);
  ASSERT_EQ(said, 't');  // answers the child's take-over meanwhile
  busy_safe_points_until(
      core, [&] { return core.budget().device_report(0).promoted_bytes == 384 * kMiB; });
  EXPECT_EQ(core.budget().device_report(0).promoted_bytes, 384 * kMiB);
  EXPECT_TRUE(fake::testing::verify(fake.driver(), b, 448 * kMiB, 8));
  peer.tell_child('b');
  finish(peer);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
}

// A request answered after the room it asked for came free some other way moves nothing: the
// parent asks the child for 256 MiB (its allocation spills when the wait ends), then frees as much
// of its own. The child answers at its next idle safe point by giving only what the node does
// not have free (on the H100, a process taking turns asked again while the other was still
// demoting for its first ask, and received the same room twice).
TEST_F(NodeBudgetTest, ARequestForRoomThatCameFreeMovesNothing) {
  Peer peer;
  spawn_holder(
      peer, shared_auto(5000), 256 * kMiB, [](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
        CHILD_CHECK(p.recv(p.to_child[0]) == 'f');  // asked, and the parent freed 256 MiB since
        CHILD_CHECK(core.budget().node().asked());
        for (int i = 0; i < 5; ++i) core.at_safe_point(-1);
        CHILD_CHECK(!core.budget().node().asked());
        const auto reports = core.budget().node().device_reports();
        CHILD_CHECK(!reports.empty() && reports[0].requests == 1);
        CHILD_CHECK(core.budget().device_report(0).demoted_bytes == 0);
        CHILD_CHECK(fake.used(0) == 256 * kMiB);
        return child_done(p, core, a);
      });
  FakeDriver fake;
  // Spilling without migration: the parent's own memory stays where it is.
  Core core(fake.driver(),
            load("[budget]\ndevice = \"512MiB\"\nspill = \"host\"\nshare = \"user\"\n"
                 "share_wait_ms = 150\n"));
  DevPtr mine = 0, b = 0;
  ASSERT_EQ(try_alloc(core, 256 * kMiB, &mine), res::ok);
  ASSERT_EQ(try_alloc(core, 256 * kMiB, &b), res::ok);  // asks the child, waits, spills
  ASSERT_EQ(core.budget().device_report(0).spilled_bytes, 256 * kMiB);
  ASSERT_EQ(core.free(mine, FreeRequest{}), res::ok);  // its lease goes back to the node
  peer.tell_child('f');
  finish(peer);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
}

// A take-over that gets nothing costs share_wait_ms once, and fewer phases wait the more often it
// happens: the child holds its memory and never reaches a safe point (a process busy for good, or
// waiting on something else). The parent spilled 256 MiB; each of its phases (ten 5 ms busy safe
// points, then an idle one) is long after 16 ms of waits and asks the child for room. The 1st
// waits 150 ms for it, then the 3rd, then the 7th: after n take-overs that got nothing, the next
// 2^n - 1 phases do not wait.
TEST_F(NodeBudgetTest, ATakeOverNobodyAnswersWaitsInFewerPhasesEachTime) {
  Peer peer;
  spawn_holder(peer, shared_auto(150), 384 * kMiB, [](Peer& p, FakeDriver&, Core& core, DevPtr a) {
    CHILD_CHECK(p.recv(p.to_child[0]) == 'x');
    CHILD_CHECK(core.budget().device_report(0).demoted_bytes == 0);
    CHILD_CHECK(core.free(a, FreeRequest{}) == res::ok);
    return 0;
  });
  FakeDriver fake;
  Core core(fake.driver(), load(shared_auto(150)));
  const DevPtr b = spilled_set(core, 384 * kMiB, 256 * kMiB);
  ASSERT_NE(b, 0u);
  std::string waited;
  for (int phase = 1; phase <= 7; ++phase) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) core.at_safe_point(0, 5000000);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    waited += ms >= 150 ? 'W' : '-';
    EXPECT_LT(ms, 2 * 150) << "phase " << phase << " waited more than once";
    core.at_safe_point(0);  // idle: the phase ends
  }
  EXPECT_EQ(waited, "W-W---W");
  EXPECT_EQ(core.budget().device_report(0).promoted_bytes, 0u);
  peer.tell_child('x');
  EXPECT_EQ(peer.join(), 0);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
}

// A giver that is only slow (it pins its first demotion, say) does not make the taker's next
// phases skip their wait: the parent's first take-over waits 150 ms for nothing and stops waiting,
// then the child gives the room while the phase goes on and the phase promotes it. The parent's
// next phase with memory on the host (an allocation the child, no longer at safe points, does not
// answer, demotes some of the parent's own) waits again for the room.
TEST_F(NodeBudgetTest, ATakeOverWhoseRoomCameLateWaitsAgainInTheNextPhase) {
  Peer peer;
  spawn_holder(peer, shared_auto(150), 384 * kMiB, [](Peer& p, FakeDriver&, Core& core, DevPtr a) {
    CHILD_CHECK(p.recv(p.to_child[0]) == 'g');
    CHILD_CHECK(idle_until_demoted(core, 256 * kMiB));
    p.send(p.to_parent[1], 'd');
    return child_done(p, core, a);
  });
  FakeDriver fake;
  Core core(fake.driver(), load(shared_auto(150)));
  DevPtr b = 0, c = 0;
  ASSERT_EQ(try_alloc(core, 384 * kMiB, &b), res::ok);
  ASSERT_EQ(core.budget().device_report(0).spilled_bytes, 256 * kMiB);
  const auto phase = [&](auto then) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) core.at_safe_point(0, 5000000);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    then();
    core.at_safe_point(0);  // idle: the phase ends
    return ms >= 150 ? 'W' : '-';
  };
  std::string waited;
  waited += phase([&] {
    peer.tell_child('g');
    busy_safe_points_until(
        core, [&] { return core.budget().device_report(0).promoted_bytes == 256 * kMiB; });
    EXPECT_EQ(core.budget().device_report(0).promoted_bytes, 256 * kMiB)
        << "the room came late in the phase";
  });
  ASSERT_EQ(peer.hear_from_child(), 'd');
  ASSERT_EQ(try_alloc(core, 128 * kMiB, &c), res::ok);
  // The room it lacks is on the host again: the allocation demoted 128 MiB of the older set.
  ASSERT_EQ(const_cast<Backend*>(testing::spill_target(core))->movable()->host_bytes(0),
            128 * kMiB);
  waited += phase([] {});
  EXPECT_EQ(waited, "WW");
  finish(peer);
  ASSERT_EQ(core.free(c, FreeRequest{}), res::ok);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
}

// A take-over that stopped waiting (nobody gave within share_wait_ms) waits again once a giver
// demotes: while the phase computes, the giver's copies would share the GPU with its kernels. The
// parent spilled 384 MiB; its take-over waits a second in vain while the child reaches no safe
// point; then the child idles and demotes the 384 MiB in two steps (256, then 128 MiB), pinning
// host pieces in 100 ms each (more than the parent's promotion of the first step takes). The
// busy safe point where the first step arrives waits for the second: one promotes it all.
TEST_F(NodeBudgetTest, AStalledTakeOverWaitsAgainOnceAGiverDemotes) {
  static_assert(Budget::kDemoteStep == 256 * kMiB);
  Peer peer;
  spawn_holder(peer, shared_auto(150), 448 * kMiB,
               [](Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
                 fake::testing::fill(fake.driver(), a, 448 * kMiB, 3);
                 CHILD_CHECK(p.recv(p.to_child[0]) == 'g');
                 fake.on_call(FakeOp::mem_create,
                              [] { std::this_thread::sleep_for(std::chrono::milliseconds(100)); });
                 CHILD_CHECK(idle_until_demoted(core, 384 * kMiB));
                 fake.on_call(FakeOp::mem_create, nullptr);
                 CHILD_CHECK(fake::testing::verify(fake.driver(), a, 448 * kMiB, 3));
                 return child_done(p, core, a);
               });
  FakeDriver fake;
  Core core(fake.driver(), load(shared_auto(1000)));
  const DevPtr b = spilled_set(core, 448 * kMiB, 384 * kMiB);
  ASSERT_NE(b, 0u);
  fake::testing::fill(fake.driver(), b, 448 * kMiB, 4);
  const auto promoted = [&] { return core.budget().device_report(0).promoted_bytes; };
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) core.at_safe_point(0, 5000000);
  ASSERT_GE(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1))
      << "the take-over waited";
  ASSERT_EQ(promoted(), 0u);
  peer.tell_child('g');
  int points = 0;
  busy_safe_points_until(core, [&] {
    points += promoted() > 0;
    return promoted() == 384 * kMiB;
  });
  EXPECT_EQ(promoted(), 384 * kMiB);
  EXPECT_EQ(points, 1) << "safe points that promoted: one waited for the second step";
  EXPECT_TRUE(fake::testing::verify(fake.driver(), b, 448 * kMiB, 4));
  finish(peer);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
}

// However a phase that takes the room over gets its last piece back, it then expects to give the
// room back at the other's turn: here the take-over stops waiting (the child reaches no safe point
// for share_wait_ms), and the 128 MiB the child gives later come back at a safe point that does not
// wait, less than a demotion step, so no take-over runs again. The parent then expects to demote
// all it holds on the device, and its pinner pins for it while it computes.
TEST_F(NodeBudgetTest, ATakeOverThatEndsWithoutWaitingStillExpectsToGiveTheRoomBack) {
  static_assert(128 * kMiB < Budget::kDemoteStep);
  Peer peer;
  spawn_holder(peer, shared_auto(150), 384 * kMiB, [](Peer& p, FakeDriver&, Core& core, DevPtr a) {
    CHILD_CHECK(p.recv(p.to_child[0]) == 'g');
    CHILD_CHECK(idle_until_demoted(core, 128 * kMiB));
    return child_done(p, core, a);
  });
  FakeDriver fake;
  Core core(fake.driver(), load(shared_auto(150)));
  const DevPtr b = spilled_set(core, 256 * kMiB, 128 * kMiB);
  ASSERT_NE(b, 0u);
  const auto promoted = [&] { return core.budget().device_report(0).promoted_bytes; };
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) core.at_safe_point(0, 5000000);
  ASSERT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(150))
      << "the take-over waited";
  ASSERT_EQ(promoted(), 0u);
  EXPECT_EQ(core.budget().expected_demotion(0), 0u);
  peer.tell_child('g');
  busy_safe_points_until(core, [&] { return promoted() == 128 * kMiB; });
  ASSERT_EQ(promoted(), 128 * kMiB);
  EXPECT_EQ(core.budget().expected_demotion(0), 256 * kMiB) << "the room taken is expected back";
  busy_safe_points_until(core, [&] { return core.budget().device_report(0).ahead_bytes > 0; });
  EXPECT_GT(core.budget().device_report(0).ahead_bytes, 0u) << "pinned for giving it back";
  core.at_safe_point(0);  // idle: the phase ends
  finish(peer);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
}

// While its asks for room are out, a busy phase swaps none of its own memory: the room on its way
// makes a swap moot, and the swap moves bytes twice. One process alone under a shared 512 MiB
// budget (nobody answers): `hot`, read once in an epoch that ended, is demoted for `third`, the
// other two being read twice; a busy safe point asks for room; a launch that names `hot` then
// leaves it on the host. Without the hold the safe point's rebalance or the launch's promotion
// ahead would swap it with `third` (ahead_test's AheadOverThree).
TEST_F(NodeBudgetTest, ABusyPhaseWaitingForRoomSwapsNoneOfItsOwnMemory) {
  FakeDriver fake;
  void* const function = reinterpret_cast<void*>(0x7000);
  fake.set_param_layout(function, {{0, 8}});
  Core core(fake.driver(), load(shared_auto(0)));
  const auto launch = [&](DevPtr x) {
    void* params[] = {&x};
    core.submit_enter();
    core.launch_uses(function, params, nullptr, kStreamLegacy);
    core.submit_leave();
  };
  const std::size_t size = 192 * kMiB;
  const DevPtr hot = testing::must_alloc(core, size), cold = testing::must_alloc(core, size);
  launch(hot);
  launch(cold);
  launch(cold);
  core.budget().migration().set_epoch_ns(0);
  core.after_context_sync(core.before_context_sync());  // the epoch ends
  const DevPtr third = testing::must_alloc(core, size);
  const auto report = [&] { return core.budget().device_report(0); };
  ASSERT_GT(report().demoted_bytes, 0u);
  core.budget().migration().set_epoch_ns(1'000'000'000'000);  // no epoch ends from here on
  core.at_safe_point(0,
                     5000000);  // busy: asks for the room its spilled memory needs (nobody has it)
  launch(hot + 64);
  EXPECT_EQ(report().promoted_bytes, 0u) << "swapped its own memory while waiting for room";
  const Migration::Counts c = core.budget().migration().counts();
  EXPECT_EQ(c.rebalances + c.ahead + c.trials, 0u);
  for (DevPtr p : {hot, cold, third}) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
}

// A busy safe point asks whenever the room is short of the piece it would promote: here 32 MiB
// of room and a 64 MiB piece on the host (on the H100, the leases' rounding left a few MiB, and
// promotion stood still when only "no room at all" asked).
TEST_F(NodeBudgetTest, ABusySafePointAsksWhenTheRoomIsShortOfAPiece) {
  Peer peer;
  spawn_holder(peer, shared_auto(5000), 256 * kMiB, [](Peer& p, FakeDriver&, Core& core, DevPtr a) {
    safe_points_until(core, [&] { return core.budget().device_report(0).demoted_bytes != 0; });
    CHILD_CHECK(core.budget().device_report(0).demoted_bytes == 64 * kMiB);  // one whole piece
    return child_done(p, core, a);
  });
  {
    FakeDriver fake;
    Core core(fake.driver(), load(shared_auto(5000)));
    DevPtr b = 0, c = 0;
    ASSERT_EQ(try_alloc(core, 256 * kMiB, &b), res::ok);       // the node is full
    ASSERT_EQ(core.budget().demote(0, 64 * kMiB), 64 * kMiB);  // b's first piece to the host
    ASSERT_EQ(try_alloc(core, 32 * kMiB, &c), res::ok);        // 32 MiB of room left
    ASSERT_EQ(fake.used(0), 224 * kMiB);
    busy_safe_points_until(core,
                           [&] { return core.budget().device_report(0).promoted_bytes != 0; });
    EXPECT_EQ(core.budget().device_report(0).promoted_bytes, 64 * kMiB);
    EXPECT_EQ(fake.used(0), 288 * kMiB);
    finish(peer);
    for (DevPtr q : {b, c}) ASSERT_EQ(core.free(q, FreeRequest{}), res::ok);
  }
}

}  // namespace
}  // namespace allocshim
