// Host pieces passed to and from other processes of a shared budget (node/node_pieces.h;
// docs/design/oversubscription.md, "Passing host pieces"): a taker gives away the pieces of its
// host reserve (those its promotions just freed), and the giver adopts them into its own reserve,
// where its demotion takes them as it takes any kept piece, copying without pinning.
#include <unistd.h>

#include "backends/host_impl.h"
#include "core/budget.h"
#include "base/scoped_context.h"

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
  // Pieces made without POSIX-FD handles (the device cannot share host memory) cannot go.
  if (!s->ready || s->reserve.empty() || !s->posix_fd.load(std::memory_order_relaxed)) return 0;
  ScopedContext scope(driver(), s->ctx);
  std::size_t given = 0;
  // The largest first (fewest messages). A piece this process imported from another member
  // cannot be exported again (the driver refuses): it stays for this process's own demotions.
  for (auto it = s->reserve.end(); given < max_bytes && it != s->reserve.begin();) {
    --it;
    int fd = -1;
    if (driver().mem_export_to_fd(&fd, it->second) != res::ok) continue;
    // The descriptor holds the memory now; the other process's import takes it over.
    driver().mem_release(it->second);
    out.push_back(Given{it->first, fd});
    given += it->first;
    s->reserve_bytes -= it->first;
    it = s->reserve.erase(it);
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
