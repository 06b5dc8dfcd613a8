/* Route (a): a program linked against libcuda (-lcuda) calling the exported symbols. cuda.h maps
 * cuMemAlloc to cuMemAlloc_v2 and so on, so these are the symbols the shim must export. */
#include <stdint.h>

#include "prog_util.h"

enum { kAllocs = 100, kPitch = 10, kManaged = 5, kHost = 5, kAsync = 3 };

int main(void) {
  init_context();
  void* self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  CHECK(self != NULL);

  CUdeviceptr ptrs[kAllocs];
  for (int i = 0; i < kAllocs; ++i) {
    const size_t n = (size_t)256 << (i % 12);
    CHECK_CU(cuMemAlloc(&ptrs[i], n));
    CHECK(ptrs[i] % 256 == 0);
    touch(ptrs[i], n, (unsigned)i);
  }
  /* Queries on an interior pointer of memory the program owns. */
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK_CU(cuMemGetAddressRange(&base, &size, ptrs[5] + 100));
  CHECK(base == ptrs[5] && size == (size_t)256 << 5);
  CUdeviceptr start = 0;
  CHECK_CU(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptrs[7] + 3));
  CHECK(start == ptrs[7]);
  size_t free_bytes = 0, total = 0;
  CHECK_CU(cuMemGetInfo(&free_bytes, &total));
  /* <=: under the host and managed backends these blocks take no device memory. */
  CHECK(total > 0 && free_bytes <= total);
  for (int i = 0; i < kAllocs; ++i) CHECK_CU(cuMemFree(ptrs[i]));

  for (int i = 0; i < kPitch; ++i) {
    CUdeviceptr p = 0;
    size_t pitch = 0;
    CHECK_CU(cuMemAllocPitch(&p, &pitch, 1000, 4, 4));
    CHECK(pitch >= 1000);
    touch(p, pitch * 4, 1);
    CHECK_CU(cuMemFree(p));
  }
  for (int i = 0; i < kManaged; ++i) {
    CUdeviceptr p = 0;
    CHECK_CU(cuMemAllocManaged(&p, 1 << 20, CU_MEM_ATTACH_GLOBAL));
    touch(p, 1 << 20, 2);
    CHECK_CU(cuMemFree(p));
  }
  for (int i = 0; i < kHost; ++i) {
    void* h = NULL;
    CHECK_CU(cuMemHostAlloc(&h, 8192, CU_MEMHOSTALLOC_PORTABLE));
    memset(h, 7, 8192);
    CHECK_CU(cuMemFreeHost(h));
  }
  for (int i = 0; i < kAsync; ++i) {
    CUdeviceptr p = 0;
    CHECK_CU(cuMemAllocAsync(&p, 4096, NULL));
    touch(p, 4096, 3);
    CHECK_CU(cuMemFreeAsync(p, NULL));
  }
  CHECK_CU(cuStreamSynchronize(NULL));
  /* A pointer no allocator handed out: the free is forwarded and the driver's error comes back. */
  CHECK_CU_IS(cuMemFree((CUdeviceptr)0x7f0000001000ull), CUDA_ERROR_INVALID_VALUE);

  report("alloc", kAllocs);
  report("pitch", kPitch);
  report("managed", kManaged);
  report("host", kHost);
  report("async", kAsync);
  report("fake_cuMemAlloc_v2", fake_calls(self, "cuMemAlloc_v2"));
  report("fake_cuMemFree_v2", fake_calls(self, "cuMemFree_v2"));
  report("fake_cuMemAllocPitch_v2", fake_calls(self, "cuMemAllocPitch_v2"));
  report("fake_cuMemAllocManaged", fake_calls(self, "cuMemAllocManaged"));
  report("fake_cuMemHostAlloc", fake_calls(self, "cuMemHostAlloc"));
  report("fake_cuMemAllocAsync", fake_calls(self, "cuMemAllocAsync"));
  return 0;
}
