// Context destruction mid-run (cudaDeviceReset, cuDevicePrimaryCtxReset, cuCtxDestroy).
//
// The driver destroys the context's streams, events and memory pools and frees its memory; handles
// kept across that dangle, and using them can crash inside the driver. So before the real call the
// core has every backend give back what it holds in the context while the handles are still valid
// (backends rebuild at the device's next request), drops the program's blocks there from the
// registry (counted as freed: the program can no longer use them, and the driver frees them), and
// forgets the context's streams and IPC exports.
//
// Granularity: a backend keeps one context per device (the one current at its first request there).
// A primary reset drops the backends whose context is the device's primary one; cuCtxDestroy those
// whose context is the destroyed one. Blocks of backends that hand out the driver's own allocations
// (native, managed) are dropped with any context of their device: the registry does not know which
// context made them, and a program rarely keeps two contexts on one device.
#include <vector>

#include "core/core.h"
#include "core/log.h"

namespace allocshim {

void Core::on_primary_reset(int device) {
  // The primary context's handle: retaining it is free when it is active (the runtime holds it);
  // when it is not, nothing of the shim's can live in it and the retain only creates it briefly.
  Context primary = nullptr;
  if (driver_.primary_ctx_retain(&primary, device) != res::ok) return;
  driver_.primary_ctx_release(device);
  drop_context(device, primary);
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
  if (device >= 0) drop_context(device, ctx);
}

void Core::drop_context(int device, Context ctx) {
  if (device < 0 || static_cast<std::size_t>(device) >= kMaxDevices) return;
  const std::size_t n = backend_count();
  bool dropped[kMaxBackends] = {};
  for (std::size_t i = 0; i < n; ++i) dropped[i] = backends_[i]->drop_context(device, ctx);

  std::vector<std::pair<DevPtr, Block>> gone;
  registry_.for_each([&](DevPtr ptr, const Block& b) {
    if (b.device == device && b.api != Api::host && b.backend < n && dropped[b.backend]) gone.emplace_back(ptr, b);
  });
  for (const auto& [ptr, b] : gone) {
    Block block;
    if (registry_.erase(ptr, &block)) backends_[block.backend]->forget(block);
  }
  if (IpcHooks* ipc = ipc_.load(std::memory_order_acquire)) ipc->on_context_dropped(device);
  streams_.remove_device(device);
  contexts_dropped_.fetch_add(1, std::memory_order_relaxed);
  log::write(log::Level::info, "context of device %d destroyed: %zu live blocks dropped", device, gone.size());
}

}  // namespace allocshim
