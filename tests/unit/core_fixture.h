// What the unit tests share, so that each file says only what it tests: policies (the one most
// tests start from, and one read from TOML text), allocating through a Core, finding a backend in
// it, a backend alone on the fake driver with the blocks it handed out, and a directory a test
// must leave empty.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/core.h"
#include "base/streams.h"
#include "fake_driver.h"
#include "policy/policy.h"

namespace allocshim {
// The fake driver's names every unit test uses.
using fake::FakeConfig;
using fake::FakeDriver;
using fake::FakeOp;
using fake::kGiB;
using fake::kMiB;
}  // namespace allocshim

namespace allocshim::testing {

// One backend of `kind`, serving everything with `sync`.
inline policy::Policy single(BackendKind kind, FreeSync sync = FreeSync::device) {
  policy::Policy p;
  policy::BackendSpec s;
  s.name = backend_kind_name(kind);
  s.kind = kind;
  p.backends.push_back(s);
  p.default_backend = 0;
  p.default_free_sync = sync;
  p.source = "<test>";
  return p;
}

// The policy in `text`, every backend kind allowed (routing is under test, not which kinds this
// build has switched on); each diagnostic fails the calling test, named after `file`.
inline policy::Policy parsed(const std::string& text, const char* file = "test.toml") {
  policy::Policy p;
  std::vector<policy::Diagnostic> errors;
  EXPECT_TRUE(policy::load_string(text, file, p, errors, policy::LoadOptions{policy::kAllKinds}));
  for (const auto& e : errors) ADD_FAILURE() << e.str();
  return p;
}

// A cudaMalloc-style request of `size` bytes through the core (a managed one attaches globally).
inline Result try_alloc(Core& core, std::size_t size, DevPtr* p, Api api = Api::alloc) {
  AllocRequest req;
  req.size = size;
  req.api = api;
  if (api == Api::managed) req.flags = 1;  // CU_MEM_ATTACH_GLOBAL
  return core.alloc(req, p);
}

// The same, failing the test when the core refuses it.
inline DevPtr must_alloc(Core& core, std::size_t size, Api api = Api::alloc) {
  DevPtr p = 0;
  EXPECT_EQ(try_alloc(core, size, &p, api), res::ok) << size << " bytes";
  return p;
}

// The core's first backend of `kind` (and `name`, when given); null when it has none.
inline const Backend* find_backend(const Core& core, BackendKind kind, const char* name = nullptr) {
  for (std::size_t i = 0; i < core.backend_count(); ++i)
    if (core.backend(i).kind() == kind && (!name || core.backend(i).name() == name))
      return &core.backend(i);
  return nullptr;
}

// Its index in the core's backend table; backend_count() when it has none.
inline std::size_t backend_index(const Core& core, BackendKind kind, const char* name = nullptr) {
  const Backend* b = find_backend(core, kind, name);
  for (std::size_t i = 0; i < core.backend_count(); ++i)
    if (&core.backend(i) == b) return i;
  return core.backend_count();
}

// The host spill target a budget with spill = "host" adds; null without one.
inline const Backend* spill_target(const Core& core) {
  return find_backend(core, BackendKind::host, "spill (host)");
}

// One backend alone on the fake driver, and the blocks it handed out (what the core's registry
// would hold; any thread may allocate and free). `Base` is the GoogleTest fixture class
// (::testing::Test, or TestWithParam<T>).
template <class Base = ::testing::Test>
class BackendFixture : public Base {
 protected:
  explicit BackendFixture(fake::FakeConfig config = {}) : fake(config) {}
  // A fake of `devices` devices of `capacity` bytes each (memfd-backed: only bytes touched cost
  // host memory); with `strict_access`, memory is unusable until cuMemSetAccess, as on a GPU.
  static fake::FakeConfig devices(int count, std::size_t capacity, bool strict_access = false) {
    fake::FakeConfig c;
    c.devices = count;
    c.capacity = capacity;
    c.strict_access = strict_access;
    return c;
  }
  void TearDown() override { backend.reset(); }

  void make(BackendKind kind, policy::BackendSpec spec = {}) {
    spec.kind = kind;
    if (spec.name.empty()) spec.name = backend_kind_name(kind);
    std::string why;
    backend = make_backend(spec, d, streams, why);
    ASSERT_NE(backend, nullptr) << why;
  }
  // Serves `req` with `sync` and records the block; the test fails if the backend refuses it.
  DevPtr alloc_request(const AllocRequest& req, FreeSync sync) {
    DevPtr p = 0;
    std::uint64_t cookie = 0;
    const Result r = backend->allocate(req, sync, &p, &cookie);
    EXPECT_EQ(r, res::ok) << req.size << " bytes";
    std::lock_guard lock(mutex);
    if (r == res::ok) {
      EXPECT_EQ(blocks.count(p), 0u) << "handed out twice: " << p;
      blocks[p] = Block{req.size, 0, static_cast<std::int16_t>(req.device), req.api, sync, cookie};
    }
    return p;
  }
  DevPtr alloc_on(std::size_t size, FreeSync sync, int device = 0, Api api = Api::alloc,
                  Stream stream = kStreamLegacy) {
    AllocRequest req;
    req.size = size;
    req.device = device;
    req.api = api;
    req.stream = stream;
    return alloc_request(req, sync);
  }
  void free(DevPtr p, FreeRequest req = {}) {
    Block b;
    {
      std::lock_guard lock(mutex);
      b = blocks.at(p);
      blocks.erase(p);
    }
    EXPECT_EQ(backend->deallocate(p, b, req), res::ok);
  }

  fake::FakeDriver fake;
  const Driver& d = fake.driver();
  StreamTracker streams;
  std::unique_ptr<Backend> backend;
  std::mutex mutex;  // guards blocks
  std::map<DevPtr, Block> blocks;
};

// A directory of the test's own under /tmp, named `prefix`-XXXXXX; the test fails unless it
// leaves the directory empty.
class EmptyDirTest : public ::testing::Test {
 protected:
  explicit EmptyDirTest(const char* prefix) : dir_(std::string("/tmp/") + prefix + "-XXXXXX") {}
  void SetUp() override { ASSERT_NE(::mkdtemp(dir_.data()), nullptr) << dir_; }
  void TearDown() override { EXPECT_EQ(::rmdir(dir_.c_str()), 0) << dir_ << " is not empty"; }
  std::string dir_;
};

}  // namespace allocshim::testing
