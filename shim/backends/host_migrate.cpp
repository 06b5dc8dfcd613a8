// Migration of the spill target's pieces between device and host memory at the same address
// (docs/oversubscription.md, "Migration"): promotion moves host pieces of the newest allocations
// to the device while the budget has room, demotion moves device pieces of the oldest allocations
// to the host to make room. Both run at safe points only, with the backend's lock held, so frees
// and other migrations of this backend wait for them.
#include <algorithm>

#include "backends/free_sync.h"
#include "backends/host_impl.h"
#include "core/budget.h"
#include "core/clock.h"

namespace allocshim::host_detail {

std::vector<std::pair<DevPtr, HostBackend::Allocation*>> HostBackend::by_age(int device) {
  std::vector<std::pair<DevPtr, Allocation*>> out;
  for (auto& [base, a] : allocs_)
    if (a.device == device && !a.exported) out.emplace_back(base, &a);
  std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.second->seq < y.second->seq; });
  return out;
}

bool HostBackend::prepare_move(DeviceState& s) {
  if (s.scratch == 0 && driver().mem_address_reserve(&s.scratch, kMovePiece, 0, 0) != res::ok) {
    s.scratch = 0;
    return false;
  }
  // Work issued before the safe point is done before any piece is read.
  return driver().ctx_synchronize() == res::ok;
}

Result HostBackend::move(DeviceState& s, int device, DevPtr base, Piece& piece, bool to_device,
                         MemHandle fresh) {
  const Driver& d = driver();
  const DevPtr at = base + piece.offset;
  Result r = piece.bytes <= kMovePiece ? res::ok : res::invalid_value;  // never: pieces are built no larger
  if (r == res::ok) r = d.mem_map(s.scratch, piece.bytes, 0, fresh);
  if (r != res::ok) {
    d.mem_release(fresh);
    return r;
  }
  r = d.mem_set_access(s.scratch, piece.bytes, device, true);
  if (r == res::ok) r = d.memcpy_dtod(s.scratch, at, piece.bytes);
  // A device-to-device copy may return before it is done: the data must be in place before the
  // old piece goes away.
  if (r == res::ok) r = d.ctx_synchronize();
  d.mem_unmap(s.scratch, piece.bytes);
  if (r != res::ok) {
    d.mem_release(fresh);
    return r;
  }
  if (r = d.mem_unmap(at, piece.bytes); r != res::ok) {
    d.mem_release(fresh);
    return r;
  }
  r = d.mem_map(at, piece.bytes, 0, fresh);
  if (r == res::ok) r = grant(s.peers, device, at, piece.bytes);
  if (r != res::ok) {
    // Put the old piece back where it was: the program's data is still in it.
    d.mem_unmap(at, piece.bytes);
    d.mem_release(fresh);
    d.mem_map(at, piece.bytes, 0, piece.handle);
    grant(s.peers, device, at, piece.bytes);
    return r;
  }
  d.mem_release(piece.handle);
  piece.handle = fresh;
  piece.on_device = to_device;
  return res::ok;
}

std::size_t HostBackend::promote(int device, std::size_t max_bytes) {
  DeviceState* s = devices_.at(device);
  if (s == nullptr || budget_ == nullptr) return 0;
  std::lock_guard lock(mutex_);
  if (!s->ready || s->host_bytes.load(std::memory_order_relaxed) == 0) return 0;
  ScopedContext scope(driver(), s->ctx);
  if (!prepare_move(*s)) return 0;
  std::size_t moved = 0;
  auto order = by_age(device);
  // The newest allocations first: the oldest are what demotion would pick next.
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    for (Piece& p : it->second->pieces) {
      if (p.on_device) continue;
      if (moved + p.bytes > max_bytes) return moved;
      const std::size_t got = budget_->claim(device, p.bytes, p.bytes, Budget::Claim::promotion);
      if (got != p.bytes) {
        budget_->unclaim(device, got);
        return moved;
      }
      const std::uint64_t t0 = clock::ticks();
      MemHandle fresh = 0;
      Result r = create(*s, p.bytes, Location{Location::Type::device, device}, &fresh);
      if (r == res::ok) r = move(*s, device, it->first, p, true, fresh);
      if (r != res::ok) {
        budget_->unclaim(device, p.bytes);
        budget_->on_move_failed(device, r);
        return moved;
      }
      s->device_bytes.fetch_add(p.bytes, std::memory_order_relaxed);
      s->host_bytes.fetch_sub(p.bytes, std::memory_order_relaxed);
      s->promoted += p.bytes;
      budget_->on_moved(device, it->first + p.offset, p.bytes, true, clock::to_ns(clock::ticks() - t0));
      moved += p.bytes;
    }
  }
  return moved;
}

std::size_t HostBackend::demote(int device, std::size_t want_bytes) {
  DeviceState* s = devices_.at(device);
  if (s == nullptr || budget_ == nullptr || want_bytes == 0) return 0;
  std::lock_guard lock(mutex_);
  if (!s->ready || s->device_bytes.load(std::memory_order_relaxed) == 0) return 0;
  ScopedContext scope(driver(), s->ctx);
  if (!prepare_move(*s)) return 0;
  // The pieces to move, oldest allocation first; their host memory is pinned on several threads
  // while this one copies and remaps each as it comes (host_maker.h).
  std::vector<std::pair<DevPtr, Piece*>> run;
  std::vector<std::size_t> sizes;
  std::size_t planned = 0;
  for (auto& [base, a] : by_age(device))
    for (Piece& p : a->pieces)
      if (p.on_device && planned < want_bytes) {
        run.emplace_back(base, &p);
        sizes.push_back(p.bytes);
        planned += p.bytes;
      }
  HostMaker maker = make_host(*s, std::move(sizes));
  std::size_t moved = 0;
  for (std::size_t i = 0; i < run.size(); ++i) {
    const auto [base, p] = run[i];
    const std::uint64_t t0 = clock::ticks();
    MemHandle fresh = 0;
    Result r = maker.take(i, &fresh);
    if (r == res::ok) r = move(*s, device, base, *p, false, fresh);
    if (r != res::ok) {
      budget_->on_move_failed(device, r);
      return moved;  // the host is short too, or the driver refused: stop, nothing lost
    }
    s->device_bytes.fetch_sub(p->bytes, std::memory_order_relaxed);
    s->host_bytes.fetch_add(p->bytes, std::memory_order_relaxed);
    s->demoted += p->bytes;
    budget_->unclaim(device, p->bytes);
    budget_->on_moved(device, base + p->offset, p->bytes, false, clock::to_ns(clock::ticks() - t0));
    moved += p->bytes;
  }
  return moved;
}

}  // namespace allocshim::host_detail
