/* Route (b): the static CUDA runtime's way in. libcuda is dlopened, only the resolver is looked
 * up with dlsym, and every entry point comes from cuGetProcAddress_v2 by base name and version. */
#include <stdint.h>

#include "prog_util.h"

typedef CUresult (*get_proc_v1_fn)(const char*, void**, int, cuuint64_t);
typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*alloc_fn)(CUdeviceptr*, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*alloc_v1_fn)(unsigned*, unsigned);

enum { kAllocs = 100 };

int main(void) {
  void* cuda = NULL;
  get_proc_v2_fn get_proc = open_resolver(&cuda);

  init_fn init = (init_fn)resolve_at_version(get_proc, "cuInit", 2000);
  alloc_fn alloc = (alloc_fn)resolve_at_version(get_proc, "cuMemAlloc", 3020);
  free_fn release = (free_fn)resolve_at_version(get_proc, "cuMemFree", 3020);
  CHECK_CU(init(0));

  /* Every way of naming the current variant yields the same function. */
  CHECK(dlsym(cuda, "cuMemAlloc_v2") == (void*)alloc);
  CHECK(resolve_at_version(get_proc, "cuMemAlloc", 13000) == (void*)alloc);
  get_proc_v1_fn get_proc_v1 = (get_proc_v1_fn)dlsym(cuda, "cuGetProcAddress");
  CHECK(get_proc_v1 != NULL);
  void* via_v1 = NULL;
  CHECK_CU(get_proc_v1("cuMemAlloc", &via_v1, 12000, 0));
  CHECK(via_v1 == (void*)alloc);

  /* The 32-bit v1 cuMemAlloc has another ABI: it must come back as itself, never as the _v2 hook. */
  void* v1 = resolve_at_version(get_proc, "cuMemAlloc", 3000);
  CHECK(v1 != (void*)alloc);
  CHECK(v1 == dlsym(cuda, "cuMemAlloc"));
  unsigned small = 0;
  CHECK_CU_IS(((alloc_v1_fn)v1)(&small, 256), CUDA_ERROR_NOT_SUPPORTED);

  CUdeviceptr ptrs[kAllocs];
  for (int i = 0; i < kAllocs; ++i) {
    const size_t n = 1000 + (size_t)i * 4096;
    CHECK_CU(alloc(&ptrs[i], n));
    touch(ptrs[i], n, (unsigned)i);
  }
  for (int i = 0; i < kAllocs; ++i) CHECK_CU(release(ptrs[i]));

  report("alloc", kAllocs);
  report("fake_cuMemAlloc_v2", fake_calls(cuda, "cuMemAlloc_v2"));
  report("fake_cuMemFree_v2", fake_calls(cuda, "cuMemFree_v2"));
  report("fake_cuMemAlloc", fake_calls(cuda, "cuMemAlloc"));
  return 0;
}
