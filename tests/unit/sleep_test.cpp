// Sleep and wake on the fake driver (core/sleep.h, core/control.h): a sleeping process's movable
// memory is on the host, its launches wait and its lease is back with the scope; woken, its memory
// and its data are back. An idle one dozes. The control socket answers its own user and root only,
// and the client talks only to the process it was given.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "core/control.h"
#include "core/core.h"
#include "node/node_view.h"
#include "core_fixture.h"
#include "ctl/client.h"
#include "fake_driver.h"
#include "fake_test_util.h"
#include "host_probe.h"
#include "node_budget_peer.h"
#include "os/unix_socket.h"

namespace allocshim {
namespace {

using fake::FakeDriver;
using fake::kMiB;
using testing::must_alloc;

std::string policy_text(const char* extra = "") {
  return std::string(
             "[budget]\ndevice = \"128MiB\"\nspill = \"host\"\nmigrate = \"auto\"\n"
             "share = \"user\"\n") +
         extra;
}

const Backend& spill(const Core& core) { return *testing::spill_target(core); }

// Whether every 2 MiB chunk of [p, p + n) is on the device (1) or the host (0).
bool all_at(const Core& core, DevPtr p, std::size_t n, int where) {
  for (std::size_t off = 0; off < n; off += 2 * kMiB)
    if (host_placement(spill(core), p + off) != where) return false;
  return true;
}

void submit(Core& core, DevPtr used) {
  core.submit_enter();
  core.submit_uses(used);
  core.submit_leave();
}

class SleepTest : public NodeBudgetTest {
 protected:
  // This process's member of the user's region, as allocshim top reads it.
  node::MemberView me() const {
    const node::RegionView r = node::read_region(user_region());
    for (const auto& m : r.members)
      if (m.pid == ::getpid()) return m;
    ADD_FAILURE() << "not a member: " << r.error;
    return {};
  }
};

TEST_F(SleepTest, SleepMovesTheMemoryOutHoldsLaunchesAndWakeBringsItBackIntact) {
  FakeDriver fake;
  Core core(fake.driver(), load(policy_text()));
  const DevPtr a = must_alloc(core, 24 * kMiB), b = must_alloc(core, 40 * kMiB);
  fake::testing::fill(fake.driver(), a, 24 * kMiB, 3);
  fake::testing::fill(fake.driver(), b, 40 * kMiB, 4);
  ASSERT_TRUE(all_at(core, a, 24 * kMiB, 1) && all_at(core, b, 40 * kMiB, 1));
  core.budget().node().refresh();
  EXPECT_GE(me().gpus.at(0).lease, 64 * kMiB);

  const Sleeper::Outcome slept = core.sleeper().sleep();
  ASSERT_EQ(slept.error, "");
  EXPECT_EQ(slept.state, Sleeper::State::asleep);
  EXPECT_EQ(slept.moved, 64 * kMiB);
  EXPECT_EQ(slept.host, 64 * kMiB);
  EXPECT_TRUE(all_at(core, a, 24 * kMiB, 0) && all_at(core, b, 40 * kMiB, 0));
  core.budget().node().refresh();
  EXPECT_TRUE(me().asleep);
  EXPECT_EQ(me().gpus.at(0).lease, 0u) << "the lease goes back to the scope";

  // Asleep: a launch waits; a safe point and a new allocation take no device memory.
  std::atomic<bool> launched{false};
  std::thread launcher([&] {
    submit(core, a);
    launched = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(launched) << "a launch ran while the process slept";
  core.at_safe_point(0, 5000000);
  EXPECT_TRUE(all_at(core, a, 24 * kMiB, 0)) << "a safe point promoted while asleep";
  const DevPtr c = must_alloc(core, 8 * kMiB);
  EXPECT_TRUE(all_at(core, c, 8 * kMiB, 0)) << "an allocation took device memory while asleep";

  const Sleeper::Outcome woke = core.sleeper().wake();
  ASSERT_EQ(woke.error, "");
  EXPECT_EQ(woke.state, Sleeper::State::awake);
  EXPECT_EQ(woke.moved, 72 * kMiB);
  launcher.join();
  EXPECT_TRUE(launched);
  EXPECT_TRUE(all_at(core, a, 24 * kMiB, 1) && all_at(core, b, 40 * kMiB, 1));
  EXPECT_TRUE(fake::testing::verify(fake.driver(), a, 24 * kMiB, 3));
  EXPECT_TRUE(fake::testing::verify(fake.driver(), b, 40 * kMiB, 4));
  core.budget().node().refresh();
  EXPECT_FALSE(me().asleep);
  for (DevPtr p : {a, b, c}) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
}

TEST_F(SleepTest, AtExitASleepingProcessesLaunchesNoLongerWait) {
  FakeDriver fake;
  Core core(fake.driver(), load(policy_text()));
  const DevPtr a = must_alloc(core, 24 * kMiB);
  ASSERT_EQ(core.sleeper().sleep().error, "");
  std::atomic<bool> launched{false};
  std::thread launcher([&] {
    submit(core, a);
    launched = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(launched);
  core.sleeper().let_go();  // what the exit handler does after stopping the control thread
  launcher.join();
  EXPECT_TRUE(launched);
  EXPECT_TRUE(all_at(core, a, 24 * kMiB, 0)) << "the memory stays where it is";
  const DevPtr b = must_alloc(core, 8 * kMiB);
  EXPECT_TRUE(all_at(core, b, 8 * kMiB, 1)) << "claims are allowed again";
  for (DevPtr p : {a, b}) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
}

TEST_F(SleepTest, APolicyThatMovesNothingCannotSleep) {
  FakeDriver fake;
  Core core(fake.driver(), load("[budget]\ndevice = \"128MiB\"\n"));
  const DevPtr a = must_alloc(core, 8 * kMiB);
  const Sleeper::Outcome o = core.sleeper().sleep();
  EXPECT_NE(o.error.find("moves no memory"), std::string::npos) << o.error;
  EXPECT_EQ(core.sleeper().state(), Sleeper::State::awake);
  std::thread launcher([&] { submit(core, a); });  // not held
  launcher.join();
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
}

TEST_F(SleepTest, AnIdleProcessDozesAfterIdleSleepMsAndItsLaunchesBringItsMemoryBack) {
  FakeDriver fake;
  Core core(fake.driver(), load(policy_text("idle_sleep_ms = 200\n")));
  const DevPtr a = must_alloc(core, 24 * kMiB);
  fake::testing::fill(fake.driver(), a, 24 * kMiB, 5);
  constexpr std::uint64_t ms = 1'000'000;
  Sleeper& s = core.sleeper();
  s.tick(1000 * ms, 200);
  submit(core, a);
  s.tick(1100 * ms, 200);  // a submission: idle from here
  s.tick(1250 * ms, 200);
  EXPECT_EQ(s.state(), Sleeper::State::awake) << "dozed after 150 ms of 200";
  EXPECT_TRUE(all_at(core, a, 24 * kMiB, 1));
  s.tick(1310 * ms, 200);
  EXPECT_EQ(s.state(), Sleeper::State::dozing);
  EXPECT_TRUE(all_at(core, a, 24 * kMiB, 0));
  core.budget().node().refresh();
  EXPECT_TRUE(me().asleep);
  EXPECT_EQ(me().gpus.at(0).lease, 0u);

  // It wakes on its own: its launches and safe points bring the memory back.
  std::thread launcher([&] { submit(core, a); });
  launcher.join();
  s.tick(1400 * ms, 200);
  EXPECT_EQ(s.state(), Sleeper::State::awake);
  for (int i = 0; i < 100 && !all_at(core, a, 24 * kMiB, 1); ++i) {
    submit(core, a);
    core.at_safe_point(0, 5000000);
  }
  EXPECT_TRUE(all_at(core, a, 24 * kMiB, 1));
  EXPECT_TRUE(fake::testing::verify(fake.driver(), a, 24 * kMiB, 5));
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
}

TEST_F(SleepTest, TheControlSocketAnswersAndTheClientTalksOnlyToTheProcessItWasGiven) {
  FakeDriver fake;
  Core core(fake.driver(), load(policy_text()));
  const DevPtr a = must_alloc(core, 24 * kMiB);
  // Another process of this user binds a name the client looks for first: its listener is not
  // the process asked for, so the client passes it by.
  const std::string decoy = Control::prefix(::geteuid(), ::getpid()) + "0000000000000000";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t squatter = ::fork();
  if (squatter == 0) {
    const int fd = os::listen_on(decoy);
    char c = fd >= 0 ? 'y' : 'n';
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  core.start_control();
  ASSERT_TRUE(core.control().running());

  const ctl::Reply status = ctl::ask(::getpid(), "status", 5000);
  ASSERT_TRUE(status.ok) << status.error;
  EXPECT_EQ(status.fields.at("state"), "awake");
  const ctl::Reply slept = ctl::ask(::getpid(), "sleep", 60000);
  ASSERT_TRUE(slept.ok) << slept.error;
  EXPECT_EQ(slept.fields.at("moved"), std::to_string(24 * kMiB));
  EXPECT_EQ(core.sleeper().state(), Sleeper::State::asleep);
  EXPECT_NE(ctl::describe(::getpid(), "sleep", slept).find("24.0 MiB moved to the host"),
            std::string::npos);
  const ctl::Reply odd = ctl::parse("error state=asleep reason=two words");
  EXPECT_EQ(odd.error, "two words");
  const ctl::Reply woke = ctl::ask(::getpid(), "wake", 60000);
  ASSERT_TRUE(woke.ok) << woke.error;
  EXPECT_EQ(core.sleeper().state(), Sleeper::State::awake);
  EXPECT_TRUE(all_at(core, a, 24 * kMiB, 1));

  ::kill(squatter, SIGKILL);
  ::waitpid(squatter, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  core.control().stop();
  EXPECT_FALSE(ctl::ask(::getpid(), "status", 1000).ok) << "answered after stop";
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
}

// A child forked without exec has the listener's descriptor but no thread: it closes it, so that
// the name goes when the parent's control stops, not when the child exits.
TEST_F(SleepTest, AForkedChildDoesNotKeepTheControlSocket) {
  FakeDriver fake;
  Core core(fake.driver(), load(policy_text()));
  core.start_control();
  ASSERT_TRUE(core.control().running());
  const std::string name = core.control().name();
  const auto bound = [&] {
    std::ifstream in("/proc/net/unix");
    const std::string shown = "@" + name.substr(1);
    for (std::string line; std::getline(in, line);)
      if (line.size() >= shown.size() &&
          line.compare(line.size() - shown.size(), shown.size(), shown) == 0)
        return true;
    return false;
  };
  ASSERT_TRUE(bound());
  int forked[2];
  ASSERT_EQ(::pipe(forked), 0);
  const pid_t child = ::fork();
  if (child == 0) {  // the fork handlers ran before fork() returned here
    (void)!::write(forked[1], "f", 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(forked[0], &c, 1), 1);
  ::close(forked[0]);
  ::close(forked[1]);
  core.control().stop();
  EXPECT_FALSE(bound()) << "the forked child kept the control socket's name";
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

TEST_F(SleepTest, AnotherUserCannotPutTheProcessToSleep) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  FakeDriver fake;
  Core core(fake.driver(), load(policy_text()));
  const DevPtr a = must_alloc(core, 24 * kMiB);
  core.start_control();
  ASSERT_TRUE(core.control().running());
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) _exit(3);
    const ctl::Reply r = ctl::ask(parent, "sleep", 3000);
    _exit(r.ok ? 1 : r.error.find("only its own user and root") == std::string::npos ? 2 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "another user's sleep was obeyed";
  EXPECT_EQ(core.sleeper().state(), Sleeper::State::awake);
  EXPECT_TRUE(all_at(core, a, 24 * kMiB, 1));
  core.control().stop();
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
}

}  // namespace
}  // namespace allocshim
