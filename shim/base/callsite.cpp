#include "base/callsite.h"

#include <cxxabi.h>
#include <dlfcn.h>

#include <climits>
#include <cstdlib>
#include <cstring>

#include "policy/glob.h"

namespace allocshim {
namespace {

// Where the shim itself is loaded: its own frames (wrapper, handler, core) are not the program's.
// Null when the core is linked into the program itself (unit tests): then no frame is the shim's.
const void* shim_base() {
  static const void* base = []() -> const void* {
    Dl_info info{};
    if (!dladdr(reinterpret_cast<const void*>(&shim_base), &info) || !info.dli_fname)
      return nullptr;
    char self[4096], exe[4096];
    if (realpath(info.dli_fname, self) && realpath("/proc/self/exe", exe) &&
        std::strcmp(self, exe) == 0)
      return nullptr;
    return info.dli_fbase;
  }();
  return base;
}

bool in_shim(void* frame) {
  Dl_info info{};
  return shim_base() && dladdr(frame, &info) && info.dli_fbase == shim_base();
}

}  // namespace

std::string CallsiteCache::names(void* const* frames, int count) {
  std::string out;
  for (int i = 0; i < count; ++i) {
    Dl_info info{};
    // A return address points past the call; step back into it so the right symbol is found.
    if (!dladdr(static_cast<char*>(frames[i]) - 1, &info)) continue;
    if (shim_base() && info.dli_fbase == shim_base()) continue;
    std::string function;
    if (info.dli_sname) {
      int status = 0;
      char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
      function = status == 0 && demangled ? demangled : info.dli_sname;
      std::free(demangled);
    }
    out += function + "\n" + (info.dli_fname ? info.dli_fname : "") + "\n";
  }
  if (!out.empty()) out.pop_back();
  return out;
}

std::uint64_t CallsiteCache::bits(const policy::Policy& p) {
  std::call_once(init_, [this] { unwinder_.init(); });
  void* frames[kFrames];
  const int n = unwinder_.backtrace(frames, kFrames);
  std::uint64_t key = 0xcbf29ce484222325ull;
  for (int i = 0; i < n; ++i)
    key = (key ^ reinterpret_cast<std::uintptr_t>(frames[i])) * 0x100000001b3ull;

  std::lock_guard lock(mutex_);
  ++lookups_;
  if (policy_ != &p) {  // a reload installed another policy: its rules are different
    cache_.clear();
    policy_ = &p;
  }
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  ++misses_;
  int first = 0;
  while (first < n && in_shim(frames[first])) ++first;
  const std::string stack = names(frames + first, n - first);
  std::uint64_t result = 0;
  for (std::size_t i = 0; i < p.rules.size() && i < 64; ++i)
    if (!p.rules[i].callsite.empty() && policy::callsite_match(p.rules[i].callsite, stack))
      result |= 1ull << i;
  cache_.emplace(key, result);
  return result;
}

}  // namespace allocshim
