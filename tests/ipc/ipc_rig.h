// Shared set-up of the IPC tests: a core on the fake driver serving one backend kind, helpers to
// allocate, fill and check memory (fake device addresses are host addresses), and to run a child
// process (fork: the child inherits the fake device, and the fake's memfd-backed memory and exports
// make its imports real).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "core/core.h"
#include "fake_driver.h"
#include "ipc/exporter.h"
#include "ipc/handle.h"
#include "ipc/importer.h"

namespace allocshim::ipc::test {

using fake::FakeConfig;
using fake::FakeDriver;
using fake::kMiB;

inline policy::Policy policy_for(BackendKind kind, bool ipc) {
  policy::Policy p;
  policy::BackendSpec s;
  s.name = backend_kind_name(kind);
  s.kind = kind;
  s.ipc = ipc;  // exportable pools (async_pool) and chunks (vmm)
  p.backends.push_back(s);
  p.default_backend = 0;
  p.default_free_sync = FreeSync::device;
  p.source = "<ipc test>";
  return p;
}

struct Rig {
  explicit Rig(BackendKind kind, bool ipc = true, FakeConfig config = {})
      : fake(config), core(fake.driver(), policy_for(kind, ipc)) {}

  DevPtr alloc(std::size_t bytes) {
    AllocRequest req;
    req.size = bytes;
    DevPtr p = 0;
    EXPECT_EQ(core.alloc(req, &p), res::ok);
    return p;
  }
  Result free(DevPtr p) { return core.free(p, FreeRequest{}); }
  // The backend instance of `kind` (the core also holds a native one for passthrough).
  const Backend& backend(BackendKind kind) const {
    for (std::size_t i = 0; i < core.backend_count(); ++i)
      if (core.backend(i).kind() == kind) return core.backend(i);
    ADD_FAILURE() << "no backend of kind " << backend_kind_name(kind);
    return core.backend(0);
  }
  const Driver& driver() const { return fake.driver(); }

  FakeDriver fake;
  Core core;
};

inline void fill(DevPtr p, std::size_t bytes, unsigned char seed) {
  auto* b = reinterpret_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < bytes; ++i) b[i] = static_cast<unsigned char>(seed + i * 7);
}

inline bool holds(DevPtr p, std::size_t bytes, unsigned char seed) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < bytes; ++i)
    if (b[i] != static_cast<unsigned char>(seed + i * 7)) return false;
  return true;
}

// Waits until `done()` holds (the broker works on its own thread), for at most five seconds.
inline bool eventually(const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Runs `body` in a forked child, which exits with its return value (never returning into gtest).
inline pid_t spawn(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  return pid;
}

inline int wait_exit(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

// A pipe carrying fixed-size values between parent and child. After the fork each side keeps only
// its own end (reading() / writing()), so that a peer that exits early gives end-of-file: the test
// fails at once instead of waiting forever for a value.
struct Channel {
  Channel() { EXPECT_EQ(pipe(fd), 0); }
  ~Channel() {
    for (int f : fd)
      if (f >= 0) close(f);
  }
  Channel& reading() { return drop(1); }
  Channel& writing() { return drop(0); }
  Channel& drop(int end) {
    if (fd[end] >= 0) close(fd[end]);
    fd[end] = -1;
    return *this;
  }
  template <class T>
  bool send(const T& v) {
    return write(fd[1], &v, sizeof v) == static_cast<ssize_t>(sizeof v);
  }
  template <class T>
  bool recv(T* v) {
    std::size_t got = 0;
    while (got < sizeof *v) {
      const ssize_t n = read(fd[0], reinterpret_cast<char*>(v) + got, sizeof *v - got);
      if (n <= 0) return false;
      got += static_cast<std::size_t>(n);
    }
    return true;
  }
  int fd[2] = {-1, -1};
};

inline HandleFields fields(const IpcHandle& h) {
  HandleFields f;
  EXPECT_EQ(decode(h, &f), Decoded::ours);
  return f;
}

}  // namespace allocshim::ipc::test
