/* cudaDeviceReset's route, as the CUDA 13 runtime takes it (traced on the H100): entry points come
 * from cuGetProcAddress_v2 at the versions the runtime asks, so "cuDevicePrimaryCtxReset" at 7000 is
 * the first variant, not _v2. Four rounds allocate, free half, leave the rest with a stream-ordered
 * block to the reset, and start again on the recreated primary context (retained first, as the
 * runtime does).
 *
 *   prog_reset            resets through cuDevicePrimaryCtxReset
 *   prog_reset private    through no exported entry point (the fake's fakecuda_reset_primary_context),
 *                         as a runtime with a private route would */
#include <stdint.h>

#include "prog_util.h"

typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*retain_fn)(CUcontext*, CUdevice);
typedef CUresult (*reset_fn)(CUdevice);
typedef CUresult (*set_current_fn)(CUcontext);
typedef CUresult (*alloc_fn)(CUdeviceptr*, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*alloc_async_fn)(CUdeviceptr*, size_t, CUstream);

enum { kRounds = 4, kBlocks = 6 };

typedef int (*private_reset_fn)(int);

int main(int argc, char** argv) {
  const int private_route = argc > 1 && strcmp(argv[1], "private") == 0;
  void* cuda = NULL;
  get_proc_v2_fn get_proc = open_resolver(&cuda);
  init_fn init = (init_fn)resolve_at_version(get_proc, "cuInit", 2000);
  retain_fn retain = (retain_fn)resolve_at_version(get_proc, "cuDevicePrimaryCtxRetain", 7000);
  reset_fn reset = (reset_fn)resolve_at_version(get_proc, "cuDevicePrimaryCtxReset", 7000);
  set_current_fn set_current =
      (set_current_fn)resolve_at_version(get_proc, "cuCtxSetCurrent", 4000);
  alloc_fn alloc = (alloc_fn)resolve_at_version(get_proc, "cuMemAlloc", 3020);
  free_fn release = (free_fn)resolve_at_version(get_proc, "cuMemFree", 3020);
  alloc_async_fn alloc_async =
      (alloc_async_fn)resolve_at_version(get_proc, "cuMemAllocAsync", 11020);
  private_reset_fn private_reset = (private_reset_fn)dlsym(cuda, "fakecuda_reset_primary_context");
  CHECK(private_reset != NULL);
  CHECK_CU(init(0));

  unsigned long long allocs = 0;
  for (int round = 0; round < kRounds; ++round) {
    CUcontext ctx = NULL;
    CHECK_CU(retain(&ctx, 0));
    CHECK_CU(set_current(ctx));
    CUdeviceptr p[kBlocks];
    for (int i = 0; i < kBlocks; ++i) {
      const size_t n = 1000 + (size_t)i * 300000;
      CHECK_CU(alloc(&p[i], n));
      touch(p[i], n, (unsigned)(round * kBlocks + i));
      ++allocs;
    }
    CUdeviceptr q = 0;
    CHECK_CU(alloc_async(&q, 4096, NULL));
    ++allocs;
    for (int i = 0; i < kBlocks; i += 2) CHECK_CU(release(p[i]));
    /* the rest, and q, go with the context */
    if (private_route)
      CHECK(private_reset(0) == 0);
    else
      CHECK_CU(reset(0));
  }
  report("alloc", allocs);
  report("fake_cuDevicePrimaryCtxReset", fake_calls(cuda, "cuDevicePrimaryCtxReset"));
  return 0;
}
