// Checks of the fake libcuda.so.1 on its own: the preload tests trust it to behave like the real
// library where the shim relies on it (exact exports, the resolver's choice of variant by version
// and flags, addresses identical to dlsym's), and its introspection to count what reached it.
#include <dlfcn.h>

#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include <cuda.h>
#include <gtest/gtest.h>

#include "fakecuda.h"

namespace {

using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

class FakeLibcuda : public ::testing::Test {
 protected:
  void SetUp() override {
    handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(handle, nullptr) << "the test links the fake libcuda";
    get_proc = reinterpret_cast<GetProc>(dlsym(handle, "cuGetProcAddress_v2"));
    ASSERT_NE(get_proc, nullptr);
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  }
  void* resolve(const char* name, int version, cuuint64_t flags, CUresult expect = CUDA_SUCCESS) {
    void* fn = reinterpret_cast<void*>(1);
    CUdriverProcAddressQueryResult status{};
    EXPECT_EQ(get_proc(name, &fn, version, flags, &status), expect) << name;
    EXPECT_EQ(status == CU_GET_PROC_ADDRESS_SUCCESS, expect == CUDA_SUCCESS) << name;
    return fn;
  }
  void* handle = nullptr;
  GetProc get_proc = nullptr;
};

TEST_F(FakeLibcuda, ResolverPicksTheVariantByVersion) {
  EXPECT_EQ(resolve("cuMemAlloc", 3020, 0), dlsym(handle, "cuMemAlloc_v2"));
  EXPECT_EQ(resolve("cuMemAlloc", 13000, 0), dlsym(handle, "cuMemAlloc_v2"));
  EXPECT_EQ(resolve("cuMemAlloc", 3010, 0), dlsym(handle, "cuMemAlloc"));
  EXPECT_NE(dlsym(handle, "cuMemAlloc"), dlsym(handle, "cuMemAlloc_v2"));
  EXPECT_EQ(resolve("cuMemFree", 3020, 0), dlsym(handle, "cuMemFree_v2"));
  EXPECT_EQ(resolve("cuMemAdvise", 12000, 0), dlsym(handle, "cuMemAdvise"));
  EXPECT_EQ(resolve("cuMemAdvise", 12020, 0), dlsym(handle, "cuMemAdvise_v2"));
  EXPECT_EQ(resolve("cuIpcOpenMemHandle", 12000, 0), dlsym(handle, "cuIpcOpenMemHandle_v2"));
}

TEST_F(FakeLibcuda, ResolverHonoursThePerThreadFlag) {
  const cuuint64_t ptds = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  EXPECT_EQ(resolve("cuMemAllocAsync", 12000, ptds), dlsym(handle, "cuMemAllocAsync_ptsz"));
  EXPECT_EQ(resolve("cuMemAllocAsync", 12000, 0), dlsym(handle, "cuMemAllocAsync"));
  EXPECT_EQ(resolve("cuMemAllocAsync", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM),
            dlsym(handle, "cuMemAllocAsync"));
  EXPECT_EQ(resolve("cuMemFreeAsync", 12000, ptds), dlsym(handle, "cuMemFreeAsync_ptsz"));
  EXPECT_EQ(resolve("cuMemPrefetchAsync", 12020, ptds),
            dlsym(handle, "cuMemPrefetchAsync_v2_ptsz"));
  // No per-thread variant: the plain one.
  EXPECT_EQ(resolve("cuMemAlloc", 12000, ptds), dlsym(handle, "cuMemAlloc_v2"));
}

TEST_F(FakeLibcuda, ResolverReportsUnknownNamesAndOldVersions) {
  void* fn = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult status{};
  EXPECT_EQ(get_proc("cuNoSuchFunction", &fn, 13000, 0, &status), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(get_proc("cuMemAllocAsync", &fn, 11000, 0, &status), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(get_proc("cuMemAlloc_v2", &fn, 13000, 0, &status), CUDA_ERROR_NOT_FOUND);  // base names
  // The v1 resolver has no status but the same answers.
  using GetProcV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
  auto v1 = reinterpret_cast<GetProcV1>(dlsym(handle, "cuGetProcAddress"));
  ASSERT_NE(v1, nullptr);
  EXPECT_EQ(v1("cuMemAlloc", &fn, 12000, 0), CUDA_SUCCESS);
  EXPECT_EQ(fn, dlsym(handle, "cuMemAlloc_v2"));
  EXPECT_EQ(v1("cudnnCreate", &fn, 12000, 0), CUDA_ERROR_NOT_FOUND);
}

TEST_F(FakeLibcuda, CallsAndStreamsAreCounted) {
  fakecuda_reset();
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc(&p, 1 << 20), CUDA_SUCCESS);  // cuda.h maps this to cuMemAlloc_v2
  EXPECT_EQ(fakecuda_calls("cuMemAlloc_v2"), 1u);
  EXPECT_EQ(fakecuda_calls("cuMemAlloc"), 0u);
  EXPECT_EQ(fakecuda_live_allocations(), 1u);
  EXPECT_EQ(fakecuda_used(0), 1u << 20);
  std::memset(reinterpret_cast<void*>(p), 1, 1 << 20);
  ASSERT_EQ(cuMemFree(p), CUDA_SUCCESS);

  using AllocAsync = CUresult (*)(CUdeviceptr*, size_t, CUstream);
  using FreeAsync = CUresult (*)(CUdeviceptr, CUstream);
  auto alloc_ptsz = reinterpret_cast<AllocAsync>(dlsym(handle, "cuMemAllocAsync_ptsz"));
  auto free_ptsz = reinterpret_cast<FreeAsync>(dlsym(handle, "cuMemFreeAsync_ptsz"));
  ASSERT_EQ(alloc_ptsz(&p, 4096, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(free_ptsz(p, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(fakecuda_calls("cuMemAllocAsync_ptsz"), 1u);
  EXPECT_EQ(fakecuda_last_stream("cuMemAllocAsync_ptsz"), nullptr);
  ASSERT_EQ(cuMemAllocAsync(&p, 4096, CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  EXPECT_EQ(fakecuda_last_stream("cuMemAllocAsync"), static_cast<void*>(CU_STREAM_PER_THREAD));
  ASSERT_EQ(cuMemFreeAsync(p, CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  EXPECT_EQ(fakecuda_calls("no such symbol"), 0u);
  EXPECT_EQ(fakecuda_live_allocations(), 0u);
}

TEST_F(FakeLibcuda, InjectedFailuresReachTheProgram) {
  ASSERT_EQ(fakecuda_fail_next("mem_alloc", CUDA_ERROR_OUT_OF_MEMORY, 1), 0);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc(&p, 256), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(cuMemAlloc(&p, 256), CUDA_SUCCESS);
  ASSERT_EQ(cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(fakecuda_fail_next("not_an_op", 1, 1), -1);
}

TEST_F(FakeLibcuda, VmmAndPoolsThroughTheDriverAbi) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  ASSERT_EQ(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_SUCCESS);
  ASSERT_EQ(gran, 2u << 20);
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemCreate(&h, gran, &prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAddressReserve(&va, gran, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemMap(va, gran, 0, h, 0), CUDA_SUCCESS);
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(cuMemSetAccess(va, gran, &desc, 1), CUDA_SUCCESS);
  std::memset(reinterpret_cast<void*>(va), 3, gran);
  int fd = -1;
  ASSERT_EQ(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_SUCCESS);
  EXPECT_GE(fd, 0);
  ASSERT_EQ(cuMemUnmap(va, gran), CUDA_SUCCESS);
  ASSERT_EQ(cuMemRelease(h), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAddressFree(va, gran), CUDA_SUCCESS);

  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemoryPool pool = nullptr;
  ASSERT_EQ(cuMemPoolCreate(&pool, &props), CUDA_SUCCESS);
  cuuint64_t threshold = ~0ull, reserved = 0;
  ASSERT_EQ(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold),
            CUDA_SUCCESS);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAllocFromPoolAsync(&p, 100, pool, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuMemFreeAsync(p, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
            CUDA_SUCCESS);
  EXPECT_EQ(reserved, gran);
  ASSERT_EQ(cuMemPoolDestroy(pool), CUDA_SUCCESS);
}

TEST_F(FakeLibcuda, ExportTableIsAFixedAddress) {
  const void* table = nullptr;
  CUuuid id{};
  ASSERT_EQ(cuGetExportTable(&table, &id), CUDA_SUCCESS);
  EXPECT_EQ(table, fakecuda_export_table());
}

}  // namespace

// Every name the shim hooks (shim/abi/hooks.def) or looks up for its driver table
// (shim/driver/real_calls.h) must be exported, or the preload tests would not exercise it. Read
// from the sources so a newly hooked entry point without a fake is caught here.
namespace {

std::set<std::string> names_in(const std::string& path, const std::regex& re) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  std::set<std::string> out;
  for (std::sregex_iterator it(s.begin(), s.end(), re), end; it != end; ++it) out.insert((*it)[1]);
  return out;
}

TEST(FakeLibcudaExports, CoverEveryNameTheShimUses) {
  const std::string root = ALLOCSHIM_SOURCE_DIR;
  const auto hooked =
      names_in(root + "/shim/abi/hooks.def", std::regex(R"(ALLOCSHIM_HOOK\((cu\w+))"));
  ASSERT_GT(hooked.size(), 10u) << "hooks.def not found or changed shape";
  std::ifstream rd(root + "/shim/driver/real_calls.h");
  std::stringstream text;
  text << rd.rdbuf();
  const std::string src = text.str();
  // The X(...) entries of the ALLOCSHIM_REAL_LIST macro.
  const auto start = src.find("#define ALLOCSHIM_REAL_LIST");
  ASSERT_NE(start, std::string::npos) << "real_calls.h changed shape";
  std::string list;
  for (std::size_t at = start; at < src.size();) {
    const std::size_t eol = src.find('\n', at);
    const std::string line = src.substr(at, eol - at);
    list += line;
    if (line.empty() || line.back() != '\\') break;
    at = eol + 1;
  }
  std::set<std::string> real;
  const std::regex x(R"(X\((cu\w+)\))");
  for (std::sregex_iterator it(list.begin(), list.end(), x), end; it != end; ++it)
    real.insert((*it)[1]);
  ASSERT_GT(real.size(), 10u);
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr);
  for (const std::set<std::string>* set : {&hooked, &std::as_const(real)})
    for (const std::string& n : *set) EXPECT_NE(dlsym(handle, n.c_str()), nullptr) << n;
  for (const char* n : {"cuGetProcAddress", "cuGetProcAddress_v2", "cuGetExportTable"})
    EXPECT_NE(dlsym(handle, n), nullptr) << n;
}

}  // namespace
