// Tracing across fork, and the recorder's own thread. The child of a multi-threaded program may only
// do async-signal-safe work in its fork handler (another thread may have held the loader's lock),
// so its own trace starts at its first event; a child of a trace without %p is never traced (that
// file is its parent's). The writer thread takes no signal meant for the program.
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "analysis/reader.h"
#include "trace/recorder.h"

namespace {

int task_count() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// Waits for `pid` at most 30 s (a deadlocked child is killed and reported, never waited on forever).
int wait_child(pid_t pid) {
  for (int i = 0; i < 3000; ++i) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// Threads recording all the time, so that the fork lands while they are inside the recorder.
struct Busy {
  explicit Busy(Recorder* r) {
    for (int t = 0; t < 3; ++t)
      threads.emplace_back([this, r, t] {
        const DevPtr base = 0x100000000ull * static_cast<DevPtr>(t + 1);
        for (std::uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
          r->on_alloc(base + i * 256, 256, 0, 0, Api::alloc, 1);
          r->on_free(base + i * 256, 256, 0, 0, 1);
          recorded.fetch_add(2, std::memory_order_relaxed);
        }
      });
    while (recorded.load() < 1000) std::this_thread::yield();
  }
  ~Busy() {
    stop.store(true);
    for (auto& t : threads) t.join();
  }
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> recorded{0};
  std::vector<std::thread> threads;
};

constexpr DevPtr kChildBase = 0xc41d000000ull;
constexpr int kChildEvents = 10;

TEST(TraceFork, AChildOfAMultiThreadedProgramStartsItsOwnTraceAtItsFirstEvent) {
#if defined(__SANITIZE_ADDRESS__)
  // ASan runtimes before LLVM 18 (GCC 12's, clang 14's; llvm-project PR 75290) do not lock their
  // allocator around fork, so this child can hang in the runtime's first allocation.
  GTEST_SKIP() << "ASan's allocator (before LLVM 18) is not fork-safe in a multi-threaded program";
#elif defined(__SANITIZE_THREAD__) && !defined(__clang__)
  // GCC's TSan kills a child of a multi-threaded fork that starts a thread ("dup thread with used
  // id", exit 66, also in a program without allocshim); clang's runs it with die_after_fork=0.
  GTEST_SKIP()
      << "GCC's ThreadSanitizer cannot start a thread in the child of a multi-threaded fork";
#endif
  const std::string pattern = test::temp_path("fork") + ".%p.trace";
  Recorder* parent = test::start_recorder(pattern, StackMode::native);
  ASSERT_NE(parent, nullptr);
  pid_t child = -1;
  {
    Busy busy(parent);
    child = fork();
    if (child == 0) {
      const std::string own = test::temp_path("fork") + "." + std::to_string(getpid()) + ".trace";
      // Nothing started by the fork handler: no thread beside this one, no file.
      if (task_count() != 1) _exit(3);
      if (access(own.c_str(), F_OK) == 0) _exit(4);
      Recorder* r = recorder();  // the first event
      if (r == nullptr || r == parent) _exit(5);
      if (r->path() != own) _exit(6);
      for (int i = 0; i < kChildEvents; ++i)
        r->on_alloc(kChildBase + static_cast<DevPtr>(i) * 64, 64, 0, 0, Api::alloc, 1);
      if (recorder() != r) _exit(7);
      Recorder::stop();
      _exit(0);
    }
    ASSERT_GT(child, 0);
    EXPECT_EQ(wait_child(child), 0) << "3: a thread, 4: a file made by the fork handler";
  }
  Recorder::stop();

  const std::string own = test::temp_path("fork") + "." + std::to_string(child) + ".trace";
  Trace t;
  std::string error;
  ASSERT_TRUE(read_trace(own, t, error)) << error;
  EXPECT_TRUE(t.complete);
  EXPECT_EQ(t.process.pid, static_cast<std::uint32_t>(child));
  EXPECT_EQ(t.process.ppid, static_cast<std::uint32_t>(getpid()));
  ASSERT_EQ(t.events.size(), static_cast<std::size_t>(kChildEvents))
      << "only the child's own events";
  for (int i = 0; i < kChildEvents; ++i)
    EXPECT_EQ(t.events[i].addr, kChildBase + static_cast<DevPtr>(i) * 64);
  EXPECT_NE(t.events[0].stack, 0u) << "native stacks work in the child";

  Trace p;
  ASSERT_TRUE(read_trace(parent->path(), p, error)) << error;
  EXPECT_TRUE(p.complete);
  EXPECT_GT(p.events.size(), 1000u);
  for (const Event& e : p.events)
    ASSERT_LT(e.addr, kChildBase) << "a child's event in the parent's trace";
}

TEST(TraceFork, AChildOfATraceWithoutPercentPLeavesItsParentsFileAlone) {
  const std::string path = test::temp_path("fork-shared.trace");
  Recorder* parent = test::start_recorder(path, StackMode::off);
  ASSERT_NE(parent, nullptr);
  parent->on_alloc(0x1000, 16, 0, 0, Api::alloc, 1);
  parent->flush();
  const pid_t child = fork();
  if (child == 0) {
    if (recorder() != nullptr) _exit(3);
    // What the shim's init does in a child: start from the same settings.
    std::string error;
    Config c;
    c.path = path;
    c.stacks = StackMode::off;
    if (Recorder::start(c, error) != nullptr || !error.empty()) _exit(4);
    Recorder::stop();
    _exit(0);
  }
  ASSERT_GT(child, 0);
  EXPECT_EQ(wait_child(child), 0);
  parent->on_alloc(0x2000, 16, 0, 0, Api::alloc, 1);
  Recorder::stop();
  Trace t;
  std::string error;
  ASSERT_TRUE(read_trace(path, t, error)) << error;
  EXPECT_TRUE(t.complete);
  EXPECT_EQ(t.process.pid, static_cast<std::uint32_t>(getpid()));
  ASSERT_EQ(t.events.size(), 2u);
  EXPECT_EQ(t.events[1].addr, 0x2000u);
}

// SigBlk of the thread named `name`, or an empty string if there is none.
std::string blocked_signals_of(const std::string& name) {
  DIR* d = opendir("/proc/self/task");
  if (!d) return "";
  std::string mask;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string task = std::string("/proc/self/task/") + e->d_name;
    std::string comm;
    std::getline(std::ifstream(task + "/comm"), comm);
    if (comm != name) continue;
    std::ifstream status(task + "/status");
    for (std::string line; std::getline(status, line);)
      if (line.rfind("SigBlk:", 0) == 0) mask = line.substr(7);
  }
  closedir(d);
  return mask;
}

TEST(TraceWriter, TheWriterThreadBlocksTheProgramsSignals) {
  Recorder* r = test::start_recorder(test::temp_path("signals.trace"), StackMode::off);
  ASSERT_NE(r, nullptr);
  const std::string mask = blocked_signals_of("allocshim-trace");
  Recorder::stop();
  ASSERT_FALSE(mask.empty()) << "no thread named allocshim-trace";
  const unsigned long long bits = std::stoull(mask, nullptr, 16);
  for (int sig : {SIGTERM, SIGUSR1, SIGUSR2, SIGINT, SIGHUP, SIGCHLD, SIGALRM})
    EXPECT_TRUE(bits & (1ull << (sig - 1))) << "signal " << sig << " is not blocked: " << mask;
}

}  // namespace
