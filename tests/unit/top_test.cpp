// allocshim top (tools/top, node/node_view.h) over members of a shared budget on the fake driver:
// what it shows of each member, the metrics as a textfile and over HTTP, and a damaged region as
// one line, not a crash.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "node_budget_peer.h"

namespace allocshim {
namespace {

struct Ran {
  int status = -1;
  std::string out, err;
};

// Runs the tool with `args`; stdout and stderr collected.
Ran tool(const std::string& dir, const std::string& args) {
  const std::string out = dir + "/.out", err = dir + "/.err";
  const int s = std::system(
      ("timeout -s KILL 30 " ALLOCSHIM_TOOL " " + args + " > " + out + " 2> " + err).c_str());
  Ran r;
  r.status = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
  const auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  r.out = slurp(out);
  r.err = slurp(err);
  ::unlink(out.c_str());
  ::unlink(err.c_str());
  return r;
}

// Makes the members publish what they use: a poll past the publishing interval.
void publish(std::initializer_list<Core*> cores) {
  std::this_thread::sleep_for(std::chrono::nanoseconds(node::kPublishNs + 10000000));
  for (Core* c : cores) (void)c->budget().node().asked();
}

// An HTTP GET of `path` from 127.0.0.1:`port`: the response, headers and body.
std::string http_get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string got;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;)
        got.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return got;
}

class TopTest : public NodeBudgetTest {};

TEST_F(TopTest, ShowsEveryMemberWithItsLeaseUseAndProcess) {
  FakeDriver fake;
  Core one(fake.driver(), load(kShared)), two(fake.driver(), load(kShared));
  DevPtr a = 0, b = 0;
  ASSERT_EQ(try_alloc(one, 192 * kMiB, &a), res::ok);
  ASSERT_EQ(try_alloc(two, 64 * kMiB, &b), res::ok);
  publish({&one, &two});
  const Ran r = tool(dir_, "top --once --json --dir " + dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["regions"].size(), 1u) << r.out;
  const auto& region = j["regions"][0];
  EXPECT_EQ(region["scope"], "u" + std::to_string(::geteuid()));
  ASSERT_EQ(region["gpus"].size(), 1u);
  EXPECT_EQ(region["gpus"][0]["limit"], 512 * kMiB);
  EXPECT_EQ(region["gpus"][0]["uuid"].get<std::string>().rfind("GPU-", 0), 0u);
  ASSERT_EQ(region["members"].size(), 2u) << r.out;
  std::vector<std::uint64_t> devices;
  for (const auto& m : region["members"]) {
    EXPECT_EQ(m["pid"], ::getpid());
    EXPECT_EQ(m["alive"], true);
    EXPECT_EQ(m["command"], "top_test");
    EXPECT_FALSE(m["container"].get<std::string>().empty());
    ASSERT_EQ(m["gpus"].size(), 1u);
    const auto& g = m["gpus"][0];
    EXPECT_GE(g["lease"].get<std::uint64_t>(), g["device"].get<std::uint64_t>());
    EXPECT_TRUE(g["to_device_per_s"].is_null()) << "one snapshot has no rates";
    devices.push_back(g["device"]);
  }
  std::sort(devices.begin(), devices.end());
  EXPECT_EQ(devices, (std::vector<std::uint64_t>{64 * kMiB, 192 * kMiB}));
  const Ran table = tool(dir_, "top --once --dir " + dir_);
  EXPECT_NE(table.out.find("192.0 MiB"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("top_test"), std::string::npos) << table.out;
  free_and_leave(one, {a});
  free_and_leave(two, {b});
}

TEST_F(TopTest, MetricsGoToATextfileAndOverHttp) {
  UserMember one(128 * kMiB);
  publish({&one.core});
  const std::string out = dir_ + "/textfile";
  ASSERT_EQ(::mkdir(out.c_str(), 0755), 0);
  const Ran r = tool(dir_, "top --once --quiet --dir " + dir_ + " --textfile " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  std::ifstream in(out + "/allocshim.prom");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string pid = std::to_string(::getpid());
  EXPECT_NE(text.find("# TYPE allocshim_member_device_bytes gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("allocshim_member_device_bytes{scope=\"u" + std::to_string(::geteuid()) +
                      "\",pid=\"" + pid + "\",user=\"root\""),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("gpu_uuid=\"GPU-"), std::string::npos);
  EXPECT_NE(text.find("} 134217728\n"), std::string::npos) << "128 MiB backed";
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(out)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u) << "nothing left beside it";
  ::unlink((out + "/allocshim.prom").c_str());
  ::rmdir(out.c_str());

  // Served over HTTP while it runs, refreshed at each interval; SIGTERM ends it cleanly.
  int err[2];
  ASSERT_EQ(::pipe(err), 0);
  const pid_t server = ::fork();
  if (server == 0) {
    ::dup2(err[1], 2);
    ::close(err[0]);
    ::execl(ALLOCSHIM_TOOL, ALLOCSHIM_TOOL, "top", "--quiet", "--interval", "100", "--dir",
            dir_.c_str(), "--listen", "127.0.0.1:0", static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  ::close(err[1]);
  std::string said;
  char c;
  while (said.find('\n') == std::string::npos && ::read(err[0], &c, 1) == 1) said += c;
  ::close(err[0]);
  const std::size_t at = said.find("127.0.0.1:");
  ASSERT_NE(at, std::string::npos) << said;
  const int port = std::atoi(said.c_str() + at + 10);
  std::string body;
  for (int i = 0; i < 50 && body.find("allocshim_member_lease_bytes{") == std::string::npos; ++i) {
    body = http_get(port, "/metrics");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(body.find("200 OK"), std::string::npos) << body;
  EXPECT_NE(body.find("text/plain; version=0.0.4"), std::string::npos) << body;
  EXPECT_NE(body.find("allocshim_member_lease_bytes{scope="), std::string::npos) << body;
  ::kill(server, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(server, &status, 0), server);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  free_and_leave(one.core, {one.block});
}

// Compute slices (node/compute_share.h) are shown beside the budgets: each member's share,
// priority, time run and waited, which one runs, in the table, the JSON and the metrics.
TEST_F(TopTest, ShowsComputeSlicesOfEachMember) {
  node::Region member;
  std::string error;
  const std::string path = dir_ + "/" + node::compute_region_prefix() + "all";
  ASSERT_TRUE(member.join(path, {0666, static_cast<gid_t>(-1), false}, 1000, error)) << error;
  node::Uuid uuid;
  std::memset(uuid.bytes, 3, sizeof uuid.bytes);
  int entry = -1;
  std::uint64_t limit = 0;
  ASSERT_EQ(member.attach(uuid, 0, 1000, &entry, &limit), node::Status::ok);
  member.publish_demand(entry, node::Demand{clock::now_ns(), 300, 2, 1'500'000'000, 250'000'000});
  node::Slice slice{};
  node::Demand demand[node::kSlots];
  ASSERT_TRUE(member.read_slices(entry, &slice, demand));
  bool handed = false;
  ASSERT_EQ(member.hand_slice(entry, slice.seq, member.slot(), 0, 0, 1000, &handed),
            node::Status::ok);

  const Ran r = tool(dir_, "top --once --json --dir " + dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["regions"].size(), 1u) << r.out;
  const auto& region = j["regions"][0];
  EXPECT_EQ(region["kind"], "compute");
  EXPECT_EQ(region["scope"], "all");
  ASSERT_EQ(region["members"].size(), 1u);
  const auto& g = region["members"][0]["gpus"][0];
  EXPECT_DOUBLE_EQ(g["share"].get<double>(), 0.3);
  EXPECT_EQ(g["priority"], "high");
  EXPECT_DOUBLE_EQ(g["ran_seconds"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(g["waited_seconds"].get<double>(), 0.25);
  EXPECT_EQ(g["running"], true);
  const Ran table = tool(dir_, "top --once --dir " + dir_);
  EXPECT_NE(table.out.find("compute slices, scope all"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find(" 30.0%     high       1.5s       0.2s  running"), std::string::npos)
      << table.out;
  const std::string out = dir_ + "/textfile";
  ASSERT_EQ(::mkdir(out.c_str(), 0755), 0);
  ASSERT_EQ(tool(dir_, "top --once --quiet --dir " + dir_ + " --textfile " + out).status, 0);
  std::ifstream in(out + "/allocshim.prom");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("allocshim_compute_run_seconds_total{scope=\"all\",pid=\"" +
                      std::to_string(::getpid())),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("allocshim_compute_share_ratio{"), std::string::npos) << text;
  ::unlink((out + "/allocshim.prom").c_str());
  ::rmdir(out.c_str());
  member.leave();
}

// Issue 44, item 6: a member in a PID and mount namespace of its own (a container; unshare stands
// in for a pod) shares the budget through the directory both see. top, outside, names it by its
// pid here (found through /proc/PID/ns/pid and NSpid), not by the 1 it has inside.
TEST_F(TopTest, AMemberInAnotherPidNamespaceIsNamedByItsPidHere) {
  if (::geteuid() != 0) GTEST_SKIP() << "new PID namespaces need root (CAP_SYS_ADMIN)";
  testing::Pipe host_pid, ready, done;
  const pid_t outer = testing::fork_child([&] {
    host_pid.keep_writing_end();
    ready.keep_writing_end();
    done.keep_reading_end();
    if (::unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) return 77;
    const pid_t inner = ::fork();
    if (inner == 0) {
      if (::getpid() != 1) std::_Exit(3);
      FakeDriver fake;
      Core core(fake.driver(), load(kShared));
      DevPtr a = 0;
      if (try_alloc(core, 96 * kMiB, &a) != res::ok) std::_Exit(4);
      publish({&core});
      ready.send('r');
      char c = 0;
      done.recv(&c);
      if (core.free(a, FreeRequest{}) != res::ok) std::_Exit(5);
      core.budget().leave_node();
      std::_Exit(0);
    }
    host_pid.send(inner);
    return testing::wait_child(inner);
  });
  host_pid.keep_reading_end();
  ready.keep_reading_end();
  done.keep_writing_end();
  pid_t inner = 0;
  if (!host_pid.recv(&inner)) {
    const int status = testing::wait_child(outer);
    if (status == 77) GTEST_SKIP() << "unshare(CLONE_NEWPID | CLONE_NEWNS) is not allowed here";
    FAIL() << "the container's process did not start: " << status;
  }
  char c = 0;
  ASSERT_TRUE(ready.recv(&c));
  UserMember mine(32 * kMiB);
  publish({&mine.core});
  const Ran r = tool(dir_, "top --once --json --dir " + dir_);
  done.send('x');
  EXPECT_EQ(testing::wait_child(outer), 0);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["regions"].size(), 1u) << r.out;
  std::map<std::uint64_t, nlohmann::json> by_device;
  for (const auto& m : j["regions"][0]["members"])
    by_device[m["gpus"][0]["device"].get<std::uint64_t>()] = m;
  ASSERT_EQ(by_device.size(), 2u) << r.out;
  EXPECT_EQ(by_device[32 * kMiB]["pid"], ::getpid());
  const auto& contained = by_device[96 * kMiB];
  EXPECT_EQ(contained["pid"], inner) << r.out;
  EXPECT_EQ(contained["pid_in_namespace"], 1);
  EXPECT_NE(contained["pid_namespace"], by_device[32 * kMiB]["pid_namespace"]);
  EXPECT_EQ(contained["command"], "top_test");
  free_and_leave(mine.core, {mine.block});
}

// A region file someone damaged or replaced is one line of the view, and the others still show.
TEST_F(TopTest, ADamagedRegionIsALineNotACrash) {
  const std::string damaged = region("all"), linked = region("g12345");
  { std::ofstream(damaged) << std::string(1000, 'x'); }
  ASSERT_EQ(::symlink("/etc/passwd", linked.c_str()), 0);
  UserMember one(64 * kMiB);
  const Ran r = tool(dir_, "top --once --dir " + dir_);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(damaged + ": not a budget region of this version (wrong size)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(linked + ": a symbolic link: not followed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("scope u" + std::to_string(::geteuid())), std::string::npos) << r.out;
  const Ran prom = tool(dir_, "top --once --quiet --dir " + dir_ + " --textfile " + dir_);
  EXPECT_EQ(prom.status, 0) << prom.err;
  ::unlink((dir_ + "/allocshim.prom").c_str());
  ::unlink(damaged.c_str());
  ::unlink(linked.c_str());
  free_and_leave(one.core, {one.block});
}

}  // namespace
}  // namespace allocshim
