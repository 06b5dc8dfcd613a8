// The dlsym override's C half and the real dlsym.
#include <dlfcn.h>

#include <atomic>
#include <cstring>

#include "abi/hooks.h"

extern "C" {
// Read by dlsym.S. Hidden: only the stub uses it.
__attribute__((visibility("hidden"))) void* allocshim_real_dlsym_ptr = nullptr;

__attribute__((visibility("hidden"))) void* allocshim_load_real_dlsym() {
  // dlvsym with RTLD_NEXT skips the shim's own dlsym. GLIBC_2.34 is where dlsym moved into libc;
  // older glibc has it in libdl at GLIBC_2.2.5.
  void* fn = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (!fn) fn = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  __atomic_store_n(&allocshim_real_dlsym_ptr, fn, __ATOMIC_RELEASE);
  return fn;
}

// dlsym on a real handle (or RTLD_DEFAULT): look up as usual, then hand back the shim's wrapper if
// the answer is the real address of a hooked libcuda entry point, or NVML's memory query. Names are compared exactly, so
// cudnn* or cublas* lookups are never touched, and other libraries' lookups cost one branch.
__attribute__((visibility("hidden"))) void* allocshim_dlsym_handle(void* handle, const char* name) {
  void* fn = allocshim::abi::real_dlsym(handle, name);
  if (!fn || !name) return fn;
  if (name[0] == 'n' && std::strncmp(name, "nvmlDeviceGetMemoryInfo", 23) == 0)
    return allocshim::abi::nvml_substitute(handle, name, fn);
  if (!allocshim::abi::is_hooked_name(name)) return fn;
  return allocshim::abi::substitute(fn);
}
}

namespace allocshim::abi {

void* real_dlsym(void* handle, const char* name) {
  using Fn = void* (*)(void*, const char*);
  void* fn = __atomic_load_n(&allocshim_real_dlsym_ptr, __ATOMIC_ACQUIRE);
  if (!fn) fn = allocshim_load_real_dlsym();
  return fn ? reinterpret_cast<Fn>(fn)(handle, name) : nullptr;
}

}  // namespace allocshim::abi
