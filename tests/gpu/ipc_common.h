// Helpers shared by the IPC GPU programs (ipc_test.cu, ipc_bench.cu): error checks, handles as hex
// on a command line, and child processes started afresh (fork + exec of this very program: a CUDA
// process cannot use CUDA in a plain forked child) that talk to the parent over two pipes, which
// the child finds as file descriptors 3 (from the parent) and 4 (to the parent).
//
// A child inherits the environment, so under `allocshim run` it runs under the shim too (the shim
// handles need that). Its statistics go to a file of its own (ALLOCSHIM_STATS gets ".child-%p"), so
// that the parent's, which the GPU harness compares with the parent's counts, are not overwritten.
#pragma once

#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_common.h"

extern char** environ;

namespace ipc_gpu {

inline constexpr int kFromParent = 3;
inline constexpr int kToParent = 4;

using gpu_test::require_gpu;

template <class Handle>
std::string to_hex(const Handle& h) {
  static_assert(sizeof h.reserved == 64);
  std::string s;
  char buf[3];
  for (char c : h.reserved) {
    std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned char>(c));
    s += buf;
  }
  return s;
}

template <class Handle>
Handle from_hex(const char* hex) {
  Handle h{};
  EXPECT(std::strlen(hex) == 2 * sizeof h.reserved, "handle %s is not %zu hex digits", hex,
         2 * sizeof h.reserved);
  for (std::size_t i = 0; i < sizeof h.reserved; ++i) {
    unsigned v = 0;
    EXPECT(std::sscanf(hex + 2 * i, "%2x", &v) == 1, "bad hex in handle");
    h.reserved[i] = static_cast<char>(v);
  }
  return h;
}

// The environment for a child: its own stats file, and without the shim if `without_shim`.
inline std::vector<std::string> child_environment(bool without_shim) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string v = *e;
    if (v.rfind("ALLOCSHIM_STATS=", 0) == 0) v += ".child-%p";
    if (without_shim && v.rfind("LD_PRELOAD=", 0) == 0) {
      // Keep whatever else is preloaded; drop the shim.
      std::string kept = "LD_PRELOAD=", item;
      const std::string list = v.substr(11) + ":";
      for (char c : list) {
        if (c != ':' && c != ' ') {
          item += c;
          continue;
        }
        if (!item.empty() && item.find("allocshim") == std::string::npos) kept += item + ":";
        item.clear();
      }
      v = kept;
    }
    env.push_back(v);
  }
  return env;
}

struct Child {
  pid_t pid = -1;
  int to = -1;    // write end: the child's fd 3
  int from = -1;  // read end: the child's fd 4

  void send(char c) const { EXPECT(write(to, &c, 1) == 1, "cannot write to child %d", pid); }
  char recv() const {
    char c = 0;
    EXPECT(read(from, &c, 1) == 1, "child %d went away", pid);
    return c;
  }
  std::string recv_line() const {
    std::string s;
    for (char c = recv(); c != '\n'; c = recv()) s += c;
    return s;
  }
  int wait() {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    close(to);
    close(from);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

// Starts this program again with `args` (argv[1...]).
inline Child spawn(const std::vector<std::string>& args, bool without_shim = false) {
  // Close-on-exec, so that later children do not hold this one's pipes open.
  int down[2], up[2];
  EXPECT(pipe2(down, O_CLOEXEC) == 0 && pipe2(up, O_CLOEXEC) == 0, "pipe");
  std::vector<std::string> env = child_environment(without_shim);
  // Everything the child needs is built before fork: it only moves fds and execs.
  std::vector<char*> argv{const_cast<char*>("/proc/self/exe")};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::fflush(stdout);
  const pid_t pid = fork();
  EXPECT(pid >= 0, "fork");
  if (pid == 0) {
    // up[1] may sit on fd 3: move it out of the way first.
    const int up_w = up[1] == kFromParent ? dup(up[1]) : up[1];
    if (down[0] != kFromParent) dup2(down[0], kFromParent);
    if (up_w != kToParent) dup2(up_w, kToParent);
    fcntl(kFromParent, F_SETFD, 0);  // dup2 clears close-on-exec; a no-op dup2 would not have
    fcntl(kToParent, F_SETFD, 0);
    execve("/proc/self/exe", argv.data(), envp.data());
    _exit(127);
  }
  close(down[0]);
  close(up[1]);
  return Child{pid, down[1], up[0]};
}

// The child's side of the pipes.
inline void to_parent(char c) { EXPECT(write(kToParent, &c, 1) == 1, "parent went away"); }
inline void to_parent(const std::string& line) {
  const std::string s = line + "\n";
  EXPECT(write(kToParent, s.data(), s.size()) == static_cast<ssize_t>(s.size()),
         "parent went away");
}
inline char from_parent() {
  char c = 0;
  EXPECT(read(kFromParent, &c, 1) == 1, "parent went away");
  return c;
}

inline double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace ipc_gpu
