// The mechanism that moves the spill target's pieces between device and host memory at the same
// address (placement/movable.h). Which allocations move, in which order, is placement/migration.h's decision;
// the caller closed the launch gate. Both directions run with the backend's lock held, so frees and
// other migrations of this backend wait for them.
#include <algorithm>
#include <iterator>
#include <utility>

#include "backends/host_impl.h"
#include "core/budget.h"
#include "base/clock.h"
#include "base/scoped_context.h"

namespace allocshim::host_detail {

void HostBackend::movable(int device, std::vector<MovableAllocation>& out) const {
  std::lock_guard lock(mutex_);
  for (const auto& [base, a] : allocs_) {
    if (a.device != device || a.exported) continue;
    MovableAllocation m;
    m.base = base;
    m.seq = a.seq;
    m.use = a.use;
    for (const Piece& p : a.pieces) (p.on_device ? m.device_bytes : m.host_bytes) += p.bytes;
    out.push_back(m);
  }
}

std::vector<std::pair<DevPtr, HostBackend::Allocation*>> HostBackend::movable_at(
    int device, const std::vector<DevPtr>& bases) {
  std::vector<std::pair<DevPtr, Allocation*>> out;
  for (DevPtr base : bases) {
    auto it = allocs_.find(base);  // freed since it was listed: skipped
    if (it != allocs_.end() && it->second.device == device && !it->second.exported)
      out.emplace_back(base, &it->second);
  }
  return out;
}

void HostBackend::note_place(const Allocation& a) {
  if (a.use == nullptr) return;
  std::uint64_t host = 0;
  for (const Piece& p : a.pieces) host += p.on_device ? 0 : p.bytes;
  a.use->host_bytes.store(host, std::memory_order_relaxed);
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
                         MemHandle fresh, MemHandle* old) {
  const Driver& d = driver();
  const DevPtr at = base + piece.offset;
  if (piece.bytes > kMovePiece) return res::invalid_value;  // never: pieces are built no larger
  // Whichever of the two pieces is on the device is the one mapped a second time, at the scratch
  // range: mapping host memory and granting the device access to it costs far more than mapping
  // device memory (move_bench), so host memory is mapped once per move, at the address. A promotion copies into the new piece at the scratch range, then remaps; a demotion
  // remaps the address to the new host piece first and copies from the old one at the scratch.
  const MemHandle device_side = to_device ? fresh : piece.handle;
  Result r = d.mem_map(s.scratch, piece.bytes, 0, device_side);
  if (r != res::ok) return r;
  r = d.mem_set_access(s.scratch, piece.bytes, device, true);
  bool remapped = false;
  if (r == res::ok && to_device) r = d.memcpy_dtod(s.scratch, at, piece.bytes);
  // A device-to-device copy may return before it is done: the data must be in place before the
  // promoted piece's old host memory goes away.
  if (r == res::ok && to_device) r = d.ctx_synchronize();
  if (r == res::ok) r = d.mem_unmap(at, piece.bytes);
  if (r == res::ok) {
    remapped = true;
    r = d.mem_map(at, piece.bytes, 0, fresh);
  }
  if (r == res::ok) r = grant(s.peers, device, at, piece.bytes);
  if (r == res::ok && !to_device) r = d.memcpy_dtod(at, s.scratch, piece.bytes);
  // The demoted data must be in place before the old device piece goes.
  if (r == res::ok && !to_device) r = d.ctx_synchronize();
  d.mem_unmap(s.scratch, piece.bytes);
  if (r != res::ok) {
    if (remapped) {
      // Put the old piece back where it was: the program's data is still in it.
      d.mem_unmap(at, piece.bytes);
      d.mem_map(at, piece.bytes, 0, piece.handle);
      grant(s.peers, device, at, piece.bytes);
    }
    return r;
  }
  *old = piece.handle;
  piece.handle = fresh;
  piece.on_device = to_device;
  return res::ok;
}

Movable::Moves HostBackend::promote(int device, const std::vector<DevPtr>& bases,
                                    std::size_t max_bytes, const Room& room) {
  Moves moves;
  DeviceState* s = devices_.at(device);
  if (s == nullptr || budget_ == nullptr) return moves;
  std::lock_guard lock(mutex_);
  if (!s->ready || s->host_bytes.load(std::memory_order_relaxed) == 0) return moves;
  ScopedContext scope(driver(), s->ctx);
  if (!prepare_move(*s)) return moves;
  auto order = movable_at(device, bases);
  for (auto it = order.begin(); it != order.end(); ++it) {
    for (Piece& p : it->second->pieces) {
      if (p.on_device) continue;
      if (moves.bytes + p.bytes > max_bytes || !room(p.bytes)) return moves;
      const std::uint64_t t0 = clock::ticks();
      MemHandle fresh = 0, old = 0;
      Result r = create(*s, p.bytes, Location{Location::Type::device, device}, &fresh);
      if (r == res::ok && (r = move(*s, device, it->first, p, true, fresh, &old)) != res::ok)
        driver().mem_release(fresh);
      if (r != res::ok) {
        moves.failed = r;
        return moves;
      }
      keep_host(*s, device, p.bytes, old);  // the next demotion of this piece pins nothing
      note_place(*it->second);
      s->device_bytes.fetch_add(p.bytes, std::memory_order_relaxed);
      s->host_bytes.fetch_sub(p.bytes, std::memory_order_relaxed);
      s->promoted += p.bytes;
      moves.pieces.push_back({it->first + p.offset, p.bytes, clock::to_ns(clock::ticks() - t0)});
      moves.bytes += p.bytes;
    }
  }
  return moves;
}

Movable::Moves HostBackend::demote(int device, const std::vector<DevPtr>& bases,
                                   std::size_t want_bytes) {
  Moves moves;
  DeviceState* s = devices_.at(device);
  if (s == nullptr || budget_ == nullptr || want_bytes == 0) return moves;
  std::lock_guard lock(mutex_);
  if (!s->ready || s->device_bytes.load(std::memory_order_relaxed) == 0) return moves;
  ScopedContext scope(driver(), s->ctx);
  if (!prepare_move(*s)) return moves;
  // The pieces to move, in the caller's order; their host memory is pinned on several threads
  // while this one copies and remaps each as it comes (host_maker.h).
  std::vector<std::pair<DevPtr, Piece*>> run;
  std::vector<std::size_t> sizes;
  std::size_t planned = 0;
  for (auto& [base, a] : movable_at(device, bases))
    for (Piece& p : a->pieces)
      if (p.on_device && planned < want_bytes) {
        run.emplace_back(base, &p);
        sizes.push_back(p.bytes);
        planned += p.bytes;
      }
  HostRun host;
  start_host_run(*s, device, std::move(sizes), host);
  for (std::size_t i = 0; i < run.size(); ++i) {
    const auto [base, p] = run[i];
    const std::uint64_t t0 = clock::ticks();
    MemHandle fresh = 0, old = 0;
    Result r = take_host(host, i, &fresh);
    const bool host_short = r == res::out_of_memory;
    if (r == res::ok && (r = move(*s, device, base, *p, false, fresh, &old)) != res::ok)
      keep_host(*s, device, p->bytes, fresh);  // pinned all the same: the next demotion takes it
    if (r != res::ok) {
      moves.failed = r;
      end_host_run(*s, device, host, host_short);
      return moves;  // the host is short too, or the driver refused: stop, nothing lost
    }
    driver().mem_release(old);
    note_place(allocs_.at(base));
    s->device_bytes.fetch_sub(p->bytes, std::memory_order_relaxed);
    s->host_bytes.fetch_add(p->bytes, std::memory_order_relaxed);
    s->demoted += p->bytes;
    moves.pieces.push_back({base + p->offset, p->bytes, clock::to_ns(clock::ticks() - t0)});
    moves.bytes += p->bytes;
  }
  end_host_run(*s, device, host, false);
  // Demotions come on this device: with pin_ahead, pin the next one's host pieces ahead.
  s->ahead_armed = true;
  kick_ahead(*s, device);
  return moves;
}

std::size_t HostBackend::reserve_bound(int device) const {
  const std::uint64_t bound = budget_->reserve_bound(device);
  return static_cast<std::size_t>(bound == 0 ? 0
                                             : std::max(bound, budget_->expected_demotion(device)));
}

void HostBackend::keep_host(DeviceState& s, int device, std::size_t bytes, MemHandle handle) {
  if (budget_ == nullptr || s.reserve_bytes + s.ahead_bytes + bytes > reserve_bound(device)) {
    driver().mem_release(handle);
    return;
  }
  s.reserve.emplace(bytes, handle);
  s.reserve_bytes += bytes;
  budget_->on_reserve_bytes(device, s.reserve_bytes);
}

void HostBackend::trim_reserve(DeviceState& s, int device) {
  const std::size_t bound = reserve_bound(device);
  if (s.reserve.empty() || s.reserve_bytes + s.ahead_bytes <= bound) return;
  ScopedContext scope(driver(), s.ctx);
  while (!s.reserve.empty() && s.reserve_bytes + s.ahead_bytes > bound) {
    const auto it = std::prev(s.reserve.end());  // the largest first: fewest releases
    driver().mem_release(it->second);
    s.reserve_bytes -= it->first;
    s.reserve.erase(it);
  }
  budget_->on_reserve_bytes(device, s.reserve_bytes);
}

void HostBackend::drop_reserve(DeviceState& s, int device) {
  if (budget_) drop_ahead(s, device);
  if (s.reserve.empty()) return;
  for (const auto& [bytes, h] : s.reserve) driver().mem_release(h);
  s.reserve.clear();
  s.reserve_bytes = 0;
  if (budget_) budget_->on_reserve_bytes(device, 0);
}

void HostBackend::start_host_run(DeviceState& s, int device, std::vector<std::size_t> sizes,
                                 HostRun& run) {
  run.kept.assign(sizes.size(), 0);
  run.slot.assign(sizes.size(), 0);
  std::vector<std::size_t> pin;
  std::size_t ahead = 0;  // pieces pinned ahead taken
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (auto it = s.reserve.find(sizes[i]); it != s.reserve.end()) {
      run.kept[i] = it->second;
      s.reserve_bytes -= sizes[i];
      s.reserve.erase(it);
    } else if (auto a = s.ahead.find(sizes[i]); a != s.ahead.end()) {
      run.kept[i] = a->second;
      s.ahead_bytes -= sizes[i];
      s.ahead.erase(a);
      ++ahead;
    } else {
      run.slot[i] = pin.size();
      pin.push_back(sizes[i]);
    }
  }
  if (budget_)
    budget_->on_reserve_use(device, s.reserve_bytes, sizes.size() - pin.size() - ahead, pin.size());
  if (ahead > 0) {
    budget_->on_ahead(device, s.ahead_bytes, 0, ahead, 0);
    s.ahead_touched = Pinner::Clock::now();
  }
  run.sizes = std::move(sizes);
  run.maker.emplace(
      driver(), s.ctx, std::move(pin), pin_threads_.load(std::memory_order_relaxed),
      [this, &s](std::size_t bytes, MemHandle* h) { return create(s, bytes, s.host, h); });
}

Result HostBackend::take_host(HostRun& run, std::size_t i, MemHandle* handle) {
  if (i >= run.kept.size()) return res::invalid_value;
  if (run.kept[i] != 0) {
    *handle = std::exchange(run.kept[i], MemHandle{0});
    return res::ok;
  }
  return run.maker->take(run.slot[i], handle);
}

void HostBackend::end_host_run(DeviceState& s, int device, HostRun& run, bool host_short) {
  for (std::size_t i = 0; i < run.kept.size(); ++i)
    if (run.kept[i] != 0)
      keep_host(s, device, run.sizes[i], std::exchange(run.kept[i], MemHandle{0}));
  // The host is short of memory: what the reserve holds is better given back (the next pinning
  // may need it) than kept for sizes nobody asks for.
  if (host_short) drop_reserve(s, device);
}

}  // namespace allocshim::host_detail
