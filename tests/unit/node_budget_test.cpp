// One budget per GPU shared by several processes ([budget] share, docs/oversubscription.md), on the
// fake driver: real processes (fork) each with its own core and simulated device, sharing the
// region in a directory of the test's own. Covers the shared limit, cuMemGetInfo, lease returned
// at frees and at exit, a SIGKILLed member's share reclaimed, requests for room delivered and
// answered at a safe point by the pools' caches, a member that never answers delaying others by
// share_wait_ms only, and forked children. Moving memory for others: node_turns_test.cpp; what
// another user, a stale file or a race can do: node_attack_test.cpp.
#include "node_budget_peer.h"

namespace allocshim {
namespace {

TEST_F(NodeBudgetTest, TwoProcessesShareOneLimit) {
  Peer peer;
  spawn_holder(peer, kShared, 384 * kMiB, [](Peer& p, FakeDriver&, Core& core, DevPtr a) {
    CHILD_CHECK(p.recv(p.to_child[0]) == 'f');
    CHILD_CHECK(core.free(a, FreeRequest{}) == res::ok);  // a synchronous free returns the lease
    p.send(p.to_parent[1], 'f');
    CHILD_CHECK(p.recv(p.to_child[0]) == 'x');
    return 0;
  });
  {
    FakeDriver fake;
    Core core(fake.driver(), load(kShared));
    DevPtr b = 0;
    EXPECT_EQ(try_alloc(core, 256 * kMiB, &b), res::out_of_memory)
        << "384 of 512 MiB are the other's";
    EXPECT_EQ(fake.used(0), 0u) << "the driver was not asked";
    std::size_t free = 0, total = 0;
    ASSERT_EQ(core.mem_get_info(&free, &total), res::ok);
    EXPECT_EQ(total, 512 * kMiB);
    EXPECT_EQ(free, 128 * kMiB) << "cuMemGetInfo leaves out what the other process holds";
    ASSERT_EQ(try_alloc(core, 128 * kMiB, &b), res::ok);
    peer.tell_child('f');
    ASSERT_EQ(peer.hear_from_child(), 'f');
    DevPtr c = 0;
    ASSERT_EQ(try_alloc(core, 256 * kMiB, &c), res::ok)
        << "the other process's free gave its lease back";
    ASSERT_EQ(core.mem_get_info(&free, &total), res::ok);
    EXPECT_EQ(free, 128 * kMiB);
    EXPECT_NE(core.stats_json().find("\"node\":{\"share\":\"user\",\"joined\":true"),
              std::string::npos);
    EXPECT_NE(core.summary().find("shared per user"), std::string::npos) << core.summary();
    peer.tell_child('x');
    EXPECT_EQ(peer.join(), 0);
    ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
    ASSERT_EQ(core.free(c, FreeRequest{}), res::ok);
  }
}

TEST_F(NodeBudgetTest, AKilledProcessShareIsReclaimed) {
  Peer peer;
  spawn_holder(peer, kShared, 448 * kMiB, [](Peer&, FakeDriver&, Core&, DevPtr) -> int {
    for (;;) ::pause();  // killed while holding it
  });
  FakeDriver fake;
  Core core(fake.driver(), load(kShared));
  DevPtr b = 0;
  EXPECT_EQ(try_alloc(core, 256 * kMiB, &b), res::out_of_memory);
  ASSERT_EQ(::kill(peer.pid, SIGKILL), 0);
  EXPECT_EQ(peer.join(), 128 + SIGKILL);
  ASSERT_EQ(try_alloc(core, 448 * kMiB, &b), res::ok) << "the dead process's 448 MiB came back";
  std::size_t free = 0, total = 0;
  ASSERT_EQ(core.mem_get_info(&free, &total), res::ok);
  EXPECT_EQ(free, 64 * kMiB);
  EXPECT_NE(core.summary().find("reclaimed the leases of 1 dead processes (448.0 MiB)"),
            std::string::npos)
      << core.summary();
  EXPECT_NE(core.stats_json().find("\"reclaimed_processes\":1,\"reclaimed_bytes\":469762048"),
            std::string::npos);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
  core.budget().leave_node();  // the last member: the region file goes (TearDown checks)
}

// The child caches 384 MiB in its vmm pool (backed, not used) and reaches a safe point every
// millisecond; the parent's allocation past the node's room asks it for room, waits, and gets it.
TEST_F(NodeBudgetTest, RequestsForRoomAreDeliveredAndAnsweredAtSafePoints) {
  const std::string policy = shared(5000, "[[rules]]\nsize = \">= 1MiB\"\nbackend = \"vmm\"\n");
  Peer peer;
  spawn(peer, [&](Peer& p) {
    FakeDriver fake;
    Core core(fake.driver(), load(policy));
    DevPtr a = 0;
    CHILD_CHECK(try_alloc(core, 384 * kMiB, &a) == res::ok);
    CHILD_CHECK(core.free(a, FreeRequest{}) == res::ok);
    CHILD_CHECK(core.budget().backed(0) >= 384 * kMiB);  // cached by the pool
    p.send(p.to_parent[1], 'a');
    safe_points_until(core, [&] { return core.budget().node().lease(0) < 384 * kMiB; });
    CHILD_CHECK(core.budget().backed(0) == 0);  // the cache was trimmed for the other process
    const std::string json = core.stats_json();
    CHILD_CHECK(json.find("\"requests\":1,") != std::string::npos);
    CHILD_CHECK(json.find("\"given_bytes\":0") == std::string::npos);
    p.send(p.to_parent[1], 'g');
    CHILD_CHECK(p.recv(p.to_child[0]) == 'x');
    return 0;
  });
  ASSERT_EQ(peer.hear_from_child(), 'a');
  FakeDriver fake;
  Core core(fake.driver(), load(shared(5000)));
  DevPtr b = 0;
  ASSERT_EQ(try_alloc(core, 384 * kMiB, &b), res::ok) << "the other process gave its cache back";
  expect_waited_once(core, false);
  finish(peer);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
}

// An allocation waits for room while it keeps arriving, share_wait_ms after the last: the child
// frees a block every 600 ms, and the parent's allocation, which needs two of them and waits 1000
// ms, gets both (it would fail at 1000 ms if the wait counted from its start).
TEST_F(NodeBudgetTest, AnAllocationWaitsAsLongAsRoomKeepsArriving) {
  Peer peer;
  spawn(peer, [&](Peer& p) {
    FakeDriver fake;
    Core core(fake.driver(), load(kShared));
    DevPtr a[3] = {};
    for (DevPtr& x : a) CHILD_CHECK(try_alloc(core, 128 * kMiB, &x) == res::ok);
    p.send(p.to_parent[1], 'a');
    CHILD_CHECK(p.recv(p.to_child[0]) == 'w');  // the parent is about to allocate
    for (int i = 0; i < 2; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
      CHILD_CHECK(core.free(a[i], FreeRequest{}) == res::ok);  // gives 128 MiB of its lease back
    }
    p.send(p.to_parent[1], 'g');
    CHILD_CHECK(p.recv(p.to_child[0]) == 'x');
    CHILD_CHECK(core.free(a[2], FreeRequest{}) == res::ok);
    return 0;
  });
  ASSERT_EQ(peer.hear_from_child(), 'a');
  FakeDriver fake;
  Core core(fake.driver(), load(shared(1000)));
  peer.tell_child('w');
  const auto start = std::chrono::steady_clock::now();
  DevPtr b = 0;
  ASSERT_EQ(try_alloc(core, 384 * kMiB, &b), res::ok) << "room kept arriving within the wait";
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1000));
  expect_waited_once(core, false);
  finish(peer);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
}

// Two processes whose allocations each wait for the other's room give up at once: neither can
// give while it allocates. The child asks first and waits; the parent, asked already, does not
// wait, and its own ask ends the child's wait; both spill (here, with spill = "none", fail) well
// before share_wait_ms.
TEST_F(NodeBudgetTest, AllocationsWaitingForEachOthersRoomGiveUpAtOnce) {
  Peer peer;
  spawn_holder(peer, shared(5000), 256 * kMiB, [](Peer& p, FakeDriver&, Core& core, DevPtr a) {
    CHILD_CHECK(p.recv(p.to_child[0]) == 'w');  // the parent holds its 256 MiB
    const auto start = std::chrono::steady_clock::now();
    DevPtr b = 0;
    CHILD_CHECK(try_alloc(core, 128 * kMiB, &b) == res::out_of_memory);
    CHILD_CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2500));
    const std::string json = core.stats_json();
    CHILD_CHECK(json.find("\"timeouts\":0") != std::string::npos);
    return child_done(p, core, a);
  });
  FakeDriver fake;
  Core core(fake.driver(), load(shared(5000)));
  DevPtr a = 0;
  ASSERT_EQ(try_alloc(core, 256 * kMiB, &a), res::ok);
  peer.tell_child('w');
  // The child's ask reaches this process's slot first (its allocation polls every millisecond).
  const auto asked_end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!core.budget().node().asked() && std::chrono::steady_clock::now() < asked_end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(core.budget().node().asked());
  const auto start = std::chrono::steady_clock::now();
  DevPtr b = 0;
  EXPECT_EQ(try_alloc(core, 128 * kMiB, &b), res::out_of_memory);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(2500));
  finish(peer);
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
}

TEST_F(NodeBudgetTest, AProcessThatNeverAnswersDelaysOthersByTheWaitOnly) {
  Peer peer;
  spawn_holder(peer, kShared, 448 * kMiB, [](Peer& p, FakeDriver&, Core& core, DevPtr) {
    CHILD_CHECK(p.recv(p.to_child[0]) == 'x');  // never reaches a safe point meanwhile
    CHILD_CHECK(core.budget().node().asked());  // but was asked
    return 0;
  });
  FakeDriver fake;
  Core core(fake.driver(), load(shared(150)));
  DevPtr b = 0;
  EXPECT_EQ(try_alloc(core, 256 * kMiB, &b), res::out_of_memory);
  expect_waited_once(core, true);
  EXPECT_EQ(core.budget().device_report(0).refused, 1u);
  peer.tell_child('x');
  EXPECT_EQ(peer.join(), 0);
}

TEST_F(NodeBudgetTest, AForkedChildDoesNotInheritItsParentsMembership) {
  FakeDriver fake;
  Core core(fake.driver(), load(kShared));
  DevPtr a = 0;
  ASSERT_EQ(try_alloc(core, 256 * kMiB, &a), res::ok);
  Peer peer;
  spawn(peer, [&fake](Peer&) {
    // A core of its own (on its copy of the simulated device): the parent's 256 MiB stay counted,
    // the parent's lease is not the child's.
    Core child(fake.driver(), load(kShared));
    DevPtr c = 0;
    CHILD_CHECK(try_alloc(child, 384 * kMiB, &c) == res::out_of_memory);
    CHILD_CHECK(try_alloc(child, 256 * kMiB, &c) == res::ok);
    CHILD_CHECK(child.free(c, FreeRequest{}) == res::ok);
    return 0;
  });
  EXPECT_EQ(peer.join(), 0);
  DevPtr b = 0;
  ASSERT_EQ(try_alloc(core, 256 * kMiB, &b), res::ok)
      << "the child's exit left the parent's slot alone";
  DevPtr c = 0;
  EXPECT_EQ(try_alloc(core, 64 * kMiB, &c), res::out_of_memory);
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
}

TEST(NodeBudget, AnUnusableRegionLeavesTheProcessItsOwnBudget) {
  char tmpl[] = "/tmp/allocshim-share-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ::setenv("ALLOCSHIM_SHARE_DIR", (dir + "/missing").c_str(), 1);
  {
    FakeDriver fake;
    Core core(fake.driver(), load(kShared));
    DevPtr a = 0;
    ASSERT_EQ(try_alloc(core, 448 * kMiB, &a), res::ok);
    EXPECT_EQ(try_alloc(core, 128 * kMiB, &a), res::out_of_memory) << "its own 512 MiB still hold";
    EXPECT_NE(core.summary().find("not shared (cannot create"), std::string::npos)
        << core.summary();
  }
  ::unsetenv("ALLOCSHIM_SHARE_DIR");
  EXPECT_EQ(::rmdir(dir.c_str()), 0);
}

}  // namespace
}  // namespace allocshim
