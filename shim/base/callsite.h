// Call-site rules: a policy's `callsite` globs are matched against the names (demangled function and
// module) of the allocating call stack.
//
// Unwinding is cheap next to symbolizing, so each allocation unwinds a few frames and reduces them
// to a key (a hash of the return addresses outside the shim); the bits saying which callsite rules
// match are computed once per key and cached. The steady state is a short unwind and a hash lookup.
// Nothing here runs unless some rule of the active policy has a callsite.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "policy/policy.h"
#include "os/unwinder.h"

namespace allocshim {

class CallsiteCache {
 public:
  // Bit i: rule i of `p` has a callsite glob that matches the calling thread's stack.
  std::uint64_t bits(const policy::Policy& p);
  std::uint64_t lookups() const { return lookups_; }
  std::uint64_t misses() const { return misses_; }

  // The frame names a stack is matched on: "function\nmodule" per frame outside the shim,
  // innermost first (dladdr: functions missing from the dynamic symbol table appear by module).
  static std::string names(void* const* frames, int count);

 private:
  static constexpr int kFrames = 24;
  std::once_flag init_;
  os::NativeUnwinder unwinder_;
  std::mutex mutex_;
  const policy::Policy* policy_ = nullptr;  // the policy the cached bits belong to
  std::unordered_map<std::uint64_t, std::uint64_t> cache_;
  std::uint64_t lookups_ = 0, misses_ = 0;
};

}  // namespace allocshim
