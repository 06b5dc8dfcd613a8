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
#include "fork_child.h"
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

// The fork tests' fixture (tests/fake/fork_child.h) under the names these tests use.
inline pid_t spawn(const std::function<int()>& body) {
  return allocshim::testing::fork_child(body);
}
inline int wait_exit(pid_t pid) { return allocshim::testing::wait_child(pid); }
using Channel = allocshim::testing::Pipe;

// The handle of the shim's block `b`, exported (not passed through to the driver).
inline IpcHandle exported(Exporter& exporter, DevPtr b) {
  IpcHandle h{};
  bool pass = true;
  EXPECT_EQ(exporter.export_block(b, &h, &pass), res::ok);
  EXPECT_FALSE(pass);
  return h;
}

inline HandleFields fields(const IpcHandle& h) {
  HandleFields f;
  EXPECT_EQ(decode(h, &f), Decoded::ours);
  return f;
}

}  // namespace allocshim::ipc::test
