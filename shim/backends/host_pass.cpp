// Host pieces passed to and from other processes of a shared budget (core/node_pieces.h;
// docs/design/oversubscription.md, "Passing host pieces"): a taker gives away the pieces of its
// host reserve (those its promotions just freed), and the giver adopts them into its own reserve,
// where its demotion takes them as it takes any kept piece, copying without pinning.
#include <unistd.h>

#include "backends/host_impl.h"
#include "core/budget.h"
#include "core/scoped_context.h"

namespace allocshim::host_detail {

std::size_t HostBackend::host_spare(int device) const {
  const DeviceState* s = devices_.at(device);
  if (s == nullptr || budget_ == nullptr) return 0;
  std::lock_guard lock(mutex_);
  return s->reserve_bytes + s->ahead_bytes;
}

std::size_t HostBackend::give_host(int device, std::size_t max_bytes, std::vector<Given>& out) {
  DeviceState* s = devices_.at(device);
  if (s == nullptr || budget_ == nullptr) return 0;
  std::lock_guard lock(mutex_);
  if (!s->ready || s->reserve.empty()) return 0;
  ScopedContext scope(driver(), s->ctx);
  std::size_t given = 0;
  while (given < max_bytes && !s->reserve.empty()) {
    const auto it = std::prev(s->reserve.end());  // the largest first: fewest messages
    int fd = -1;
    // Not exportable (the device cannot share host memory): every piece is alike, so stop.
    if (driver().mem_export_to_fd(&fd, it->second) != res::ok) break;
    // The descriptor holds the memory now; the other process's import takes it over.
    driver().mem_release(it->second);
    out.push_back(Given{it->first, fd});
    given += it->first;
    s->reserve_bytes -= it->first;
    s->reserve.erase(it);
  }
  if (given > 0) budget_->on_reserve_bytes(device, s->reserve_bytes);
  return given;
}

bool HostBackend::adopt_host(int device, std::size_t bytes, int fd) {
  DeviceState* s = devices_.at(device);
  bool kept = false;
  if (s != nullptr && budget_ != nullptr) {
    std::lock_guard lock(mutex_);
    // Only a size a piece of this device can have: a demotion takes kept pieces by size.
    if (s->ready && bytes > 0 && bytes % s->chunk == 0 && bytes <= move_piece(s->chunk) &&
        s->reserve_bytes + s->ahead_bytes + bytes <= reserve_bound(device)) {
      ScopedContext scope(driver(), s->ctx);
      MemHandle h = 0;
      if (driver().mem_import_from_fd(&h, fd) == res::ok) {
        keep_host(*s, device, bytes, h);
        kept = true;
      }
    }
  }
  ::close(fd);  // the imported handle holds the memory
  return kept;
}

}  // namespace allocshim::host_detail
