// Native unwinding (see unwinder.h).
#include "os/unwinder.h"

#include <dlfcn.h>
#include <execinfo.h>

#include <climits>
#include <cstdlib>

namespace allocshim::os {
namespace {

// Directory of the object this code is linked into (liballocshim.so, or a test executable).
std::string own_directory() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&own_directory), &info) || !info.dli_fname) return {};
  // For a program this is argv[0], maybe relative: resolved now, before the program can chdir.
  char resolved[PATH_MAX];
  std::string path = realpath(info.dli_fname, resolved) ? resolved : info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

// libunwind's caching policies (UNW_CACHE_PER_THREAD in libunwind-common.h); the header is not
// included so the shim builds without it.
constexpr int kUnwCachePerThread = 2;

// In the private folder beside the shim (lib/allocshim/, in the build tree and installed), then
// ../lib/allocshim for programs that link the capture code from bin/ (trace_bench, tests), then the
// loader's search. A machine without libunwind installed (the GPU machine) has only the shipped copy.
void* open_private(const std::string& dir, const char* soname) {
  void* h = nullptr;
  if (!dir.empty()) h = dlopen((dir + "/allocshim/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h && !dir.empty())
    h = dlopen((dir + "/../lib/allocshim/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  return h;
}

}  // namespace

std::string NativeUnwinder::init() {
  // In a program under ThreadSanitizer (this code itself may not be instrumented: look for the
  // runtime), libunwind frees each thread's trace cache from a thread-exit destructor that locks a
  // mutex after TSan has torn the thread down, and the program crashes (google/sanitizers#943).
  if (dlsym(RTLD_DEFAULT, "__tsan_init") != nullptr) {
    void* warm[2];
    ::backtrace(warm, 2);
    return "glibc backtrace (a ThreadSanitizer build does not load libunwind)";
  }
  const std::string dir = own_directory();
  // libunwind needs liblzma (for compressed .gnu_debugdata); the copy shipped beside the shim is
  // loaded first so the dependency resolves by soname on machines without it.
  open_private(dir, "liblzma.so.5");
  void* h = open_private(dir, "libunwind.so.8");
  if (h) {
    unw_backtrace_ = reinterpret_cast<int (*)(void**, int)>(dlsym(h, "unw_backtrace"));
    auto set_policy =
        reinterpret_cast<int (*)(void*, int)>(dlsym(h, "_ULx86_64_set_caching_policy"));
    auto* space = static_cast<void**>(dlsym(h, "_ULx86_64_local_addr_space"));
    if (unw_backtrace_ && set_policy && space) set_policy(*space, kUnwCachePerThread);
  }
  if (unw_backtrace_) {
    Dl_info where{};
    const bool named = dladdr(reinterpret_cast<void*>(unw_backtrace_), &where) && where.dli_fname;
    return std::string("libunwind (") + (named ? where.dli_fname : "libunwind.so.8") + ")";
  }
  // Make glibc load libgcc_s now rather than inside the first traced allocation.
  void* warm[2];
  ::backtrace(warm, 2);
  return "glibc backtrace (libunwind.so.8 not found; about 20x slower per stack)";
}

int NativeUnwinder::backtrace(void** out, int max) const {
  if (unw_backtrace_) return unw_backtrace_(out, max);
  return ::backtrace(out, max);
}

}  // namespace allocshim::os
