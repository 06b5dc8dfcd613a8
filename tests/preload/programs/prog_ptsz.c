/* Route (c): per-thread default stream. Resolved with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
 * cuMemAllocAsync/cuMemFreeAsync must be the _ptsz variants, so that a null stream means the
 * calling thread's stream; resolved without it, a null stream means the legacy stream. */
#include <stdint.h>

#include "prog_util.h"

typedef CUresult (*get_proc_fn)(const char*, void**, int, cuuint64_t,
                                CUdriverProcAddressQueryResult*);
typedef CUresult (*alloc_async_fn)(CUdeviceptr*, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*stream_create_fn)(CUstream*, unsigned);
typedef CUresult (*stream_destroy_fn)(CUstream);

enum { kPerThread = 50, kLegacy = 30, kExplicit = 5 };

static void* resolve(get_proc_fn get_proc, const char* name, cuuint64_t flags) {
  void* fn = NULL;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  CHECK_CU(get_proc(name, &fn, 12000, flags, &status));
  CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS && fn != NULL);
  return fn;
}

/* Whether the fake saw a null stream as the per-thread stream: either the _ptsz entry point got
 * it, or the plain one got CU_STREAM_PER_THREAD. */
static int reached_as_per_thread(void* cuda, unsigned long long ptsz_before,
                                 unsigned long long plain_before) {
  const unsigned long long ptsz = fake_calls(cuda, "cuMemAllocAsync_ptsz") - ptsz_before;
  const unsigned long long plain = fake_calls(cuda, "cuMemAllocAsync") - plain_before;
  if (ptsz == kPerThread && plain == 0)
    return fake_last_stream(cuda, "cuMemAllocAsync_ptsz") == NULL;
  return plain == kPerThread && ptsz == 0 &&
         fake_last_stream(cuda, "cuMemAllocAsync") == (void*)CU_STREAM_PER_THREAD;
}

int main(void) {
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW);
  CHECK(cuda != NULL);
  get_proc_fn get_proc = (get_proc_fn)dlsym(cuda, "cuGetProcAddress_v2");
  CHECK(get_proc != NULL);
  CHECK_CU(((init_fn)resolve(get_proc, "cuInit", 0))(0));

  const cuuint64_t ptds = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  alloc_async_fn alloc_pt = (alloc_async_fn)resolve(get_proc, "cuMemAllocAsync", ptds);
  free_async_fn free_pt = (free_async_fn)resolve(get_proc, "cuMemFreeAsync", ptds);
  alloc_async_fn alloc_legacy = (alloc_async_fn)resolve(get_proc, "cuMemAllocAsync", 0);
  free_async_fn free_legacy = (free_async_fn)resolve(get_proc, "cuMemFreeAsync", 0);
  /* The variants are distinct functions, and dlsym by exact name agrees with the resolver. */
  CHECK((void*)alloc_pt != (void*)alloc_legacy);
  CHECK((void*)free_pt != (void*)free_legacy);
  CHECK(dlsym(cuda, "cuMemAllocAsync_ptsz") == (void*)alloc_pt);
  CHECK(dlsym(cuda, "cuMemAllocAsync") == (void*)alloc_legacy);
  CHECK(dlsym(cuda, "cuMemFreeAsync_ptsz") == (void*)free_pt);

  const unsigned long long ptsz0 = fake_calls(cuda, "cuMemAllocAsync_ptsz");
  const unsigned long long plain0 = fake_calls(cuda, "cuMemAllocAsync");
  for (int i = 0; i < kPerThread; ++i) {
    CUdeviceptr p = 0;
    CHECK_CU(alloc_pt(&p, 4096 + (size_t)i, NULL));
    touch(p, 4096 + (size_t)i, (unsigned)i);
    CHECK_CU(free_pt(p, NULL));
  }
  CHECK(reached_as_per_thread(cuda, ptsz0, plain0));
  const void* free_stream = fake_last_stream(cuda, "cuMemFreeAsync");
  CHECK(fake_calls(cuda, "cuMemFreeAsync_ptsz") > 0 || free_stream == (void*)CU_STREAM_PER_THREAD);

  for (int i = 0; i < kLegacy; ++i) {
    CUdeviceptr p = 0;
    CHECK_CU(alloc_legacy(&p, 8192, NULL));
    CHECK_CU(free_legacy(p, NULL));
  }
  /* A null stream through the plain variant is the legacy stream (null or CU_STREAM_LEGACY). */
  const void* legacy = fake_last_stream(cuda, "cuMemAllocAsync");
  CHECK(legacy == NULL || legacy == (void*)CU_STREAM_LEGACY);
  CHECK(fake_calls(cuda, "cuMemAllocAsync") - plain0 >= kLegacy);

  /* A stream the program created passes through unchanged, whichever variant. */
  CUstream s = NULL;
  CHECK_CU(((stream_create_fn)resolve(get_proc, "cuStreamCreate", 0))(&s, CU_STREAM_NON_BLOCKING));
  for (int i = 0; i < kExplicit; ++i) {
    CUdeviceptr p = 0;
    CHECK_CU(alloc_pt(&p, 256, s));
    CHECK(fake_last_stream(cuda, "cuMemAllocAsync_ptsz") == (void*)s ||
          fake_last_stream(cuda, "cuMemAllocAsync") == (void*)s);
    CHECK_CU(free_pt(p, s));
  }
  CHECK_CU(((stream_destroy_fn)resolve(get_proc, "cuStreamDestroy", 0))(s));

  report("async", kPerThread + kLegacy + kExplicit);
  return 0;
}
