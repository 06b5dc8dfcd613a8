// The core's side of the device budget that is not the allocation path: the program's own
// cuMemCreate (admitted, or made on the host past the budget), cuMemGetInfo and NVML's view of the
// budget, and the lines said once when the budget cannot do what the policy asks.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include "base/log.h"
#include "core/core.h"

namespace allocshim {

void Core::log_spill_unsupported(int device) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true, std::memory_order_relaxed))
    log::write(log::Level::warn,
               "budget: device %d cannot back the spill target (no virtual memory management): "
               "requests past the budget are served natively, nothing is spilled or migrated",
               device);
}

void Core::log_larger_than_budget(int device, std::size_t bytes) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true, std::memory_order_relaxed))
    log::write(
        log::Level::warn,
        "budget device %d: a request of %zu bytes is larger than the whole budget and spill = "
        "\"none\": refused with out-of-memory, as a device of that size would (said once)",
        device, bytes);
}

Result Core::create(const MemHandle* handle, std::size_t bytes, const Location& location,
                    bool device_flags, MakeCreate make, void* ctx) {
  // Past the budget with spill = "host": the same request on the host NUMA node (docs/
  // oversubscription.md, "The program's own cuMemCreate"). If the driver refuses it there (an
  // allocation flag host memory cannot have), the program's own request goes on as below.
  if (Location host; create_on_host(bytes, location, &host)) {
    Result r = make(ctx, &host, false);
    // Flags asked of device memory (PyTorch's expandable segments ask for GPUDirect RDMA where
    // the device supports it) that the driver may refuse at a host location: pinned host memory
    // is reachable by RDMA anyway and never compressed.
    if (r != res::ok && device_flags) r = make(ctx, &host, true);
    if (r == res::ok && handle) {
      on_created(*handle, bytes, host);
      on_create_spilled(location.id, bytes);
      return res::ok;
    }
    on_create_not_spilled(location.id, r);
  }
  if (const Result admit = admit_create(bytes, location); admit != res::ok) return admit;
  const Result r = make(ctx, nullptr, false);
  if (r == res::ok && handle) on_created(*handle, bytes, location);
  return r;
}

Result Core::admit_create(std::size_t bytes, const Location& location) {
  // The program's own device memory counts against the budget. Past it, spill = "host" made it on
  // the host already (create_on_host); otherwise it fails only where spill = "none".
  if (__builtin_expect(!budget_.active(), 1) || location.type != Location::Type::device)
    return res::ok;
  if (budget_.admit_create(location.id, bytes) || budget_.spill() != Budget::Spill::none)
    return res::ok;
  budget_.on_refused(location.id);
  created_stats_.device(location.id).on_failure();
  return res::out_of_memory;
}

bool Core::create_on_host(std::size_t bytes, const Location& location, Location* host) {
  if (__builtin_expect(!budget_.active(), 1) || location.type != Location::Type::device ||
      budget_.spill() != Budget::Spill::host || budget_.admit_create(location.id, bytes))
    return false;
  int numa = -1, numa_vmm = 0;
  if (driver_.device_get_attribute(&numa, DevAttr::host_numa_id, location.id) != res::ok) numa = -1;
  if (driver_.device_get_attribute(&numa_vmm, DevAttr::host_numa_vmm, location.id) != res::ok)
    numa_vmm = 0;
  *host = numa >= 0 && numa_vmm != 0 ? Location{Location::Type::host_numa, numa}
                                     : Location{Location::Type::host, 0};
  return true;
}

void Core::on_create_not_spilled(int device, int error) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true, std::memory_order_relaxed))
    log::write(
        log::Level::warn,
        "budget device %d: the program's cuMemCreate could not be made on the host (driver error %d); "
        "it is served on the device, past the budget",
        device, error);
}

void Core::on_created(MemHandle handle, std::size_t bytes, const Location& location) {
  const int device = location.type == Location::Type::device ? location.id : -1;
  created_stats_.device(device < 0 ? 0 : device).on_alloc(bytes, 0, Api::create);
  std::lock_guard lock(created_mutex_);
  created_[handle] = Created{bytes, device};
}

void Core::on_released(MemHandle handle) {
  std::lock_guard lock(created_mutex_);
  auto it = created_.find(handle);
  if (it == created_.end()) return;
  created_stats_.device(it->second.device < 0 ? 0 : it->second.device).on_free(it->second.bytes, 0);
  created_.erase(it);
}

Result Core::mem_get_info(std::size_t* free, std::size_t* total) {
  const Result r = driver_.mem_get_info(free, total);
  if (r != res::ok || !free) return r;
  // Memory the shim's pools hold but the program has freed is free to the program: report it so,
  // or frameworks that size themselves from cuMemGetInfo would see the shim's cache as used.
  const int device = current_device();
  std::size_t cached = 0;
  for (std::size_t i = 0; i < backend_count(); ++i) {
    const auto& b = backends_[i];
    const std::size_t reserved = b->reserved(device);
    const std::size_t live = b->stats().device(device).live_bytes();
    if (reserved > live) cached += reserved - live;
  }
  *free += cached;
  if (total && *free > *total) *free = *total;
  // Under a budget: total = the budget, free = what is left of it.
  if (__builtin_expect(budget_.active(), 0)) budget_.report(device, free, total);
  return r;
}

bool Core::budget_view(const unsigned char uuid[16], std::uint64_t* free, std::uint64_t* total) {
  if (!budget_.active()) return false;
  // A process that asks NVML may not have used CUDA yet (nvidia-smi): the driver is initialised
  // as any CUDA call would, without a context.
  int count = 0;
  if (driver_.init(0) != res::ok || driver_.device_get_count(&count) != res::ok) return false;
  for (int d = 0; d < count && d < static_cast<int>(kMaxDevices); ++d) {
    unsigned char mine[16];
    if (driver_.device_get_uuid(mine, d) != res::ok || std::memcmp(mine, uuid, sizeof mine) != 0)
      continue;
    std::size_t f = static_cast<std::size_t>(*free), t = static_cast<std::size_t>(*total);
    for (std::size_t i = 0; i < backend_count(); ++i) {
      const std::size_t reserved = backends_[i]->reserved(d),
                        live = backends_[i]->stats().device(d).live_bytes();
      if (reserved > live) f += reserved - live;  // the shim's cache is free to the program
    }
    f = std::min(f, t);
    budget_.report(d, &f, &t);
    *free = f;
    *total = t;
    return true;
  }
  return false;
}

const AllocRequest& Core::claim_spill(Backend& spill, const AllocRequest& req,
                                      AllocRequest& claimed, std::size_t& placed) {
  std::size_t range = 0, unit = 0;
  if (!spill.device_extent(req, &range, &unit)) return req;
  claimed = req;
  claimed.device_part = budget_.claim_new(req.device, range, unit);
  claimed.device_placed = &placed;
  return claimed;
}

}  // namespace allocshim
