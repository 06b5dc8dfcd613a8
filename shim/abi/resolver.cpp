// cuGetProcAddress / cuGetProcAddress_v2: the route of the static CUDA runtime (which fetches ~440
// entry points through it) and of cudaGetDriverEntryPoint*. The real resolver answers first; on
// success its answer is replaced only if it is the real address of a hooked variant, so the variant
// (_v2, _ptsz, ...) is the one the driver chose for this name, version and flags, never a guess by
// name. symbolStatus and errors pass through untouched.
#include "abi/hooks.h"

#define ALLOCSHIM_EXPORT extern "C" __attribute__((visibility("default")))

using allocshim::abi::load_real;
using allocshim::abi::substitute;
namespace real = allocshim::abi::real;

ALLOCSHIM_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                                      cuuint64_t flags,
                                                      CUdriverProcAddressQueryResult* status) {
  if (!load_real() || !real::cuGetProcAddress_v2) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real::cuGetProcAddress_v2(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && pfn) *pfn = substitute(*pfn);
  return r;
}

ALLOCSHIM_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int version,
                                                   cuuint64_t flags) {
  if (!load_real() || !real::cuGetProcAddress) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real::cuGetProcAddress(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS && pfn) *pfn = substitute(*pfn);
  return r;
}
