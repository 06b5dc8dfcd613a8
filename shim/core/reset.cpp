// Context destruction mid-run (cuDevicePrimaryCtxReset, cuCtxDestroy, the last primary release).
//
// The driver destroys the context's streams, events and memory pools and frees its memory; handles
// kept across that dangle, and using them can crash inside the driver. Where the shim sees the
// destruction coming (cuDevicePrimaryCtxReset, cuCtxDestroy) every backend gives back what it holds
// in the context before the real call, while the handles are valid. A primary context also dies
// with its last reference (cuDevicePrimaryCtxRelease): after a release the shim asks whether the
// context is still active, and if not, backends forget its streams, events and pools without
// touching them. (CUDA 13's cudaDeviceReset calls the first variant of cuDevicePrimaryCtxReset,
// as tests/gpu/route_probe/ shows.) A reset made by a route
// the shim does not hook is found at the next cuDevicePrimaryCtxRetain, which the runtime makes
// before it uses the device again: the context's id (cuCtxGetId) changed though its handle did
// not, and backends forget the old one as after a release. Either
// way the program's blocks there leave the registry (counted as freed: the program can no longer
// use them, and the driver frees them), the context's streams and IPC exports are forgotten, VMM
// memory the shim mapped is given back (it is not the context's), and backends rebuild at the
// device's next request.
//
// Granularity: a backend keeps one context per device (the one current at its first request there).
// A primary reset drops the backends whose context is the device's primary one; cuCtxDestroy those
// whose context is the destroyed one. Blocks of backends that hand out the driver's own allocations
// (native, managed) are dropped with any context of their device: the registry does not know which
// context made them, and a program rarely keeps two contexts on one device.
#include <vector>

#include "core/core.h"
#include "base/log.h"

namespace allocshim {

Context Core::primary_context(int device) {
  // Retaining it is free when it is active (the runtime holds it); when it is not, nothing of the
  // shim's can live in it and the retain only creates it briefly.
  Context primary = nullptr;
  if (driver_.primary_ctx_retain(&primary, device) != res::ok) return nullptr;
  driver_.primary_ctx_release(device);
  return primary;
}

void Core::on_primary_reset(int device) {
  if (Context primary = primary_context(device)) drop_context(device, primary, true);
}

void Core::after_primary_release(int device, Context ctx) {
  int active = 1;
  if (ctx == nullptr || driver_.primary_ctx_active == nullptr ||
      driver_.primary_ctx_active(device, &active) != res::ok || active != 0)
    return;
  // The last reference went: the context and everything in it are destroyed already.
  drop_context(device, ctx, false);
}

void Core::after_primary_retain(int device, Context ctx) {
  if (device < 0 || static_cast<std::size_t>(device) >= kMaxDevices || ctx == nullptr ||
      driver_.ctx_get_id == nullptr)
    return;
  std::uint64_t id = 0;
  if (driver_.ctx_get_id(ctx, &id) != res::ok || id == 0) return;
  Context gone = nullptr;
  {
    std::lock_guard lock(primary_mutex_);
    PrimarySeen& seen = primary_seen_[device];
    if (seen.id == 0 || seen.id == id) {
      seen = PrimarySeen{ctx, id};
      return;
    }
    gone = seen.ctx;
  }
  log::write(log::Level::info,
             "the primary context of device %d was reset by a route the shim does not hook",
             device);
  drop_context(device, gone, false);
  std::lock_guard lock(primary_mutex_);
  primary_seen_[device] = PrimarySeen{ctx, id};
}

void Core::on_context_destroy(Context ctx) {
  if (ctx == nullptr) return;
  // The context's device: make it current for a moment (it is still valid), then restore.
  Context saved = nullptr;
  int device = -1;
  if (driver_.ctx_get_current(&saved) != res::ok) return;
  if (driver_.ctx_set_current(ctx) == res::ok) {
    if (driver_.ctx_get_device(&device) != res::ok) device = -1;
    driver_.ctx_set_current(saved);
  }
  if (device >= 0) drop_context(device, ctx, true);
}

void Core::drop_context(int device, Context ctx, bool alive) {
  if (device < 0 || static_cast<std::size_t>(device) >= kMaxDevices) return;
  {
    // Seen: the next retain records the context made again, and drops nothing.
    std::lock_guard lock(primary_mutex_);
    primary_seen_[device] = PrimarySeen{};
  }
  const std::size_t n = backend_count();
  bool dropped[kMaxBackends] = {};
  for (std::size_t i = 0; i < n; ++i) dropped[i] = backends_[i]->drop_context(device, ctx, alive);

  std::vector<std::pair<DevPtr, Block>> gone;
  registry_.for_each([&](DevPtr ptr, const Block& b) {
    if (b.device == device && b.api != Api::host && b.backend < n && dropped[b.backend])
      gone.emplace_back(ptr, b);
  });
  for (const auto& [ptr, b] : gone) {
    Block block;
    if (registry_.erase(ptr, &block)) backends_[block.backend]->forget(block);
  }
  if (IpcHooks* ipc = ipc_.load(std::memory_order_acquire)) ipc->on_context_dropped(device);
  budget_.migration().host_cost().forget(device, ctx, alive);
  streams_.remove_device(device);
  contexts_dropped_.fetch_add(1, std::memory_order_relaxed);
  log::write(log::Level::info, "context of device %d %s: %zu live blocks dropped", device,
             alive ? "being destroyed" : "destroyed", gone.size());
}

}  // namespace allocshim
