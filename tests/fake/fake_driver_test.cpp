// Tests of the fake driver itself: every other unit and conformance test trusts its accounting,
// its VMM rules and its stream model, so each rule here is checked to fail when broken.
#include "fake_driver.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include <cuda.h>
#include <gtest/gtest.h>

#include "fake_test_util.h"
#include "fork_child.h"

namespace allocshim::fake {
namespace {

using namespace allocshim::fake::testing;

TEST_F(FakeDriverTest, EveryTableEntryIsFilled) {
  auto* entries = reinterpret_cast<void* const*>(&d);
  for (int i = 0; i < kFakeOpCount; ++i)
    EXPECT_NE(entries[i], nullptr) << op_name(static_cast<FakeOp>(i));
  FakeOp op{};
  ASSERT_TRUE(op_from_name("mem_create", &op));
  EXPECT_EQ(op, FakeOp::mem_create);
  EXPECT_FALSE(op_from_name("no_such_op", &op));
}

TEST_F(FakeDriverTest, DevicesReportCapacityAndAttributes) {
  int n = 0, v = -1;
  ASSERT_EQ(d.device_get_count(&n), res::ok);
  EXPECT_EQ(n, 2);
  std::size_t total = 0;
  ASSERT_EQ(d.device_total_mem(&total, 1), res::ok);
  EXPECT_EQ(total, 64 * kMiB);
  EXPECT_EQ(d.device_total_mem(&total, 2), res::invalid_device);
  ASSERT_EQ(d.device_get_attribute(&v, DevAttr::vmm_supported, 0), res::ok);
  EXPECT_EQ(v, 1);
  char name[64];
  ASSERT_EQ(d.device_get_name(name, sizeof(name), 1), res::ok);
  EXPECT_NE(std::strstr(name, "1"), nullptr);
}

TEST_F(FakeDriverTest, MemAllocCountsAgainstCapacityAndIsUsable) {
  std::size_t free = 0, total = 0;
  DevPtr p = 0;
  ASSERT_EQ(d.mem_alloc(&p, 1000), res::ok);
  EXPECT_EQ(p % 256, 0u);
  EXPECT_EQ(fake.used(0), 1024u);  // rounded up to 256
  ASSERT_EQ(d.mem_get_info(&free, &total), res::ok);
  EXPECT_EQ(total, 64 * kMiB);
  EXPECT_EQ(free, 64 * kMiB - 1024);
  fill_and_check(p, 1000, 7);

  DevPtr big = 0;
  EXPECT_EQ(d.mem_alloc(&big, 64 * kMiB), res::out_of_memory);
  ASSERT_EQ(d.mem_alloc(&big, 64 * kMiB - 1024), res::ok);
  EXPECT_EQ(fake.used(0), 64 * kMiB);
  ASSERT_EQ(d.mem_free(big), res::ok);
  ASSERT_EQ(d.mem_free(p), res::ok);
  EXPECT_EQ(fake.used(0), 0u);
  EXPECT_EQ(d.mem_free(p), res::invalid_value);  // double free
  EXPECT_EQ(d.mem_alloc(&p, 0), res::invalid_value);
  EXPECT_EQ(fake.live_allocations(), 0u);
}

TEST_F(FakeDriverTest, AllocationsGoToTheCurrentDevice) {
  fake.set_current_device(1);
  DevPtr p = 0;
  ASSERT_EQ(d.mem_alloc(&p, 4096), res::ok);
  EXPECT_EQ(fake.used(0), 0u);
  EXPECT_EQ(fake.used(1), 4096u);
  int ordinal = -1;
  ASSERT_EQ(d.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p + 10),
            res::ok);
  EXPECT_EQ(ordinal, 1);
  ASSERT_EQ(d.mem_free(p), res::ok);
  fake.set_current_device(0);
}

TEST_F(FakeDriverTest, PitchIsAlignedAndCoversTheRows) {
  DevPtr p = 0;
  std::size_t pitch = 0;
  ASSERT_EQ(d.mem_alloc_pitch(&p, &pitch, 1000, 3, 4), res::ok);
  EXPECT_EQ(pitch, 1024u);
  fill_and_check(p, pitch * 3, 1);
  EXPECT_EQ(d.mem_alloc_pitch(&p, &pitch, 1000, 3, 3), res::invalid_value);
}

TEST_F(FakeDriverTest, ContextsArePerThread) {
  Context c1 = nullptr, cur = nullptr;
  ASSERT_EQ(d.primary_ctx_retain(&c1, 1), res::ok);
  ASSERT_EQ(d.ctx_set_current(c1), res::ok);
  int dev = -1;
  ASSERT_EQ(d.ctx_get_device(&dev), res::ok);
  EXPECT_EQ(dev, 1);
  std::thread([&] {
    int other = -1;
    EXPECT_EQ(d.ctx_get_device(&other), res::ok);
    EXPECT_EQ(other, 0);  // implicit primary context of device 0
    Context none = c1;
    EXPECT_EQ(d.ctx_get_current(&none), res::ok);
    EXPECT_EQ(none, nullptr);
  }).join();
  ASSERT_EQ(d.ctx_get_current(&cur), res::ok);
  EXPECT_EQ(cur, c1);
  EXPECT_EQ(d.ctx_set_current(reinterpret_cast<Context>(0x1234)), res::invalid_context);
  ASSERT_EQ(d.primary_ctx_release(1), res::ok);
  EXPECT_EQ(d.primary_ctx_release(1), res::invalid_context);
  ASSERT_EQ(d.ctx_set_current(nullptr), res::ok);
}

TEST(FakeDriverConfig, WithoutImplicitContextCallsNeedOne) {
  FakeConfig c;
  c.implicit_context = false;
  FakeDriver fake(c);
  DevPtr p = 0;
  int dev = 0;
  EXPECT_EQ(fake.driver().ctx_get_device(&dev), res::invalid_context);
  EXPECT_EQ(fake.driver().mem_alloc(&p, 256), res::invalid_context);
  fake.set_current_device(0);
  EXPECT_EQ(fake.driver().mem_alloc(&p, 256), res::ok);
}

TEST_F(FakeDriverTest, PeerAccessIsRecordedOnce) {
  Context c1 = nullptr;
  ASSERT_EQ(d.primary_ctx_retain(&c1, 1), res::ok);
  ASSERT_EQ(d.ctx_enable_peer_access(c1, 0), res::ok);
  EXPECT_TRUE(fake.peer_enabled(0, 1));
  EXPECT_FALSE(fake.peer_enabled(1, 0));
  EXPECT_EQ(d.ctx_enable_peer_access(c1, 0), res::peer_access_already_enabled);
}

TEST_F(FakeDriverTest, VmmCreateMapAccessUnmapRelease) {
  std::size_t g = 0;
  ASSERT_EQ(d.mem_get_granularity(&g, PhysSpec{}), res::ok);
  ASSERT_EQ(g, kGran);

  DevPtr va = 0;
  ASSERT_EQ(d.mem_address_reserve(&va, 8 * kGran, 4 * kGran, 0), res::ok);
  EXPECT_EQ(va % (4 * kGran), 0u);
  EXPECT_EQ(d.mem_address_reserve(&va, kGran + 1, 0, 0), res::invalid_value);

  MemHandle h = 0;
  EXPECT_EQ(d.mem_create(&h, kGran + 4096, PhysSpec{}), res::invalid_value);
  ASSERT_EQ(d.mem_create(&h, 2 * kGran, PhysSpec{}), res::ok);
  EXPECT_EQ(fake.used(0), 2 * kGran);  // physical memory counts, reservations do not

  // Refused: outside the reservation, partly outside, misaligned, past the handle's end.
  EXPECT_EQ(d.mem_map(va - kGran, kGran, 0, h), res::invalid_value);
  EXPECT_EQ(d.mem_map(va + 7 * kGran, 2 * kGran, 0, h), res::invalid_value);
  EXPECT_EQ(d.mem_map(va + 4096, kGran, 0, h), res::invalid_value);
  EXPECT_EQ(d.mem_map(va, kGran, 2 * kGran, h), res::invalid_value);
  EXPECT_EQ(d.mem_map(va, kGran, 0, h + 1000), res::invalid_value);

  ASSERT_EQ(d.mem_map(va, 2 * kGran, 0, h), res::ok);
  EXPECT_EQ(d.mem_map(va + kGran, kGran, 0, h), res::invalid_value);  // over a mapping
  // The same handle mapped a second time aliases the same bytes.
  ASSERT_EQ(d.mem_map(va + 4 * kGran, kGran, kGran, h), res::ok);
  ASSERT_EQ(d.mem_set_access(va, 2 * kGran, 0, true), res::ok);
  EXPECT_TRUE(fake.has_access(va + kGran, 0, true));
  EXPECT_FALSE(fake.has_access(va + kGran, 1, false));
  EXPECT_EQ(d.mem_set_access(va, 3 * kGran, 0, true), res::invalid_value);  // unmapped tail
  ASSERT_EQ(d.mem_set_access(va + 4 * kGran, kGran, 1, true), res::ok);
  EXPECT_TRUE(fake.has_access(va + 4 * kGran, 1, true));
  ASSERT_EQ(set_access_flags(va + 4 * kGran, kGran, 1, true, false), res::ok);  // read-only
  EXPECT_TRUE(fake.has_access(va + 4 * kGran, 1, false));
  EXPECT_FALSE(fake.has_access(va + 4 * kGran, 1, true));
  ASSERT_EQ(d.mem_set_access(va + 4 * kGran, kGran, 1, false), res::ok);  // revoked
  EXPECT_FALSE(fake.has_access(va + 4 * kGran, 1, false));
  fill_and_check(va, 2 * kGran, 3);
  auto* second = reinterpret_cast<unsigned char*>(va + 4 * kGran);
  EXPECT_EQ(second[5], reinterpret_cast<unsigned char*>(va + kGran)[5]);

  MemHandle again = 0;
  ASSERT_EQ(d.mem_retain_allocation_handle(&again, va + kGran + 100), res::ok);
  EXPECT_EQ(again, h);
  ASSERT_EQ(d.mem_release(again), res::ok);

  // Unmap must cover whole mappings.
  EXPECT_EQ(d.mem_unmap(va, kGran), res::invalid_value);
  EXPECT_EQ(d.mem_unmap(va, 3 * kGran), res::invalid_value);
  // Released but still mapped: the memory stays (and stays counted).
  ASSERT_EQ(d.mem_release(h), res::ok);
  EXPECT_EQ(d.mem_release(h), res::invalid_value);
  EXPECT_EQ(fake.used(0), 2 * kGran);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(va)[1], static_cast<unsigned char>(31 + 3));
  EXPECT_EQ(d.mem_address_free(va, 8 * kGran), res::invalid_value);  // still mapped
  ASSERT_EQ(d.mem_unmap(va, 2 * kGran), res::ok);
  EXPECT_FALSE(fake.is_mapped(va));
  EXPECT_EQ(fake.used(0), 2 * kGran);  // the second mapping holds it
  ASSERT_EQ(d.mem_unmap(va + 4 * kGran, kGran), res::ok);
  EXPECT_EQ(fake.used(0), 0u);
  EXPECT_EQ(fake.live_handles(), 0u);
  // The range is reserved again: mappable anew.
  ASSERT_EQ(d.mem_create(&h, kGran, PhysSpec{}), res::ok);
  ASSERT_EQ(d.mem_map(va, kGran, 0, h), res::ok);
  ASSERT_EQ(d.mem_unmap(va, kGran), res::ok);
  ASSERT_EQ(d.mem_release(h), res::ok);
  EXPECT_EQ(d.mem_address_free(va, 4 * kGran), res::invalid_value);  // size must match
  ASSERT_EQ(d.mem_address_free(va, 8 * kGran), res::ok);
  EXPECT_EQ(fake.reservations(), 0u);
}

TEST_F(FakeDriverTest, UnmapMaySpanSeveralWholeMappings) {
  DevPtr va = 0;
  MemHandle a = 0, b = 0;
  ASSERT_EQ(d.mem_address_reserve(&va, 4 * kGran, 0, 0), res::ok);
  ASSERT_EQ(d.mem_create(&a, kGran, PhysSpec{}), res::ok);
  ASSERT_EQ(d.mem_create(&b, kGran, PhysSpec{}), res::ok);
  ASSERT_EQ(d.mem_map(va, kGran, 0, a), res::ok);
  ASSERT_EQ(d.mem_map(va + kGran, kGran, 0, b), res::ok);
  ASSERT_EQ(d.mem_set_access(va, 2 * kGran, 0, true), res::ok);  // across both
  fill_and_check(va, 2 * kGran, 9);
  ASSERT_EQ(d.mem_unmap(va, 2 * kGran), res::ok);
  EXPECT_EQ(fake.mappings(), 0u);
  ASSERT_EQ(d.mem_release(a), res::ok);
  ASSERT_EQ(d.mem_release(b), res::ok);
  ASSERT_EQ(d.mem_address_free(va, 4 * kGran), res::ok);
}

TEST_F(FakeDriverTest, HostLocatedHandlesCountAgainstTheHost) {
  MemHandle h = 0;
  PhysSpec host;
  host.location = {Location::Type::host_numa, 0};
  ASSERT_EQ(d.mem_create(&h, kGran, host), res::ok);
  EXPECT_EQ(fake.used(0), 0u);
  EXPECT_EQ(fake.host_used(), kGran);
  PhysSpec dev1;
  dev1.location = {Location::Type::device, 1};
  MemHandle h1 = 0;
  ASSERT_EQ(d.mem_create(&h1, kGran, dev1), res::ok);
  EXPECT_EQ(fake.used(1), kGran);
  PhysSpec bad;
  bad.location = {Location::Type::device, 5};
  EXPECT_EQ(d.mem_create(&h1, kGran, bad), res::invalid_device);
  ASSERT_EQ(d.mem_release(h), res::ok);
  EXPECT_EQ(fake.host_used(), 0u);
}

TEST_F(FakeDriverTest, DeviceCapacityBoundsMemCreate) {
  std::vector<MemHandle> hs(32);
  for (auto& h : hs) ASSERT_EQ(d.mem_create(&h, kGran, PhysSpec{}), res::ok);
  MemHandle extra = 0;
  EXPECT_EQ(d.mem_create(&extra, kGran, PhysSpec{}), res::out_of_memory);
  ASSERT_EQ(d.mem_release(hs[0]), res::ok);
  EXPECT_EQ(d.mem_create(&extra, kGran, PhysSpec{}), res::ok);
}

TEST_F(FakeDriverTest, ExportedHandleReimportsToTheSameBytes) {
  PhysSpec spec;
  spec.posix_fd = true;
  MemHandle h = 0, plain = 0, imported = 0;
  ASSERT_EQ(d.mem_create(&plain, kGran, PhysSpec{}), res::ok);
  int fd = -1;
  EXPECT_EQ(d.mem_export_to_fd(&fd, plain), res::invalid_value);  // not requested at create
  ASSERT_EQ(d.mem_create(&h, kGran, spec), res::ok);
  ASSERT_EQ(d.mem_export_to_fd(&fd, h), res::ok);
  ASSERT_EQ(d.mem_import_from_fd(&imported, fd), res::ok);
  close(fd);
  EXPECT_NE(imported, h);
  EXPECT_EQ(d.mem_export_to_fd(&fd, imported), res::invalid_value);  // as the driver: not again
  EXPECT_EQ(fake.used(0), 2 * kGran);  // an import is the same physical memory

  DevPtr va = 0;
  ASSERT_EQ(d.mem_address_reserve(&va, 2 * kGran, 0, 0), res::ok);
  ASSERT_EQ(d.mem_map(va, kGran, 0, h), res::ok);
  ASSERT_EQ(d.mem_map(va + kGran, kGran, 0, imported), res::ok);
  fill_and_check(va, kGran, 5);
  EXPECT_EQ(std::memcmp(reinterpret_cast<void*>(va), reinterpret_cast<void*>(va + kGran), kGran),
            0);
  ASSERT_EQ(d.mem_unmap(va, 2 * kGran), res::ok);
  ASSERT_EQ(d.mem_release(imported), res::ok);
  ASSERT_EQ(d.mem_release(h), res::ok);
  ASSERT_EQ(d.mem_release(plain), res::ok);
  EXPECT_EQ(fake.used(0), 0u);
}

TEST_F(FakeDriverTest, ExportedHandleCrossesProcesses) {
  PhysSpec spec;
  spec.posix_fd = true;
  MemHandle h = 0;
  ASSERT_EQ(d.mem_create(&h, kGran, spec), res::ok);
  int fd = -1;
  ASSERT_EQ(d.mem_export_to_fd(&fd, h), res::ok);
  const pid_t pid = allocshim::testing::fork_child([&] {
    // The child maps the exported fd on its own (same fake state, inherited at fork).
    MemHandle in = 0;
    DevPtr va = 0;
    if (d.mem_import_from_fd(&in, fd) != res::ok) return 1;
    if (d.mem_address_reserve(&va, kGran, 0, 0) != res::ok) return 2;
    if (d.mem_map(va, kGran, 0, in) != res::ok) return 3;
    std::memset(reinterpret_cast<void*>(va), 0x5a, kGran);
    return 0;
  });
  ASSERT_EQ(allocshim::testing::wait_child(pid), 0);
  DevPtr va = 0;
  ASSERT_EQ(d.mem_address_reserve(&va, kGran, 0, 0), res::ok);
  ASSERT_EQ(d.mem_map(va, kGran, 0, h), res::ok);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(va)[kGran - 1], 0x5a);
  close(fd);
}

TEST(FakeDriverStrict, MappingsAreInaccessibleUntilSetAccess) {
  FakeConfig c;
  c.strict_access = true;
  FakeDriver fake(c);
  const Driver& d = fake.driver();
  DevPtr va = 0;
  MemHandle h = 0;
  ASSERT_EQ(d.mem_address_reserve(&va, kGran, 0, 0), res::ok);
  ASSERT_EQ(d.mem_create(&h, kGran, PhysSpec{}), res::ok);
  ASSERT_EQ(d.mem_map(va, kGran, 0, h), res::ok);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(*reinterpret_cast<volatile char*>(va) = 1, "");
  ASSERT_EQ(d.mem_set_access(va, kGran, 0, true), res::ok);
  *reinterpret_cast<volatile char*>(va) = 1;
  EXPECT_EQ(*reinterpret_cast<volatile char*>(va), 1);
}

TEST_F(FakeDriverTest, ManagedAdviceAndPrefetchAreRecorded) {
  DevPtr m = 0, plain = 0;
  ASSERT_EQ(d.mem_alloc_managed(&m, 4 * kMiB, CU_MEM_ATTACH_GLOBAL), res::ok);
  EXPECT_EQ(fake.used(0), 0u);
  EXPECT_EQ(fake.managed_used(), 4 * kMiB);
  fill_and_check(m, 4 * kMiB, 8);
  const Location host{Location::Type::host, 0};
  ASSERT_EQ(d.mem_advise(m, 2 * kMiB, Advice::set_preferred_location, host), res::ok);
  ASSERT_EQ(d.mem_prefetch_async(m + kMiB, kMiB, Location{}, kStreamLegacy), res::ok);
  ASSERT_EQ(fake.advice().size(), 1u);
  EXPECT_EQ(fake.advice()[0].advice, Advice::set_preferred_location);
  EXPECT_EQ(fake.advice()[0].location.type, Location::Type::host);
  ASSERT_EQ(fake.prefetches().size(), 1u);
  EXPECT_EQ(fake.prefetches()[0].ptr, m + kMiB);
  ASSERT_EQ(d.mem_alloc(&plain, kMiB), res::ok);
  EXPECT_EQ(d.mem_advise(plain, kMiB, Advice::set_read_mostly, Location{}), res::invalid_value);
  EXPECT_EQ(d.mem_advise(m, 8 * kMiB, Advice::set_read_mostly, Location{}), res::invalid_value);
  unsigned managed = 0;
  ASSERT_EQ(d.pointer_get_attribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, m + 3), res::ok);
  EXPECT_EQ(managed, 1u);
  ASSERT_EQ(d.pointer_get_attribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, plain), res::ok);
  EXPECT_EQ(managed, 0u);
  ASSERT_EQ(d.mem_free(m), res::ok);
  EXPECT_EQ(fake.managed_used(), 0u);
}

TEST_F(FakeDriverTest, HostAllocationsArePinnedHostMemory) {
  void* h = nullptr;
  ASSERT_EQ(d.mem_host_alloc(&h, 10000, CU_MEMHOSTALLOC_DEVICEMAP), res::ok);
  EXPECT_EQ(fake.host_used(), 12288u);
  unsigned type = 0;
  ASSERT_EQ(
      d.pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<DevPtr>(h)),
      res::ok);
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_HOST));
  EXPECT_EQ(d.mem_free(reinterpret_cast<DevPtr>(h)), res::invalid_value);
  ASSERT_EQ(d.mem_free_host(h), res::ok);
  ASSERT_EQ(d.mem_alloc_host(&h, 1), res::ok);
  ASSERT_EQ(d.mem_free_host(h), res::ok);
  EXPECT_EQ(fake.host_used(), 0u);
}

TEST_F(FakeDriverTest, PointerQueriesAnswerForInteriorPointers) {
  DevPtr p = 0;
  ASSERT_EQ(d.mem_alloc(&p, 5000), res::ok);
  DevPtr base = 0, start = 0;
  std::size_t size = 0, range = 0;
  ASSERT_EQ(d.mem_get_address_range(&base, &size, p + 4999), res::ok);
  EXPECT_EQ(base, p);
  EXPECT_EQ(size, 5000u);
  EXPECT_EQ(d.mem_get_address_range(&base, &size, p + 5000 + kMiB * 1000), res::not_found);

  unsigned type = 0;
  int ordinal = -1;
  unsigned char pad[16];
  std::memset(pad, 0xff, sizeof(pad));
  int attrs[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                 CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  void* data[] = {&start, &range, &type, &ordinal};
  ASSERT_EQ(d.pointer_get_attributes(4, attrs, data, p + 100), res::ok);
  EXPECT_EQ(start, p);
  EXPECT_EQ(range, 5000u);
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_DEVICE));
  EXPECT_EQ(ordinal, 0);

  // Unknown memory: an error for one attribute, null values for several.
  int on_stack = 0;
  const auto host = reinterpret_cast<DevPtr>(&on_stack);
  EXPECT_EQ(d.pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, host),
            res::invalid_value);
  ASSERT_EQ(d.pointer_get_attributes(4, attrs, data, host), res::ok);
  EXPECT_EQ(type, 0u);
  EXPECT_EQ(start, 0u);

  // VMM memory answers with its mapping.
  DevPtr va = 0;
  MemHandle h = 0;
  ASSERT_EQ(d.mem_address_reserve(&va, 2 * kGran, 0, 0), res::ok);
  ASSERT_EQ(d.mem_create(&h, 2 * kGran, PhysSpec{}), res::ok);
  ASSERT_EQ(d.mem_map(va, 2 * kGran, 0, h), res::ok);
  ASSERT_EQ(d.pointer_get_attribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, va + kGran),
            res::ok);
  EXPECT_EQ(start, va);
}

TEST_F(FakeDriverTest, IpcHandleReopensInProcessAndAfterFork) {
  DevPtr p = 0, q = 0;
  ASSERT_EQ(d.mem_alloc(&p, 3 * 4096), res::ok);
  IpcHandle h{};
  ASSERT_EQ(d.ipc_get_mem_handle(&h, p), res::ok);
  EXPECT_EQ(d.ipc_get_mem_handle(&h, p + 256), res::invalid_value);  // whole allocations only
  ASSERT_EQ(d.ipc_get_mem_handle(&h, p), res::ok);
  ASSERT_EQ(d.ipc_open_mem_handle(&q, h, 0), res::ok);
  EXPECT_NE(q, p);
  reinterpret_cast<unsigned char*>(q)[4097] = 0x42;
  EXPECT_EQ(reinterpret_cast<unsigned char*>(p)[4097], 0x42);
  ASSERT_EQ(d.ipc_close_mem_handle(q), res::ok);

  const pid_t pid = allocshim::testing::fork_child([&] {
    DevPtr c = 0;
    if (d.ipc_open_mem_handle(&c, h, 0) != res::ok) return 1;
    reinterpret_cast<unsigned char*>(c)[5] = 0x77;
    return d.ipc_close_mem_handle(c) == res::ok ? 0 : 2;
  });
  EXPECT_EQ(allocshim::testing::wait_child(pid), 0);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(p)[5], 0x77);  // the child wrote device memory
}

TEST_F(FakeDriverTest, CopiesAndFillsStayInsideDeviceMemory) {
  DevPtr p = 0;
  ASSERT_EQ(d.mem_alloc(&p, 1000), res::ok);
  ASSERT_EQ(d.memset_d8(p, 0xab, 1000), res::ok);
  unsigned char out[1000];
  ASSERT_EQ(d.memcpy_dtoh(out, p, sizeof(out)), res::ok);
  EXPECT_EQ(out[999], 0xab);
  const unsigned char in[4] = {1, 2, 3, 4};
  ASSERT_EQ(d.memcpy_htod(p + 996, in, 4), res::ok);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(p)[999], 4);
  EXPECT_EQ(d.memcpy_htod(p + 997, in, 4), res::invalid_value);  // one byte past the end
  EXPECT_EQ(d.memset_d8(reinterpret_cast<DevPtr>(&out[0]), 0, 1), res::invalid_value);
}

TEST_F(FakeDriverTest, InjectedFailuresAndCallCounts) {
  MemHandle h = 0;
  fake.fail_next(FakeOp::mem_create, res::out_of_memory, 2, 1);
  EXPECT_EQ(d.mem_create(&h, kGran, PhysSpec{}), res::ok);  // skipped
  EXPECT_EQ(d.mem_create(&h, kGran, PhysSpec{}), res::out_of_memory);
  EXPECT_EQ(d.mem_create(&h, kGran, PhysSpec{}), res::out_of_memory);
  EXPECT_EQ(d.mem_create(&h, kGran, PhysSpec{}), res::ok);
  EXPECT_EQ(fake.calls(FakeOp::mem_create), 4u);
  EXPECT_EQ(fake.used(0), 2 * kGran);  // failed calls had no effect
  EXPECT_EQ(fake.calls(FakeOp::mem_alloc), 0u);

  DevPtr p = 0;
  fake.fail_next(FakeOp::mem_alloc, res::unknown);
  fake.clear_failures();
  EXPECT_EQ(d.mem_alloc(&p, 1), res::ok);
  fake.reset_calls();
  EXPECT_EQ(fake.total_calls(), 0u);
}

TEST(FakeDriverThreads, ThirtyTwoThreadsChurn) {
  FakeConfig c;
  c.capacity = 4 * kGiB;
  FakeDriver fake(c);
  const Driver& d = fake.driver();
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 32; ++t) {
    threads.emplace_back([&, t] {
      Stream s = nullptr;
      if (d.stream_create(&s, kStreamNonBlocking) != res::ok) ++errors;
      for (int i = 0; i < 200; ++i) {
        DevPtr p = 0, q = 0;
        const std::size_t n = 256 + static_cast<std::size_t>((t * 7919 + i * 104729) % 100000);
        if (d.mem_alloc(&p, n) != res::ok) {
          ++errors;
          continue;
        }
        if (d.mem_alloc_async(&q, n, s) != res::ok) {
          ++errors;
          continue;
        }
        auto* b = reinterpret_cast<unsigned char*>(p);
        b[0] = static_cast<unsigned char>(t);
        b[n - 1] = static_cast<unsigned char>(i);
        std::memset(reinterpret_cast<void*>(q), t, n);
        if (b[0] != static_cast<unsigned char>(t)) ++errors;
        if (d.mem_free_async(q, s) != res::ok) ++errors;
        if (d.mem_free(p) != res::ok) ++errors;
        if (i % 50 == 0 && d.stream_synchronize(s) != res::ok) ++errors;
      }
      if (d.stream_destroy(s) != res::ok) ++errors;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(fake.calls(FakeOp::mem_alloc), 32u * 200u);
  EXPECT_EQ(fake.live_allocations(), 0u);
  ASSERT_EQ(d.ctx_synchronize(), res::ok);
  EXPECT_EQ(fake.used(0), 0u);  // every cached pool block released at the sync (threshold 0)
}

}  // namespace
}  // namespace allocshim::fake
