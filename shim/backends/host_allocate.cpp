// A new allocation of the `host` backend (host_impl.h): its range reserved and mapped in device
// pieces (as many as the core claimed from the budget) and host pieces, then counted and kept.
// host.cpp keeps the rest of the backend: its devices' set-up, frees, lookups and peers.
#include <algorithm>

#include "backends/host_impl.h"
#include "backends/request.h"
#include "core/budget.h"

namespace allocshim {
namespace host_detail {
namespace {

constexpr std::size_t kMaxRequest = std::size_t{1} << 48;

std::size_t align_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

// Counts an allocation in progress in `n` (null: nowhere) while it lives.
struct Allocating {
  explicit Allocating(std::atomic<int>* counter) : n(counter) {
    if (n) n->fetch_add(1, std::memory_order_relaxed);
  }
  ~Allocating() {
    if (n) n->fetch_sub(1, std::memory_order_relaxed);
  }
  std::atomic<int>* n;
};

}  // namespace

// The device state of `device`, set up at its first request (null: a device the shim cannot serve,
// or the set-up failed, with `r` saying why).
HostBackend::DeviceState* HostBackend::ready_state(int device, std::size_t* chunk,
                                                   std::uint64_t* peers, Result* r) {
  DeviceState* s = devices_.at(device);
  *r = s == nullptr ? res::invalid_device : res::ok;
  if (s == nullptr) return nullptr;
  std::lock_guard lock(mutex_);
  if (!s->ready && (*r = init(*s, device)) != res::ok) return nullptr;
  *chunk = s->chunk;
  if (peers) *peers = s->peers;
  return s;
}

// The spill target's range is whole chunks, and its device part is claimed in chunks.
bool HostBackend::device_extent(const AllocRequest& req, std::size_t* range, std::size_t* unit) {
  std::size_t size = 0, chunk = 0;
  Result r = res::ok;
  if (budget_ == nullptr || request_bytes(req, &size) != res::ok || size > kMaxRequest ||
      ready_state(req.device, &chunk, nullptr, &r) == nullptr)
    return false;
  *range = align_up(size, chunk);
  *unit = chunk;
  return true;
}

// The spill target maps on the device what the core claimed there (AllocRequest::device_part),
// the rest on the host; the `host` kind maps everything on the host.
Result HostBackend::do_allocate(const AllocRequest& req, FreeSync, DevPtr* out, std::uint64_t*) {
  std::size_t size = 0;
  if (const Result r = request_bytes(req, &size); r != res::ok) return r;
  if (size > kMaxRequest) return res::out_of_memory;
  // The pinner yields while the program allocates here (host_ahead.cpp); it pins only under
  // migrate = "auto", and otherwise the shared counter is left alone. A reload may switch the
  // mode meanwhile: the decrement follows this call's own increment, so the count stays exact,
  // and a pinner switched on mid-call may pin during it (the yield only spares the driver's
  // serialized cuMemCreate; it guards no state).
  Allocating allocating{budget_ && budget_->migrate() == Budget::Migrate::auto_ ? &allocating_
                                                                                : nullptr};
  std::size_t chunk = 0;
  std::uint64_t peers = 0;
  Result r = res::ok;
  DeviceState* s = ready_state(req.device, &chunk, &peers, &r);
  if (s == nullptr) return r;
  Allocation a;
  a.device = req.device;
  a.size = size;
  a.va_bytes = align_up(size, chunk);
  std::size_t on_device = budget_ ? std::min(req.device_part, a.va_bytes) / chunk * chunk : 0;
  DevPtr base = 0;
  if (const Result m = map_range(*s, peers, chunk, a, on_device, &base); m != res::ok) return m;
  enter_allocation(*s, peers, base, std::move(a), on_device);
  if (req.device_placed) *req.device_placed = on_device;
  *out = base;
  return res::ok;
}

Result HostBackend::map_range(DeviceState& s, std::uint64_t peers, std::size_t chunk, Allocation& a,
                              std::size_t& on_device, DevPtr* out) {
  DevPtr base = 0;
  if (const Result r = driver().mem_address_reserve(&base, a.va_bytes, 0, 0); r != res::ok)
    return r;
  // The driver has less than the budget says (another process, or fragmentation): the rest goes
  // to the host.
  if (on_device > 0 && map_device_pieces(s, base, on_device, a.device, a.pieces) != res::ok)
    on_device = 0;
  Result r = map_host_pieces(s, base, chunk, on_device, a);
  if (r == res::ok) r = grant(peers, a.device, base, a.va_bytes);
  if (r != res::ok) {
    unmap_all(base, a);  // nothing may leak: every piece mapped so far goes back
    return r;
  }
  *out = base;
  return res::ok;
}

Result HostBackend::map_device_pieces(DeviceState& s, DevPtr base, std::size_t bytes, int device,
                                      std::vector<Piece>& pieces) {
  const Location location{Location::Type::device, device};
  for (std::size_t off = 0; off < bytes; off += kMovePiece) {
    Piece p{off, std::min(kMovePiece, bytes - off), 0, true};
    if (const Result r = map_new(s, base + off, p.bytes, location, &p.handle); r != res::ok) {
      for (const Piece& q : pieces) {
        driver().mem_unmap(base + q.offset, q.bytes);
        driver().mem_release(q.handle);
      }
      pieces.clear();
      return r;
    }
    pieces.push_back(p);
  }
  return res::ok;
}

// Host pieces: the spill target's are the size its device pieces move in (each promotable alone,
// one move each, and of the sizes the host reserve and pinning ahead keep), one in all
// otherwise; from the host reserve where it has them, the rest pinned on several threads while
// this one maps them (host_maker.h).
Result HostBackend::map_host_pieces(DeviceState& s, DevPtr base, std::size_t chunk,
                                    std::size_t on_device, Allocation& a) {
  const std::size_t step = budget_ ? move_piece(chunk) : a.va_bytes;
  std::vector<std::size_t> sizes;
  for (std::size_t off = on_device; off < a.va_bytes; off += step)
    sizes.push_back(std::min(step, a.va_bytes - off));
  if (sizes.empty()) return res::ok;
  HostRun run;
  {
    std::lock_guard lock(mutex_);
    start_host_run(s, a.device, std::move(sizes), run);
  }
  Result r = res::ok;
  bool host_short = false;
  for (std::size_t i = 0, off = on_device; r == res::ok && off < a.va_bytes; ++i, off += step) {
    Piece p{off, std::min(step, a.va_bytes - off), 0, false};
    r = take_host(run, i, &p.handle);
    host_short = r == res::out_of_memory;
    if (r == res::ok && (r = driver().mem_map(base + off, p.bytes, 0, p.handle)) != res::ok)
      driver().mem_release(p.handle);
    if (r == res::ok) a.pieces.push_back(p);
  }
  std::lock_guard lock(mutex_);
  end_host_run(s, a.device, run, host_short);
  return r;
}

void HostBackend::enter_allocation(DeviceState& s, std::uint64_t peers, DevPtr base, Allocation&& a,
                                   std::size_t on_device) {
  const int device = a.device;
  const std::size_t on_host = a.va_bytes - on_device;
  s.device_bytes.fetch_add(on_device, std::memory_order_relaxed);
  s.host_bytes.fetch_add(on_host, std::memory_order_relaxed);
  // Launches that point into the range count as its uses from now on (placement/use_tracker.h).
  if (budget_) {
    a.use = budget_->migration().uses().add(base, a.va_bytes, device);
    a.use->host_bytes.store(on_host, std::memory_order_relaxed);
  }
  std::size_t largest = 0;
  {
    std::lock_guard lock(mutex_);
    // Peers enabled while this range was being mapped get access too.
    if (s.peers != peers) grant(s.peers, device, base, a.va_bytes);
    a.seq = next_seq_++;
    largest = s.largest = std::max(s.largest, a.va_bytes);
    const Allocation& kept = allocs_.emplace(base, std::move(a)).first->second;
    s.by_age.emplace_hint(s.by_age.end(), kept.seq, &kept);
  }
  if (budget_ && pin_ahead_.load(std::memory_order_relaxed) && demotion_near(device, largest)) {
    std::lock_guard lock(mutex_);
    kick_ahead(s, device);
  }
  if (budget_ && on_host > 0) budget_->on_spilled(device, on_host);
}

}  // namespace host_detail
}  // namespace allocshim
