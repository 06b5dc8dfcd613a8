/* Route (d): a -lcuda program run with another interposer (preload_wrap.c) beside the shim. It
 * reports what the interposer counted and what reached the fake; the harness knows the load order
 * and checks each layer was passed exactly once. */
#include <stdint.h>

#include "prog_util.h"

enum { kAllocs = 20, kQueries = 7 };

int main(void) {
  init_context();
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  CHECK(cuda != NULL);
  const unsigned long long* counts =
      (const unsigned long long*)dlsym(RTLD_DEFAULT, "preload_wrap_counts");
  CHECK(counts != NULL);

  /* The program's own RTLD_NEXT lookup: the next definition after the executable is the first
   * preloaded library's, which is also what the default scope finds first. */
  void* next = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
  void* first = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
  CHECK(next != NULL && next == first);

  CUdeviceptr ptrs[kAllocs];
  for (int i = 0; i < kAllocs; ++i) {
    CHECK_CU(cuMemAlloc(&ptrs[i], 65536));
    touch(ptrs[i], 65536, (unsigned)i);
  }
  for (int i = 0; i < kQueries; ++i) {
    CUdevice d = -1;
    CHECK_CU(cuCtxGetDevice(&d));
    CHECK(d == 0);
  }
  for (int i = 0; i < kAllocs; ++i) CHECK_CU(cuMemFree(ptrs[i]));

  report("alloc", kAllocs);
  report("queries", kQueries);
  report("wrap_alloc", counts[0]);
  report("wrap_free", counts[1]);
  report("wrap_query", counts[2]);
  report("wrap_recursion", counts[3]);
  report("fake_cuMemAlloc_v2", fake_calls(cuda, "cuMemAlloc_v2"));
  report("fake_cuCtxGetDevice", fake_calls(cuda, "cuCtxGetDevice"));
  return 0;
}
