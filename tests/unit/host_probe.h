// What the tests read and replace inside the `host` backend (shim/backends/host_impl.h), through
// the friend it names: the library itself has no function for them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "backends/host_impl.h"

namespace allocshim {

struct HostInfo {
  std::size_t allocations = 0;
  std::size_t device_bytes = 0;  // device chunks mapped
  std::size_t host_bytes = 0;    // host chunks mapped
  std::size_t mappings = 0;      // cuMemMap'ed pieces
  std::size_t promoted_bytes = 0;
  std::size_t demoted_bytes = 0;
  Location host_location;
};

namespace host_detail {

struct HostBackendProbe {
  static HostInfo info(const HostBackend& b, int device) {
    HostInfo v;
    const HostBackend::DeviceState* s = b.devices_.at(device);
    if (s == nullptr) return v;
    std::lock_guard lock(b.mutex_);
    for (const auto& [base, a] : b.allocs_) {
      if (a.device != device) continue;
      ++v.allocations;
      v.mappings += a.pieces.size();
    }
    v.device_bytes = s->device_bytes.load(std::memory_order_relaxed);
    v.host_bytes = s->host_bytes.load(std::memory_order_relaxed);
    v.promoted_bytes = s->promoted;
    v.demoted_bytes = s->demoted;
    v.host_location = s->host;
    return v;
  }

  static int placement(const HostBackend& b, DevPtr ptr) {
    std::lock_guard lock(b.mutex_);
    auto it = b.allocs_.upper_bound(ptr);
    if (it == b.allocs_.begin()) return -1;
    --it;
    const std::size_t off = ptr - it->first;
    for (const HostBackend::Piece& p : it->second.pieces)
      if (off >= p.offset && off - p.offset < p.bytes) return p.on_device ? 1 : 0;
    return -1;
  }

  static void set_memory_probe(HostBackend& b, HostMemoryProbe probe) {
    b.memory_probe_.store(probe, std::memory_order_relaxed);
  }

  static bool pinner_running(const HostBackend& b) {
    return b.pinner_ != nullptr && b.pinner_->running();
  }
};

}  // namespace host_detail

// The counts of `backend` (a host backend) on `device`; zeros for another kind.
inline HostInfo host_info(const Backend& backend, int device) {
  if (backend.kind() != BackendKind::host) return {};
  return host_detail::HostBackendProbe::info(static_cast<const host_detail::HostBackend&>(backend),
                                             device);
}

// Where the piece holding `ptr` lives now: 1 device memory, 0 host memory, -1 not this backend's.
inline int host_placement(const Backend& backend, DevPtr ptr) {
  if (backend.kind() != BackendKind::host) return -1;
  return host_detail::HostBackendProbe::placement(
      static_cast<const host_detail::HostBackend&>(backend), ptr);
}

// How the spill target reads the host's memory before pinning ahead (os::host_memory by default).
inline void set_host_memory_probe(Backend& backend, host_detail::HostMemoryProbe probe) {
  if (backend.kind() == BackendKind::host)
    host_detail::HostBackendProbe::set_memory_probe(static_cast<host_detail::HostBackend&>(backend),
                                                    probe);
}

// Whether the spill target's pinner thread runs now.
inline bool host_pinner_running(Backend& backend) {
  if (backend.kind() != BackendKind::host) return false;
  return host_detail::HostBackendProbe::pinner_running(
      static_cast<host_detail::HostBackend&>(backend));
}

// Whether the spill target pins ahead now (its host side, as the last install set it).
inline bool host_pins_ahead(const Backend& backend) {
  if (backend.kind() != BackendKind::host) return false;
  return static_cast<const host_detail::HostBackend&>(backend).pins_ahead_setting();
}

}  // namespace allocshim
