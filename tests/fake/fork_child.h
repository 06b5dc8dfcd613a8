// The fork tests' fixture: a child process that runs a function and exits with its result (never
// returning into GoogleTest, whose state it shares), its exit status as one number, and pipes to
// step parent and child through a test. Children inherit the fake driver: its memfd-backed memory
// and exported handles are real across the fork.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>

namespace allocshim::testing {

// Runs `body` in a forked child that exits with its return value. The child is killed after
// `alarm_s` seconds, so a parent that failed before its last step never leaves it behind.
inline pid_t fork_child(const std::function<int()>& body, unsigned alarm_s = 20) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(alarm_s);
    std::_Exit(body());
  }
  EXPECT_GE(pid, 0) << "fork failed";
  return pid;
}

// Waits for the child: its exit status, 128 + the signal that killed it, or -1 if it is not ours.
inline int wait_child(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A pipe carrying fixed-size values (a byte for a step) from one process to the other. Each side
// closes the end it does not use, so a side that died is an end of file to the other, not a read
// that never returns.
struct Pipe {
  Pipe() { EXPECT_EQ(::pipe(fd), 0); }
  ~Pipe() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  void keep_reading_end() { close_end(1); }
  void keep_writing_end() { close_end(0); }
  template <class T>
  bool send(const T& v) {
    return ::write(fd[1], &v, sizeof v) == static_cast<ssize_t>(sizeof v);
  }
  template <class T>
  bool recv(T* v) {
    std::size_t got = 0;
    while (got < sizeof *v) {
      const ssize_t n = ::read(fd[0], reinterpret_cast<char*>(v) + got, sizeof *v - got);
      if (n <= 0) return false;
      got += static_cast<std::size_t>(n);
    }
    return true;
  }
  int fd[2] = {-1, -1};

 private:
  void close_end(int i) {
    if (fd[i] >= 0) ::close(fd[i]);
    fd[i] = -1;
  }
};

}  // namespace allocshim::testing
