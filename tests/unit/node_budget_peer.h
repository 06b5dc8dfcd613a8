// What the shared-budget tests have in common (one test file per executable includes it):
// the fixture whose directory holds the region, a child process with a core of its own talking to
// the test over pipes, safe points until a condition, and the policies they share.
#pragma once

#include "node/node_budget.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/core.h"
#include "fake_driver.h"
#include "fake_test_util.h"
#include "core_fixture.h"
#include "fork_child.h"

namespace allocshim {
namespace {

// Descriptors of this process open on `path` (what a forked child must not keep of a region).
inline int descriptors_of(const std::string& path) {
  int n = 0;
  for (int fd = 0; fd < 1024; ++fd) {
    char link[64], target[4096];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t len = ::readlink(link, target, sizeof target - 1);
    if (len > 0 && std::string(target, static_cast<std::size_t>(len)) == path) ++n;
  }
  return n;
}

inline policy::Policy load(const std::string& text) { return testing::parsed(text, "share.toml"); }

using testing::try_alloc;

// A pipe each way between the test and one child process: single bytes as steps.
struct Peer {
  pid_t pid = -1;
  int to_child[2] = {-1, -1}, to_parent[2] = {-1, -1};
  void send(int fd, char c) { ASSERT_EQ(::write(fd, &c, 1), 1); }
  char recv(int fd) {
    char c = 0;
    return ::read(fd, &c, 1) == 1 ? c : '\0';
  }
  void tell_child(char c) { send(to_child[1], c); }
  char hear_from_child() { return recv(to_parent[0]); }
  // Waits for the child; its exit status (0: every check in it passed).
  int join() {
    const int status = testing::wait_child(pid);
    for (int* fds : {to_child, to_parent})
      for (int i = 0; i < 2; ++i)
        if (fds[i] >= 0) ::close(fds[i]);
    return status;
  }
};

// The longest a condition wait of these tests allows: what the other process does comes much
// sooner, but a sanitizer on a loaded two-core machine slows it a hundredfold, and a wait that is
// met costs nothing more.
inline constexpr std::chrono::seconds kPeerWait{300};

// The program reaching a safe point (a synchronization) every millisecond until `done()`,
// kPeerWait at most.
template <class Done>
void safe_points_until(Core& core, Done done) {
  const auto end = std::chrono::steady_clock::now() + kPeerWait;
  while (!done() && std::chrono::steady_clock::now() < end) {
    core.at_safe_point(-1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The same, busy: the program waited 5 ms for the device at each synchronization.
template <class Done>
void busy_safe_points_until(Core& core, Done done) {
  const auto end = std::chrono::steady_clock::now() + kPeerWait;
  while (!done() && std::chrono::steady_clock::now() < end) {
    core.at_safe_point(0, 5000000);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Idle safe points (answering other processes' requests) until this process has demoted `bytes`
// in all, for kPeerWait at most; whether it has.
inline bool idle_until_demoted(Core& core, std::uint64_t bytes) {
  const auto end = std::chrono::steady_clock::now() + kPeerWait;
  while (core.budget().device_report(0).demoted_bytes < bytes &&
         std::chrono::steady_clock::now() < end) {
    core.at_safe_point(-1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return core.budget().device_report(0).demoted_bytes == bytes;
}

// The parent's set, once the child made room: `bytes` served from the device, filled with seed 8;
// 0 (and a failure) if it was not.
inline DevPtr parent_set(FakeDriver& fake, Core& core, std::size_t bytes) {
  DevPtr b = 0;
  if (try_alloc(core, bytes, &b) != res::ok) {
    ADD_FAILURE() << "the parent's allocation failed";
    return 0;
  }
  EXPECT_EQ(fake.used(0), bytes) << "the child made room";
  fake::testing::fill(fake.driver(), b, bytes, 8);
  return b;
}

// The parent's set allocated past the room it has: `bytes`, of which `spilled` went to the host;
// 0 (and a failure) if the allocation failed or spilled otherwise.
inline DevPtr spilled_set(Core& core, std::size_t bytes, std::uint64_t spilled) {
  DevPtr b = 0;
  if (try_alloc(core, bytes, &b) != res::ok) {
    ADD_FAILURE() << "the parent's allocation failed";
    return 0;
  }
  if (const std::uint64_t got = core.budget().device_report(0).spilled_bytes; got != spilled) {
    ADD_FAILURE() << "the parent's allocation spilled " << got << " bytes, not " << spilled;
    return 0;
  }
  return b;
}

// Idle safe points (answering the other process's requests) every millisecond until `fd` has
// something to read, kPeerWait at most.
inline void idle_until_readable(Core& core, int fd) {
  const auto end = std::chrono::steady_clock::now() + kPeerWait;
  for (pollfd said{fd, POLLIN, 0};
       ::poll(&said, 1, 0) != 1 && std::chrono::steady_clock::now() < end;) {
    core.at_safe_point(-1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The same until the child says something; what it said ('\0' if nothing).
inline char idle_until_child_speaks(Core& core, Peer& peer) {
  idle_until_readable(core, peer.to_parent[0]);
  return peer.hear_from_child();
}

// The parent's side of a take-over test. Waits for the child to say it has computed ('c'), makes
// the parent's set with parent_set (the child gives room for it), tells the child to go on ('d'),
// then answers the child's requests at idle safe points until it speaks again. Returns the set and
// what the child said ('\0' where it never said 'c').
struct HeldSet {
  DevPtr b;
  char said;
};
inline HeldSet hold_set_while_child_takes_over(FakeDriver& fake, Core& core, Peer& peer,
                                               std::size_t bytes) {
  if (const char c = peer.hear_from_child(); c != 'c') {
    ADD_FAILURE() << "the child said '" << c << "', not 'c'";
    return {0, '\0'};
  }
  const DevPtr b = parent_set(fake, core, bytes);
  peer.tell_child('d');
  return {b, idle_until_child_speaks(core, peer)};
}

// The requester's side in its stats: it waited for others once, and whether that wait timed out.
inline void expect_waited_once(const Core& core, bool timed_out) {
  const std::string json = core.stats_json();
  EXPECT_NE(json.find("\"waits\":1,"), std::string::npos) << json;
  EXPECT_NE(json.find(timed_out ? "\"timeouts\":1," : "\"timeouts\":0,"), std::string::npos)
      << json;
}

// Runs `body(peer)` in a child process with a core of its own; `body` returns the exit status.
template <class Body>
void spawn(Peer& peer, Body body) {
  ASSERT_EQ(::pipe(peer.to_child), 0);
  ASSERT_EQ(::pipe(peer.to_parent), 0);
  // Each side keeps only its own ends: a side that died is then an end of file to the other, not
  // a read that never returns.
  peer.pid = testing::fork_child(
      [&] {
        ::close(peer.to_child[1]);
        ::close(peer.to_parent[0]);
        return body(peer);
      },
      // Past the child's own waits (under TSan on a loaded machine one test ran past 120 s), and
      // before the tsan preset's 600 s test timeout, so that no child outlives its test.
      540);
  ASSERT_GE(peer.pid, 0);
  ::close(peer.to_child[0]);
  ::close(peer.to_parent[1]);
  peer.to_child[0] = peer.to_parent[1] = -1;
}

// Child-side checks: a failed one exits with its line number.
#define CHILD_CHECK(cond)                                                                       \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "%s:%d: the child's check failed: %s\n", __FILE__, __LINE__, #cond); \
      return __LINE__ % 250 + 1;                                                                \
    }                                                                                           \
  } while (0)

// The child's end: tells the parent `first` where given (what the parent waits for, idle), then
// that its checks are done ('g'); waits for the parent's last step ('x'), then frees `a`.
inline int child_done(Peer& p, Core& core, DevPtr a, char first = '\0') {
  if (first != '\0') p.send(p.to_parent[1], first);
  p.send(p.to_parent[1], 'g');
  CHILD_CHECK(p.recv(p.to_child[0]) == 'x');
  CHILD_CHECK(core.free(a, FreeRequest{}) == res::ok);
  return 0;
}

// The child's first half of a turn test: fills its set `a` (448 MiB) with seed 7, computes with
// nothing spilled, tells the parent ('c'), gives the 384 MiB the parent asks for at its idle safe
// points, and waits for the parent's set ('d'). 0, or the line of the check that failed.
inline int child_gives_room(Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
  fake::testing::fill(fake.driver(), a, 448 * kMiB, 7);
  for (int i = 0; i < 120; ++i) core.at_safe_point(0, 5000000);  // computing, nothing spilled
  p.send(p.to_parent[1], 'c');
  CHILD_CHECK(idle_until_demoted(core, 384 * kMiB));  // gives the parent room
  CHILD_CHECK(p.recv(p.to_child[0]) == 'd');
  return 0;
}

// The child's side of a prior test: fills its set `a` (448 MiB) with seed 7 and tells the parent
// ('c') without having computed, gives the 384 MiB the parent asks for at its idle safe points,
// waits for the parent's set ('d'), then launches: the launch takes all of it back before it runs,
// waiting for the parent's answer. Its checks end with child_done(.., 'e').
inline int child_gives_room_then_launches(Peer& p, FakeDriver& fake, Core& core, DevPtr a) {
  fake::testing::fill(fake.driver(), a, 448 * kMiB, 7);
  p.send(p.to_parent[1], 'c');
  CHILD_CHECK(idle_until_demoted(core, 384 * kMiB));  // gives the parent room
  CHILD_CHECK(p.recv(p.to_child[0]) == 'd');
  CHILD_CHECK(core.budget().promote_ahead(0, {a}, {a}) == 384 * kMiB);
  CHILD_CHECK(fake.used(0) == 448 * kMiB);
  CHILD_CHECK(fake::testing::verify(fake.driver(), a, 448 * kMiB, 7));
  return child_done(p, core, a, 'e');
}

// Starts a child process that joins under `policy`, allocates `bytes` as `a` and tells the parent
// ('a'), then runs `then(p, fake, core, a)` for its exit status. Returns once the child holds its
// memory; the test fails if it never does.
template <class Then>
void spawn_holder(Peer& peer, const std::string& policy, std::size_t bytes, Then then) {
  spawn(peer, [&](Peer& p) {
    FakeDriver fake;
    Core core(fake.driver(), load(policy));
    DevPtr a = 0;
    CHILD_CHECK(try_alloc(core, bytes, &a) == res::ok);
    p.send(p.to_parent[1], 'a');
    return then(p, fake, core, a);
  });
  ASSERT_EQ(peer.hear_from_child(), 'a');
}

// The parent's end, mirroring child_done: waits for the child's checks ('g'), lets it end ('x')
// and expects every check in it to have passed.
inline void finish(Peer& peer) {
  ASSERT_EQ(peer.hear_from_child(), 'g');
  peer.tell_child('x');
  EXPECT_EQ(peer.join(), 0);
}

// The parent's end of such a test: its set still holds what parent_set wrote, the child exits
// cleanly, and the set is freed.
inline void check_and_free_set(FakeDriver& fake, Core& core, Peer& peer, DevPtr b,
                               std::size_t bytes) {
  EXPECT_TRUE(fake::testing::verify(fake.driver(), b, bytes, 8));
  finish(peer);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
}

// The parent's end after the child's checks were heard (hold_set_while_child_takes_over said
// 'g'): its set still holds what parent_set wrote, the child exits cleanly, and the set is freed.
inline void free_set_after_child(FakeDriver& fake, Core& core, Peer& peer, DevPtr b,
                                 std::size_t bytes) {
  EXPECT_TRUE(fake::testing::verify(fake.driver(), b, bytes, 8));
  peer.tell_child('x');
  EXPECT_EQ(peer.join(), 0);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
}

// Frees `blocks` and leaves the node: the last member out removes the region (TearDown checks).
inline void free_and_leave(Core& core, std::initializer_list<DevPtr> blocks) {
  for (DevPtr q : blocks) ASSERT_EQ(core.free(q, FreeRequest{}), res::ok);
  core.budget().leave_node();
}

// Joins `member` to this user's region for device 0, with a limit of 512 MiB.
inline void join_user_region(NodeBudget& member, int wait_ms = 0) {
  member.configure(policy::Budget::Share::user, wait_ms);
  ASSERT_EQ(member.attach(0, 512 * kMiB), 512 * kMiB);
}

// Every member left or died by the end of each test: the region file must be gone (the last
// member out unlinks it; a test that kills one checks the survivor cleaned up).
class NodeBudgetTest : public testing::EmptyDirTest {
 protected:
  NodeBudgetTest() : EmptyDirTest("allocshim-share") {}
  void SetUp() override {
    EmptyDirTest::SetUp();
    ::setenv("ALLOCSHIM_SHARE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("ALLOCSHIM_SHARE_DIR");
    EmptyDirTest::TearDown();
  }
  // The region file of `scope` ("all", "g<gid>", "u<uid>") in this test's directory.
  std::string region(const std::string& scope) const {
    return dir_ + "/allocshim-budget-v" + std::to_string(node::kLayoutVersion) + "-" + scope;
  }
  std::string user_region() const { return region("u" + std::to_string(::geteuid())); }
};

// 512 MiB per device for every process of this user; `wait_ms` for others to give room back.
inline std::string shared(int wait_ms = 0, const char* rules = "") {
  return "[defaults]\nbackend = \"native\"\n\n[budget]\ndevice = \"512MiB\"\nspill = \"none\"\nshare = \"user\"\nshare_wait_ms = " +
         std::to_string(wait_ms) + "\n" + rules;
}
const std::string kShared = shared();

// A member of this user's region (kShared) on a simulated device of its own, holding `bytes` in
// `block` (free_and_leave(member.core, {member.block}) ends it).
struct UserMember {
  FakeDriver fake;
  Core core{fake.driver(), load(kShared)};
  DevPtr block = 0;
  explicit UserMember(std::size_t bytes) { EXPECT_EQ(try_alloc(core, bytes, &block), res::ok); }
};

// The same under migrate = "auto", spilling to the host; `wait_ms` for others to give room back.
inline std::string shared_auto(int wait_ms) {
  return "[budget]\ndevice = \"512MiB\"\nspill = \"host\"\nmigrate = \"auto\"\nshare = \"user\"\n"
         "share_wait_ms = " +
         std::to_string(wait_ms) + "\n";
}

}  // namespace
}  // namespace allocshim
