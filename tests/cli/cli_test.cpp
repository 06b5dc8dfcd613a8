// Every `allocshim` command on bad input: a message naming the problem and the documented exit
// status (README.md, "The allocshim command": 2 for a bad command line or an input that cannot be
// read, 1 for inputs that were read but are invalid), never an abort and never a started program.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace {

namespace fs = std::filesystem;

struct Result {
  int status = -1;  // exit status; 128 + signal when killed
  std::string out, err;
};

class Cli : public testing::Test {
 protected:
  void SetUp() override {
    std::string templ = testing::TempDir() + "allocshim_cli_XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
  }

  // Runs `allocshim ARGS` in the test's directory, with `env` and without the shim's variables
  // from the caller's environment.
  Result run(const std::string& args, const std::string& env = "") const {
    const std::string err = path(".stderr");
    const std::string cmd = "cd '" + dir_.string() +
                            "' && env -u ALLOCSHIM_POLICY -u ALLOCSHIM_BACKEND -u ALLOCSHIM_CONF " +
                            env + " '" ALLOCSHIM_BIN "' " + args + " 2>'" + err + "'";
    Result r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    for (std::size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
    const int st = pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    std::ifstream in(err, std::ios::binary);
    r.err.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    fs::remove(err);
    return r;
  }

  fs::path dir_;
};

#define EXPECT_FAILS(result, code, text)                                     \
  do {                                                                       \
    const Result r_ = (result);                                              \
    EXPECT_EQ(r_.status, code) << r_.err;                                    \
    EXPECT_NE(r_.err.find(text), std::string::npos) << "stderr: " << r_.err; \
  } while (0)

// A program that leaves a mark when it starts: proof that a refused run started nothing.
const std::string kMarker = "-- sh -c 'touch started'";

TEST_F(Cli, RunRefusesABadBackendBeforeTheProgramStarts) {
  EXPECT_FAILS(run("run --backend bogus " + kMarker), 2, "--backend:1:1: ");
  EXPECT_FAILS(run("run --backend bogus " + kMarker), 2, "not starting sh");
  EXPECT_FALSE(fs::exists(path("started")));
}

TEST_F(Cli, RunRefusesABadConfBeforeTheProgramStarts) {
  const Result r = run("run --conf fre_sync=none " + kMarker);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_TRUE(r.err.starts_with("--conf:1:1: ")) << r.err;
  EXPECT_NE(r.err.find("fre_sync"), std::string::npos) << r.err;
  EXPECT_FAILS(run("run --conf free_sync=nope " + kMarker), 2, "--conf:1:11: ");
  EXPECT_FALSE(fs::exists(path("started")));
}

TEST_F(Cli, RunChecksWhatTheShimWouldReadFromTheEnvironment) {
  // The shim reads these variables whether or not the options were given: a bad one stops the
  // run too, located in the variable.
  EXPECT_FAILS(run("run " + kMarker, "ALLOCSHIM_BACKEND=bogus"), 2, "ALLOCSHIM_BACKEND:1:1: ");
  EXPECT_FAILS(run("run " + kMarker, "ALLOCSHIM_CONF=budget.device=lots"), 2,
               "ALLOCSHIM_CONF:1:15: ");
  write("bad.toml", "[defaults]\nbackend = \"nope\"\n");
  EXPECT_FAILS(run("run " + kMarker, "ALLOCSHIM_POLICY=bad.toml"), 2, "bad.toml:2:11: ");
  EXPECT_FAILS(run("run --policy bad.toml " + kMarker), 2, "invalid policy bad.toml");
  EXPECT_FAILS(run("run --policy missing.toml " + kMarker), 2, "missing.toml");
  EXPECT_FALSE(fs::exists(path("started")));
  // An option replaces the variable, as in the shim.
  const Result r = run("run --backend vmm " + kMarker, "ALLOCSHIM_BACKEND=bogus");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::exists(path("started")));
}

TEST_F(Cli, RunStartsTheProgramWithGoodOptionsAndReturnsItsStatus) {
  write("good.toml", "[defaults]\nbackend = \"async_pool\"\n");
  Result r =
      run("run --policy good.toml --backend vmm --conf free_sync=barrier,budget.device=1GiB " +
          kMarker);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::exists(path("started")));
  EXPECT_EQ(run("run -- sh -c 'exit 3'").status, 3);
  EXPECT_FAILS(run("run"), 2, "no command given");
  EXPECT_FAILS(run("run --bogus -- true"), 2, "--bogus");
}

TEST_F(Cli, TraceCommandsSayWhatIsWrongWithTheirInputs) {
  fs::create_directory(path("a_directory"));
  write("garbage.trace", "this is not a trace");
  for (const char* cmd : {"report", "advise", "replay --simulate 1GiB"}) {
    SCOPED_TRACE(cmd);
    const std::string c = cmd;
    // Cannot be read: a usage error, 2.
    EXPECT_FAILS(run(c + " missing.trace"), 2, "missing.trace: No such file or directory");
    EXPECT_FAILS(run(c + " a_directory"), 2, "a_directory: is a directory");
    EXPECT_FAILS(run(c), 2, "traces is required");
    // Read, but not a trace: 1.
    EXPECT_FAILS(run(c + " garbage.trace"), 1, "garbage.trace: ");
  }
  EXPECT_FAILS(run("report --format svg garbage.trace"), 2, "unknown format \"svg\"");
  EXPECT_FAILS(run("report --sort size garbage.trace"), 2, "unknown metric \"size\"");
  EXPECT_FAILS(run("report --top many garbage.trace"), 2, "--top");
  EXPECT_FAILS(run("replay --simulate 12XB garbage.trace"), 2, "--simulate wants a device size");
  EXPECT_FAILS(run("replay --simulate 0B garbage.trace"), 2, "--simulate wants a device size");
  EXPECT_FAILS(run("replay --devices 0 --simulate 1GiB garbage.trace"), 2, "--devices");
  write("bad.toml", "[defaults]\nbackend = \"nope\"\n");
  EXPECT_FAILS(run("replay --policy bad.toml --simulate 1GiB garbage.trace"), 2, "bad.toml:2:11: ");
  EXPECT_FAILS(run("replay --policy missing.toml --simulate 1GiB garbage.trace"), 2,
               "missing.toml");
}

// report --step: the step the shim learned, from a stats file in the shim's format
// (shim/core/summary.cpp): a header, then each allocation the step names with its place.
TEST_F(Cli, ReportShowsTheLearnedStepOfAStatsFile) {
  const std::string place = std::string(16, '#') + std::string(48, '.');
  write("stats.json",
        "{\"migration\": {\"step\": {\"epoch\": 40, \"repeats\": true, \"submissions\": 120,"
        " \"synchronizations\": 1, \"steps_recorded\": 3, \"match_permille\": 998,"
        " \"submitted_ns\": 12500000, \"allocations_named\": 1},"
        " \"allocations\": [[0, 4096, 2097152, 0, 2, 9, 3, 40, 16, 16, 0, 0, 0, 0, 0, 0, \"" +
            std::string(64, '.') +
            "\"], [0, 8192, 0, 4194304, 1, 30, 3, 40, 16, 16, 0, 5, 0, 29, 30, 90, \"" + place +
            "\"]]}}");
  const Result r = run("report --step stats.json");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("learned step: 120 submissions, 1 synchronizations by the program, 12.5 ms"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("0x2000"), std::string::npos) << "the allocation the step names" << r.out;
  EXPECT_NE(r.out.find("|" + place + "|"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("75%"), std::string::npos) << "idle 90 of 120 submissions" << r.out;
  EXPECT_EQ(r.out.find("0x1000"), std::string::npos) << "not named in the step" << r.out;
  EXPECT_NE(r.out.find("1 movable allocations not named"), std::string::npos) << r.out;

  write("nostep.json", "{\"migration\": {\"step\": {\"epoch\": 0}, \"allocations\": []}}");
  EXPECT_NE(run("report --step nostep.json").out.find("no step learned"), std::string::npos);
  write("nomigration.json", "{\"pid\": 1}");
  EXPECT_FAILS(run("report --step nomigration.json"), 1, "no \"migration\" section");
  write("garbage.json", "not json");
  EXPECT_FAILS(run("report --step garbage.json"), 1, "not a stats file");
  EXPECT_FAILS(run("report --step missing.json"), 2, "missing.json");
  EXPECT_FAILS(run("report --step stats.json some.trace"), 2, "not traces");
}

TEST_F(Cli, CheckUsesTheSameConventionForFiles) {
  fs::create_directory(path("a_directory"));
  EXPECT_FAILS(run("check missing.toml"), 2, "missing.toml: No such file or directory");
  EXPECT_FAILS(run("check a_directory"), 2, "a_directory: is a directory");
  write("bad.toml", "[defaults]\nbackend = \"nope\"\n");
  EXPECT_FAILS(run("check bad.toml"), 1, "bad.toml:2:11: ");
}

// Every input path is read as a stream or refused at once: a FIFO nobody writes to is never waited
// on (`timeout` turns a wait into 137), and a fed one is read like a file.
TEST_F(Cli, NoCommandWaitsOnAFifoWithoutAWriter) {
  ASSERT_EQ(mkfifo(path("fifo").c_str(), 0600), 0);
  const std::string guard = "timeout -s KILL 60";
  EXPECT_FAILS(run("check fifo", guard), 2, "fifo: no data");
  EXPECT_FAILS(run("report --step fifo", guard), 1, "fifo: no data");
  EXPECT_FAILS(run("replay --policy fifo --simulate 1GiB fifo", guard), 2,
               "fifo: cannot read policy file: no data");
  EXPECT_FAILS(run("run --policy fifo " + kMarker, guard), 2, "fifo is a pipe or FIFO");
  EXPECT_FAILS(run("run " + kMarker, "ALLOCSHIM_POLICY=fifo " + guard), 2,
               "fifo is a pipe or FIFO");
  EXPECT_FALSE(fs::exists(path("started")));
  for (const char* cmd : {"report", "advise", "replay --simulate 1GiB"}) {
    SCOPED_TRACE(cmd);
    EXPECT_FAILS(run(std::string(cmd) + " fifo", guard), 1, "fifo: ");
  }

  // Fed: the policy is in the FIFO before check starts, and the writer closes once it was read.
  const std::string policy = "[defaults]\nbackend = \"vmm\"\n";
  write("good.toml", policy);
  const Result file = run("check good.toml");
  ASSERT_EQ(file.status, 0) << file.err;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t writer = fork();
  if (writer == 0) {
    const int fd = open(path("fifo").c_str(), O_RDWR);  // never waits: it is a reader too
    if (fd < 0 || ::write(fd, policy.data(), policy.size()) != static_cast<ssize_t>(policy.size()))
      _exit(1);
    if (::write(ready[1], "r", 1) != 1) _exit(1);
    for (int left = 1; ioctl(fd, FIONREAD, &left) == 0 && left > 0;) usleep(1000);
    _exit(0);
  }
  ASSERT_GT(writer, 0);
  close(ready[1]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  const Result fed = run("check fifo", guard);
  kill(writer, SIGKILL);  // if the reader never drained it
  waitpid(writer, nullptr, 0);
  EXPECT_EQ(fed.status, 0) << fed.err;
  // The same policy; only the first line, which names the source, differs.
  EXPECT_EQ(fed.out.substr(fed.out.find('\n')), file.out.substr(file.out.find('\n')));
}

TEST_F(Cli, EveryCommandRejectsAnUnknownOptionWithTwo) {
  for (const char* cmd :
       {"run", "check", "doctor", "report x", "advise x", "replay x", "top", "ctl 1 status"}) {
    SCOPED_TRACE(cmd);
    EXPECT_FAILS(run(std::string(cmd) + " --no-such-option"), 2, "--no-such-option");
  }
  EXPECT_FAILS(run(""), 2, "subcommand");
  EXPECT_FAILS(run("frobnicate"), 2, "subcommand");
  EXPECT_EQ(run("--help").status, 0);
}

TEST_F(Cli, CtlSaysWhatIsWrongWithItsProcessOrItsAction) {
  EXPECT_FAILS(run("ctl 1 nap"), 2, "nap");
  EXPECT_FAILS(run("ctl -5 sleep"), 2, "pid");
  EXPECT_FAILS(run("ctl 4194305 status"), 1, "no such process");
  // A process not under the shim (this test's own shell has none of its sockets).
  EXPECT_FAILS(run("ctl $$ status"), 1, "no control socket");
  const Result j = run("ctl 4194305 status --json");
  EXPECT_EQ(j.status, 1);
  EXPECT_NE(j.out.find("\"ok\":false"), std::string::npos) << j.out;
}

}  // namespace
