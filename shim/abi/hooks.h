// Declarations generated from hooks.def: the real entry points and the handlers behind each
// exported wrapper. Only the abi layer includes this (it needs cuda.h).
#pragma once

#include <cuda.h>

#include <cstddef>

// cuda.h maps these names to their newest variants; the shim hooks every variant under its own exact
// name, so the mapping is undone here and the older variants are declared explicitly.
#undef cuIpcOpenMemHandle
#undef cuGetProcAddress
#undef cuDevicePrimaryCtxReset
#undef cuCtxDestroy

extern "C" {
CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags);
CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags);
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev);
CUresult CUDAAPI cuCtxDestroy(CUcontext ctx);
// Variants cuda.h declares only under per-thread-default-stream builds.
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream stream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream stream);
}

namespace allocshim::abi {

namespace real {
#define ALLOCSHIM_HOOK(symbol, params, args) extern CUresult(CUDAAPI* symbol) params;
#include "abi/hooks.def"
#undef ALLOCSHIM_HOOK
extern CUresult(CUDAAPI* cuGetProcAddress)(const char*, void**, int, cuuint64_t);
extern CUresult(CUDAAPI* cuGetProcAddress_v2)(const char*, void**, int, cuuint64_t,
                                              CUdriverProcAddressQueryResult*);
}  // namespace real

namespace handler {
#define ALLOCSHIM_HOOK(symbol, params, args) CUresult symbol params;
#include "abi/hooks.def"
#undef ALLOCSHIM_HOOK
}  // namespace handler

// Set while this thread is inside the shim: a hooked call made from inside (by the driver, or by
// the shim's own dependencies) goes straight to the driver.
extern thread_local bool t_in_shim __attribute__((tls_model("initial-exec")));

struct Guard {
  Guard() { t_in_shim = true; }
  ~Guard() { t_in_shim = false; }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
};

// Finds libcuda and fills the real pointers and the substitution table, once libcuda is loaded.
// Returns false while it is not (nothing is latched: a later call tries again).
bool load_real();
// The real dlsym (glibc's), found with dlvsym so the shim's own override is skipped.
void* real_dlsym(void* handle, const char* name);
// If `fn` is the real address of a hooked entry point (or of the resolver), the shim's wrapper for
// that exact variant; otherwise `fn` unchanged.
void* substitute(void* fn);
// True if `name` is exactly the name of a hooked entry point or of the resolver.
bool is_hooked_name(const char* name);
// For dlsym of NVML's memory queries (nvml.cpp): keeps `fn`, found in `handle`, and returns the
// shim's wrapper; `fn` for any other name.
void* nvml_substitute(void* handle, const char* name, void* fn);

}  // namespace allocshim::abi
