/* Route (d): another interposer, preloaded before or after the shim. Each wrapper counts its calls
 * and reaches the next definition with dlsym(RTLD_NEXT, name), the way profilers and tracers do.
 *
 * glibc resolves RTLD_NEXT relative to the object that called dlsym. The shim overrides dlsym, so
 * these calls go through it: if it resolved RTLD_NEXT relative to itself rather than to this
 * library, then with the shim loaded first the "next" cuCtxGetDevice would be this very wrapper
 * (caught below as recursion), and with the shim loaded second the shim would be skipped (caught
 * by the harness: the shim's stats would miss the allocations). */
#include <dlfcn.h>

#include <cuda.h>

#define EXPORT __attribute__((visibility("default")))

/* Calls of cuMemAlloc_v2, cuMemFree_v2, cuCtxGetDevice; then times a wrapper found itself.
 * cuCtxGetDevice is one the shim does not hook (it hooks cuCtxSynchronize, a migration safe point),
 * so with the shim first the program's call still reaches this wrapper. */
EXPORT unsigned long long preload_wrap_counts[4];

static __thread int t_depth;

#define WRAP(index, name, params, args)                                   \
  EXPORT CUresult name params {                                           \
    typedef CUresult(*fn_t) params;                                       \
    if (t_depth > 0) {                                                    \
      __atomic_fetch_add(&preload_wrap_counts[3], 1, __ATOMIC_RELAXED);   \
      return CUDA_ERROR_UNKNOWN;                                          \
    }                                                                     \
    __atomic_fetch_add(&preload_wrap_counts[index], 1, __ATOMIC_RELAXED); \
    fn_t next = (fn_t)dlsym(RTLD_NEXT, #name);                            \
    if (next == NULL) return CUDA_ERROR_NOT_FOUND;                        \
    ++t_depth;                                                            \
    CUresult r = next args;                                               \
    --t_depth;                                                            \
    return r;                                                             \
  }

WRAP(0, cuMemAlloc_v2, (CUdeviceptr * p, size_t n), (p, n))
WRAP(1, cuMemFree_v2, (CUdeviceptr p), (p))
WRAP(2, cuCtxGetDevice, (CUdevice * d), (d))
