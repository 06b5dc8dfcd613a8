// Managed bytes held per device by every managed backend of the process (the spill target and the
// ones a policy names share the device's free memory, so the limit must be shared too). Internal
// to shim/backends (managed.cpp); tests read it here.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>

#include "policy/types.h"

namespace allocshim::managed_detail {

extern std::array<std::atomic<std::size_t>, kMaxDevices> g_held;

inline std::atomic<std::size_t>& held(int device) {
  return g_held[device >= 0 && static_cast<std::size_t>(device) < kMaxDevices
                    ? static_cast<std::size_t>(device)
                    : 0];
}

}  // namespace allocshim::managed_detail
