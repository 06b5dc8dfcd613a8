/* 32 threads allocating and freeing at once through the exported symbols: the shim's registry and
 * statistics must count every call exactly once, and every block must be usable while live. */
#include <pthread.h>
#include <stdint.h>

#include "prog_util.h"

enum { kThreads = 32, kIterations = 200, kLive = 4 };

static CUcontext g_ctx;

static void* worker(void* arg) {
  const unsigned t = (unsigned)(uintptr_t)arg;
  CHECK_CU(cuCtxSetCurrent(g_ctx));
  CUdeviceptr live[kLive] = {0};
  size_t sizes[kLive] = {0};
  for (unsigned i = 0; i < kIterations; ++i) {
    const unsigned slot = i % kLive;
    if (live[slot] != 0) {
      /* Still holds what this thread wrote: no other thread was handed the same memory. */
      const unsigned char* b = (const unsigned char*)(uintptr_t)live[slot];
      CHECK(b[0] == (unsigned char)t && b[sizes[slot] - 1] == (unsigned char)t);
      CHECK_CU(cuMemFree(live[slot]));
    }
    sizes[slot] = 256 + (size_t)((t * 7919u + i * 104729u) % (3u << 20));
    CHECK_CU(cuMemAlloc(&live[slot], sizes[slot]));
    unsigned char* b = (unsigned char*)(uintptr_t)live[slot];
    b[0] = (unsigned char)t;
    b[sizes[slot] - 1] = (unsigned char)t;
  }
  for (unsigned slot = 0; slot < kLive; ++slot) CHECK_CU(cuMemFree(live[slot]));
  return NULL;
}

int main(void) {
  init_context();
  CHECK_CU(cuCtxGetCurrent(&g_ctx));
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  CHECK(cuda != NULL);
  pthread_t threads[kThreads];
  for (unsigned t = 0; t < kThreads; ++t)
    CHECK(pthread_create(&threads[t], NULL, worker, (void*)(uintptr_t)t) == 0);
  for (unsigned t = 0; t < kThreads; ++t) CHECK(pthread_join(threads[t], NULL) == 0);
  report("alloc", (unsigned long long)kThreads * kIterations);
  report("fake_cuMemAlloc_v2", fake_calls(cuda, "cuMemAlloc_v2"));
  report("fake_cuMemFree_v2", fake_calls(cuda, "cuMemFree_v2"));
  return 0;
}
