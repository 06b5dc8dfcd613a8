// The budget's side of sleep and wake (core/sleep.h): emptying a device into the host and filling
// it again, with the lease of a shared budget given back and asked for.
#include "core/budget.h"

namespace allocshim {

void Budget::set_asleep(bool on) {
  asleep_.store(on, std::memory_order_relaxed);
  node_.set_asleep(on);
}

std::uint64_t Budget::host_bytes(int device) const {
  const Movable* m = movable();
  return m == nullptr ? 0 : m->host_bytes(device);
}

std::uint64_t Budget::empty_device(int device) {
  const Movable* m = movable();
  std::uint64_t moved = 0;
  // Each demotion moves what it can and stops at the first refusal; a later one may get further
  // (the host had pinned memory back meanwhile), but not one that moved nothing.
  while (m != nullptr && m->device_bytes(device) > 0) {
    const std::uint64_t step = migration_.demote(device, m->device_bytes(device));
    if (step == 0) break;
    moved += step;
  }
  if (moved > 0) on_shim_sync(device);  // the demotion synchronized the context first
  node_.settle(device, backed(device), 0);
  return moved;
}

std::uint64_t Budget::refill(int device) {
  const Movable* m = movable();
  if (m == nullptr) return 0;
  const std::uint64_t spilled = m->host_bytes(device);
  if (spilled == 0) return 0;
  if (node_.active()) node_.grow(device, backed(device) + spilled, /*wait=*/true);
  return migration_.promote(device, spilled);
}

}  // namespace allocshim
