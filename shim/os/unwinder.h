// Native call stacks of the calling thread: the trace recorder's stacks and the call-site rules'
// keys (base/callsite.h) both come from here.
#pragma once

#include <string>

namespace allocshim::os {

// unw_backtrace from GNU libunwind, loaded with dlopen(RTLD_LOCAL) from beside the shim (or the
// system). Linking it would put its _Unwind_* and `backtrace` exports into the program's global
// scope, ahead of libgcc's: C++ exceptions of the traced program would then unwind through
// libunwind's implementation. Loaded privately, only we call it. Falls back to glibc's backtrace(),
// which interprets the DWARF unwind tables of every frame on every call, an order of magnitude
// slower than libunwind's cached unwinding (unwind_probe), hence the fallback is announced.
class NativeUnwinder {
 public:
  // Loads libunwind (from allocshim/ beside the object this code is in, then its
  // ../lib/allocshim, then the loader's search)
  // and selects its per-thread cache. Returns what is used: "libunwind (PATH)" or the fallback.
  std::string init();
  // Return addresses of the calling thread, innermost first (out[0] is the caller of backtrace).
  int backtrace(void** out, int max) const;
  bool using_libunwind() const { return unw_backtrace_ != nullptr; }

 private:
  int (*unw_backtrace_)(void**, int) = nullptr;
};

}  // namespace allocshim::os
