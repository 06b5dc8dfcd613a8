// unwind_probe: what the primitives of a traced event cost on this host, one at a time, so a slow
// trace_bench result can be attributed (docs/tracing.md, "Cost"): clock_gettime (vDSO or a real
// system call, depending on the host's clock source), a plain system call, glibc's backtrace() and
// libunwind's unw_backtrace (per-thread cache) at the depth trace_bench uses.
//
//   unwind_probe [depth=20]
#include <dlfcn.h>
#include <execinfo.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace {

std::uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

int (*g_unw_backtrace)(void**, int) = nullptr;

std::uint32_t median(std::vector<std::uint32_t> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Times `op` over batches of 1000 calls; the median batch over 200, per call.
template <class Op>
double per_call_ns(Op op) {
  std::vector<std::uint32_t> batches;
  for (int b = 0; b < 200; ++b) {
    const std::uint64_t t0 = now_ns();
    for (int i = 0; i < 1000; ++i) op();
    batches.push_back(static_cast<std::uint32_t>(now_ns() - t0));
  }
  return median(batches) / 1000.0;
}

__attribute__((noinline)) void at_depth(int depth) {
  if (depth > 0) {
    at_depth(depth - 1);
    asm volatile("" ::: "memory");
    return;
  }
  void* frames[128];
  int glibc_n = ::backtrace(frames, 128);
  int unw_n = g_unw_backtrace ? g_unw_backtrace(frames, 128) : 0;
  std::vector<std::uint32_t> glibc_ns, unw_ns;
  for (int i = 0; i < 2000; ++i) {
    std::uint64_t t0 = now_ns();
    ::backtrace(frames, 128);
    std::uint64_t t1 = now_ns();
    if (g_unw_backtrace) g_unw_backtrace(frames, 128);
    std::uint64_t t2 = now_ns();
    glibc_ns.push_back(static_cast<std::uint32_t>(t1 - t0));
    unw_ns.push_back(static_cast<std::uint32_t>(t2 - t1));
  }
  std::printf("glibc backtrace()        %u ns median (%d frames)\n", median(glibc_ns), glibc_n);
  if (g_unw_backtrace)
    std::printf("libunwind unw_backtrace  %u ns median (%d frames)\n", median(unw_ns), unw_n);
  else
    std::printf("libunwind unw_backtrace  not loaded (%s)\n", dlerror());
}

}  // namespace

int main(int argc, char** argv) {
  const int depth = argc > 1 ? std::atoi(argv[1]) : 20;
  std::ifstream cs("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string source;
  std::getline(cs, source);
  std::printf("clock source             %s\n", source.empty() ? "(unknown)" : source.c_str());
  std::printf("clock_gettime(MONOTONIC) %.1f ns\n", per_call_ns([] { (void)now_ns(); }));
  std::printf("syscall(SYS_getppid)     %.1f ns\n",
              per_call_ns([] { (void)syscall(SYS_getppid); }));
  // As the capture loads it (stacks.cpp): privately, RUNPATH $ORIGIN/../lib/allocshim finds the shipped copy.
  dlopen("liblzma.so.5", RTLD_NOW | RTLD_LOCAL);
  if (void* h = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL)) {
    g_unw_backtrace = reinterpret_cast<int (*)(void**, int)>(dlsym(h, "unw_backtrace"));
    auto set_policy =
        reinterpret_cast<int (*)(void*, int)>(dlsym(h, "_ULx86_64_set_caching_policy"));
    auto* space = static_cast<void**>(dlsym(h, "_ULx86_64_local_addr_space"));
    if (set_policy && space) set_policy(*space, 2);  // UNW_CACHE_PER_THREAD
    Dl_info where{};
    if (g_unw_backtrace && dladdr(reinterpret_cast<void*>(g_unw_backtrace), &where))
      std::printf("libunwind                %s\n", where.dli_fname);
  }
  at_depth(depth);
  return 0;
}
