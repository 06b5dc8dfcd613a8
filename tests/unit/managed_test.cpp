// The `managed` backend on the fake driver: advice and prefetch per option in their CUDA 13 form
// (a CUmemLocation), stripes of 2 MiB pages kept on the host, "auto" stripes from the budget, the
// program's own cudaMallocManaged when a rule says so, and the limit: never more managed memory than
// the device has free.
#include "backends/managed.h"
#include "backends/managed_held.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/core.h"
#include "core_fixture.h"
#include "base/streams.h"
#include "fake_driver.h"

namespace allocshim {
namespace {

using fake::AdviceRecord;

constexpr std::size_t kPage = 2 * kMiB;

// Bytes of managed memory every managed backend of the process holds on `device`.
std::size_t managed_held_bytes(int device) {
  return managed_detail::held(device).load(std::memory_order_relaxed);
}

struct Fixture {
  explicit Fixture(policy::BackendSpec spec, FakeConfig c = {}) : fake(c) {
    spec.name = "managed";
    spec.kind = BackendKind::managed;
    std::string why;
    backend = make_backend(spec, fake.driver(), streams, why);
    EXPECT_NE(backend, nullptr) << why;
  }
  Result alloc(std::size_t size, DevPtr* p, Block* block, Api api = Api::alloc) {
    AllocRequest req;
    req.size = size;
    req.api = api;
    if (api == Api::managed) req.flags = 2;  // CU_MEM_ATTACH_HOST
    std::uint64_t cookie = 0;
    const Result r = backend->allocate(req, FreeSync::device, p, &cookie);
    *block = Block{size, 0, 0, api, FreeSync::device, cookie};
    return r;
  }
  std::vector<AdviceRecord> advice(Advice a) const {
    std::vector<AdviceRecord> out;
    for (const AdviceRecord& r : fake.advice())
      if (r.advice == a) out.push_back(r);
    return out;
  }
  FakeDriver fake;
  StreamTracker streams;
  std::unique_ptr<Backend> backend;
};

TEST(Managed, PlainManagedMemoryGetsNoAdvice) {
  Fixture f({});
  DevPtr p = 0;
  Block b;
  ASSERT_EQ(f.alloc(3 * kMiB, &p, &b), res::ok);
  EXPECT_EQ(f.fake.managed_used(), 3 * kMiB);
  EXPECT_TRUE(f.fake.advice().empty());
  EXPECT_TRUE(f.fake.prefetches().empty());
  EXPECT_EQ(f.fake.used(0), 0u);
  ASSERT_EQ(f.fake.driver().memset_d8(p, 1, 3 * kMiB), res::ok);
  ASSERT_EQ(f.backend->deallocate(p, b, FreeRequest{}), res::ok);
  EXPECT_EQ(f.fake.managed_used(), 0u);
  EXPECT_EQ(managed_held_bytes(0), 0u);
}

TEST(Managed, EveryOptionBecomesItsAdviceWithALocation) {
  policy::BackendSpec spec;
  spec.read_mostly = true;
  spec.preferred_location = policy::BackendSpec::Preferred::device;
  spec.accessed_by = true;
  spec.prefetch = true;
  Fixture f(spec);
  DevPtr p = 0;
  Block b;
  ASSERT_EQ(f.alloc(8 * kMiB, &p, &b), res::ok);
  ASSERT_EQ(f.advice(Advice::set_read_mostly).size(), 1u);
  const auto pref = f.advice(Advice::set_preferred_location);
  ASSERT_EQ(pref.size(), 1u);
  EXPECT_EQ(pref[0].ptr, p);
  EXPECT_EQ(pref[0].bytes, 8 * kMiB);
  EXPECT_EQ(pref[0].location.type, Location::Type::device);
  EXPECT_EQ(pref[0].location.id, 0);
  const auto acc = f.advice(Advice::set_accessed_by);
  ASSERT_EQ(acc.size(), 1u);
  EXPECT_EQ(acc[0].location.type, Location::Type::device);
  const auto pf = f.fake.prefetches();
  ASSERT_EQ(pf.size(), 1u);
  EXPECT_EQ(pf[0].location.type, Location::Type::device);
  EXPECT_EQ(pf[0].stream, kStreamLegacy)
      << "cudaMalloc-style requests prefetch on the legacy stream";
  ASSERT_EQ(f.backend->deallocate(p, b, FreeRequest{}), res::ok);
}

TEST(Managed, PreferredHostPrefetchesToTheHost) {
  policy::BackendSpec spec;
  spec.preferred_location = policy::BackendSpec::Preferred::host;
  spec.prefetch = true;
  Fixture f(spec);
  DevPtr p = 0;
  Block b;
  ASSERT_EQ(f.alloc(kMiB, &p, &b), res::ok);
  ASSERT_EQ(f.advice(Advice::set_preferred_location).size(), 1u);
  EXPECT_EQ(f.advice(Advice::set_preferred_location)[0].location.type, Location::Type::host);
  ASSERT_EQ(f.fake.prefetches().size(), 1u);
  EXPECT_EQ(f.fake.prefetches()[0].location.type, Location::Type::host);
  ASSERT_EQ(f.backend->deallocate(p, b, FreeRequest{}), res::ok);
}

TEST(Managed, AStripeKeepsAFractionOfPagesOnTheHostSpreadEvenly) {
  policy::BackendSpec spec;
  spec.stripe = 0.25;
  spec.prefetch = true;
  Fixture f(spec);
  DevPtr p = 0;
  Block b;
  ASSERT_EQ(f.alloc(16 * kPage, &p, &b), res::ok);
  std::size_t host_pages = 0, device_pages = 0;
  std::vector<bool> on_host(16, false);
  for (const AdviceRecord& r : f.advice(Advice::set_preferred_location)) {
    ASSERT_EQ((r.ptr - p) % kPage, 0u);
    for (std::size_t i = (r.ptr - p) / kPage; i < (r.ptr - p + r.bytes) / kPage; ++i) {
      on_host[i] = r.location.type == Location::Type::host;
      (on_host[i] ? host_pages : device_pages) += 1;
    }
  }
  EXPECT_EQ(host_pages, 4u);
  EXPECT_EQ(device_pages, 12u);
  for (std::size_t i : {3u, 7u, 11u, 15u}) EXPECT_TRUE(on_host[i]) << "page " << i;
  ASSERT_EQ(f.advice(Advice::set_accessed_by).size(), 1u) << "host pages are mapped, not faulted";
  EXPECT_EQ(f.fake.prefetches().size(), 8u) << "one prefetch per run";
  ASSERT_EQ(f.backend->deallocate(p, b, FreeRequest{}), res::ok);
}

TEST(Managed, APartialLastPageIsAdvisedWithinTheAllocation) {
  policy::BackendSpec spec;
  spec.stripe = 0.5;
  Fixture f(spec);
  DevPtr p = 0;
  Block b;
  ASSERT_EQ(f.alloc(3 * kPage + 100, &p, &b), res::ok);
  std::size_t covered = 0;
  for (const AdviceRecord& r : f.advice(Advice::set_preferred_location)) covered += r.bytes;
  EXPECT_EQ(covered, 3 * kPage + 100);
  ASSERT_EQ(f.backend->deallocate(p, b, FreeRequest{}), res::ok);
}

TEST(Managed, NeverMoreThanTheDeviceHasFree) {
  FakeConfig c;
  c.capacity = 64 * kMiB;
  Fixture f({}, c);
  DevPtr p = 0, q = 0;
  Block bp, bq;
  EXPECT_EQ(f.alloc(65 * kMiB, &p, &bp), res::out_of_memory);
  EXPECT_EQ(f.fake.calls(FakeOp::mem_alloc_managed), 0u) << "refused before the driver is asked";
  ASSERT_EQ(f.alloc(40 * kMiB, &p, &bp), res::ok);
  EXPECT_EQ(f.alloc(40 * kMiB, &q, &bq), res::out_of_memory) << "what it holds counts";
  ASSERT_EQ(f.backend->deallocate(p, bp, FreeRequest{}), res::ok);
  DevPtr d = 0;
  ASSERT_EQ(f.fake.driver().mem_alloc(&d, 32 * kMiB), res::ok);
  EXPECT_EQ(f.alloc(40 * kMiB, &q, &bq), res::out_of_memory) << "device memory in use counts";
  ASSERT_EQ(f.alloc(30 * kMiB, &q, &bq), res::ok);
  ASSERT_EQ(f.backend->deallocate(q, bq, FreeRequest{}), res::ok);
  f.fake.driver().mem_free(d);
  EXPECT_EQ(managed_held_bytes(0), 0u);
}

TEST(Managed, TheProgramsOwnManagedRequestKeepsItsFlags) {
  Fixture f({});
  DevPtr p = 0;
  Block b;
  ASSERT_EQ(f.alloc(kMiB, &p, &b, Api::managed), res::ok);  // CU_MEM_ATTACH_HOST is valid
  f.fake.fail_next(FakeOp::mem_alloc_managed, res::invalid_value);
  DevPtr q = 0;
  Block bq;
  EXPECT_EQ(f.alloc(kMiB, &q, &bq, Api::managed), res::invalid_value);
  EXPECT_EQ(managed_held_bytes(0), kMiB) << "a refused request holds nothing";
  ASSERT_EQ(f.backend->deallocate(p, b, FreeRequest{}), res::ok);
}

TEST(Managed, StripeAutoComesFromTheBudgetThroughTheCore) {
  FakeDriver fake;
  Core core(fake.driver(), testing::parsed(R"(
[budget]
device = "64MiB"

[backends.m]
kind = "managed"
stripe = "auto"

[[rules]]
api = "managed"
backend = "m"
)"));
  const DevPtr small =
      testing::must_alloc(core, 32 * kMiB, Api::managed);  // fits the budget: no stripe
  EXPECT_TRUE(fake.advice().empty());
  const DevPtr big = testing::must_alloc(
      core, 128 * kMiB, Api::managed);  // twice the budget: every other page on the host
  std::size_t host = 0;
  for (const AdviceRecord& r : fake.advice())
    if (r.advice == Advice::set_preferred_location && r.location.type == Location::Type::host)
      host += r.bytes;
  EXPECT_EQ(host, 64 * kMiB);
  EXPECT_EQ(fake.used(0), 0u) << "managed memory is not counted against the budget";
  ASSERT_EQ(core.free(small, FreeRequest{}), res::ok);
  ASSERT_EQ(core.free(big, FreeRequest{}), res::ok);
}

}  // namespace
}  // namespace allocshim
