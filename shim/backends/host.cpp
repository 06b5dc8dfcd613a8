#include "backends/host.h"

#include <algorithm>

#include "backends/host_impl.h"
#include "backends/request.h"
#include "core/budget.h"
#include "base/scoped_context.h"
#include "os/host_memory.h"

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

HostBackend::HostBackend(std::string name, const Driver& driver, Budget* budget)
    : Backend(std::move(name), BackendKind::host, driver),
      budget_(budget),
      memory_probe_(os::host_memory) {
  // No thread yet: the pinner starts at the first allocation near the budget (host_ahead.cpp).
  if (budget_)
    pinner_ = std::make_unique<Pinner>([this] { return ahead_pass(); }, [this] { close_ahead(); });
}

HostBackend::~HostBackend() {
  pinner_.reset();  // joined before the state its passes read goes
  std::lock_guard lock(mutex_);
  // unmap_all, not release: the budget may be gone already (the core destroys it first).
  for (const auto& [base, a] : allocs_) unmap_all(base, a);
  allocs_.clear();
  for (DeviceState& s : devices_) {
    s.by_age.clear();
    if (s.scratch != 0) driver().mem_address_free(s.scratch, kMovePiece);
    for (const auto& [bytes, h] : s.reserve) driver().mem_release(h);
    for (const auto& [bytes, h] : s.ahead) driver().mem_release(h);
  }
}

Result HostBackend::init(DeviceState& s, int device) {
  const Driver& d = driver();
  int vmm = 0;
  if (const Result r = d.device_get_attribute(&vmm, DevAttr::vmm_supported, device); r != res::ok)
    return r;
  if (vmm == 0) return res::not_supported;
  if (const Result r = d.ctx_get_current(&s.ctx); r != res::ok) return r;
  // HOST_NUMA wherever the device supports it: the node closest to the device, or node 0 where the
  // host reports none (what cuMemCreate asks for on a system without NUMA). Plain HOST otherwise,
  // which cannot be exported (cuMemCreate refuses POSIX-FD handles for it).
  int numa = -1, numa_vmm = 0;
  if (d.device_get_attribute(&numa, DevAttr::host_numa_id, device) != res::ok) numa = -1;
  if (d.device_get_attribute(&numa_vmm, DevAttr::host_numa_vmm, device) != res::ok) numa_vmm = 0;
  s.host = numa_vmm != 0 ? Location{Location::Type::host_numa, std::max(numa, 0)}
                         : Location{Location::Type::host, 0};
  // One chunk size for both kinds of pieces, so a host chunk can be replaced by a device chunk.
  std::size_t g_host = 0, g_dev = 0;
  PhysSpec spec;
  spec.location = s.host;
  if (const Result r = d.mem_get_granularity(&g_host, spec); r != res::ok) return r;
  spec.location = Location{Location::Type::device, device};
  if (d.mem_get_granularity(&g_dev, spec) != res::ok) g_dev = 0;
  s.chunk = std::max({g_host, g_dev, std::size_t{1}});
  // Exportable (cudaIpcGetMemHandle, docs/ipc.md) where the device allows POSIX-FD handles.
  int posix_fd = 0;
  s.posix_fd.store(
      d.device_get_attribute(&posix_fd, DevAttr::posix_fd_supported, device) == res::ok &&
          posix_fd != 0,
      std::memory_order_relaxed);
  if (s.chunk < kDefaultChunk && kDefaultChunk % s.chunk == 0) s.chunk = kDefaultChunk;
  s.ready = true;
  return res::ok;
}

Result HostBackend::grant(std::uint64_t peers, int device, DevPtr ptr, std::size_t bytes) {
  if (const Result r = driver().mem_set_access(ptr, bytes, device, true); r != res::ok) return r;
  for (int peer = 0; peer < static_cast<int>(kMaxDevices); ++peer)
    if ((peers >> peer & 1) != 0 && peer != device)
      if (const Result r = driver().mem_set_access(ptr, bytes, peer, true); r != res::ok) return r;
  return res::ok;
}

Result HostBackend::create(DeviceState& s, std::size_t bytes, const Location& location,
                           MemHandle* handle) const {
  PhysSpec spec;
  spec.location = location;
  spec.posix_fd = s.posix_fd.load(std::memory_order_relaxed);
  Result r = driver().mem_create(handle, bytes, spec);
  if ((r == res::not_supported || r == res::invalid_value) && spec.posix_fd) {
    // Host memory that cannot be exportable here: served all the same, not exportable (the
    // exporter then refuses it and says why).
    spec.posix_fd = false;
    s.posix_fd.store(false, std::memory_order_relaxed);
    r = driver().mem_create(handle, bytes, spec);
  }
  return r;
}

Result HostBackend::map_new(DeviceState& s, DevPtr at, std::size_t bytes, const Location& location,
                            MemHandle* handle) {
  if (const Result r = create(s, bytes, location, handle); r != res::ok) return r;
  if (const Result r = driver().mem_map(at, bytes, 0, *handle); r != res::ok) {
    driver().mem_release(*handle);
    return r;
  }
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

void HostBackend::unmap_all(DevPtr base, const Allocation& a) {
  for (const Piece& p : a.pieces) {
    driver().mem_unmap(base + p.offset, p.bytes);
    driver().mem_release(p.handle);
  }
  driver().mem_address_free(base, a.va_bytes);
}

void HostBackend::release(DevPtr base, const Allocation& a) {
  if (a.use) budget_->migration().uses().remove(base);
  unmap_all(base, a);
  std::size_t on_device = 0, on_host = 0;
  for (const Piece& p : a.pieces) (p.on_device ? on_device : on_host) += p.bytes;
  DeviceState* s = devices_.at(a.device);
  if (s == nullptr) return;  // never: allocations exist only for valid devices
  s->device_bytes.fetch_sub(on_device, std::memory_order_relaxed);
  s->host_bytes.fetch_sub(on_host, std::memory_order_relaxed);
  if (budget_ && on_device) budget_->unclaim(a.device, on_device);
}

bool HostBackend::drop_context(int device, Context ctx, bool alive) {
  DeviceState* s = devices_.at(device);
  if (s == nullptr) return false;
  // Joined before the context goes: its passes use it, and take mutex_ (a later kick restarts it).
  if (pinner_) pinner_->stop();
  std::lock_guard lock(mutex_);
  if (!s->ready || !in_context(s->ctx, ctx)) return false;
  ScopedContext scope(driver(), alive ? s->ctx : nullptr);  // VMM memory only: no context objects
  for (auto it = allocs_.begin(); it != allocs_.end();) {
    if (it->second.device != device) {
      ++it;
      continue;
    }
    release(it->first, it->second);
    s->by_age.erase(it->second.seq);
    it = allocs_.erase(it);
  }
  if (s->scratch != 0) driver().mem_address_free(s->scratch, kMovePiece);
  s->scratch = 0;
  drop_reserve(*s, device);
  s->ahead_armed = true;
  s->largest = 0;
  s->ready = false;
  s->ctx = nullptr;
  s->peers = 0;  // the reset disables peer access too: the program enables it again
  return true;
}

Result HostBackend::do_allocate(const AllocRequest& req, FreeSync, DevPtr* out, std::uint64_t*) {
  DeviceState* s = devices_.at(req.device);
  if (s == nullptr) return res::invalid_device;
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
  {
    std::lock_guard lock(mutex_);
    if (!s->ready)
      if (const Result r = init(*s, req.device); r != res::ok) return r;
    chunk = s->chunk;
    peers = s->peers;
  }
  Allocation a;
  a.device = req.device;
  a.size = size;
  a.va_bytes = align_up(size, chunk);
  std::size_t on_device = claim_device(req.device, a.va_bytes, chunk);
  DevPtr base = 0;
  if (const Result r = map_range(*s, peers, chunk, a, on_device, &base); r != res::ok) return r;
  enter_allocation(*s, peers, base, std::move(a), on_device);
  *out = base;
  return res::ok;
}

// The spill target takes device chunks first, as many as the budget has room for. With
// migrate = "auto", other processes sharing the budget are asked once for what is missing and
// get share_wait_ms to give it (as an admission waits for them: a process idle at its safe
// points holds colder memory than this one's newest), then this process's own oldest memory is
// demoted for the rest.
std::size_t HostBackend::claim_device(int device, std::size_t bytes, std::size_t chunk) {
  using Claim = Budget::Claim;
  const bool auto_ = budget_ && budget_->migrate() == Budget::Migrate::auto_;
  std::size_t on_device =
      budget_ ? budget_->claim(device, bytes, chunk, auto_ ? Claim::quiet : Claim::allocation) : 0;
  if (auto_ && on_device < bytes && budget_->node().active())
    on_device += budget_->claim(device, bytes - on_device, chunk, Claim::waiting);
  if (auto_ && on_device < bytes && budget_->make_room(device, bytes - on_device, bytes) > 0)
    on_device += budget_->claim(device, bytes - on_device, chunk, Claim::quiet);
  return on_device;
}

Result HostBackend::map_range(DeviceState& s, std::uint64_t peers, std::size_t chunk, Allocation& a,
                              std::size_t& on_device, DevPtr* out) {
  DevPtr base = 0;
  if (const Result r = driver().mem_address_reserve(&base, a.va_bytes, 0, 0); r != res::ok) {
    if (on_device) budget_->unclaim(a.device, on_device);
    return r;
  }
  if (on_device > 0 && map_device_pieces(s, base, on_device, a.device, a.pieces) != res::ok) {
    // The driver has less than the budget says (another process, or fragmentation): the rest
    // goes to the host.
    budget_->unclaim(a.device, on_device);
    on_device = 0;
  }
  Result r = map_host_pieces(s, base, chunk, on_device, a);
  if (r == res::ok) r = grant(peers, a.device, base, a.va_bytes);
  if (r != res::ok) {
    // Nothing may leak: every piece mapped so far goes back, and the claim with it.
    unmap_all(base, a);
    if (on_device) budget_->unclaim(a.device, on_device);
    return r;
  }
  *out = base;
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
  if (budget_ && budget_->pin_ahead() && demotion_near(device, largest)) {
    std::lock_guard lock(mutex_);
    kick_ahead(s, device);
  }
  if (budget_ && on_host > 0) budget_->on_spilled(device, on_host);
}

Result HostBackend::do_deallocate(DevPtr ptr, const Block& block, const FreeRequest& req) {
  DeviceState* s = devices_.at(block.device);
  if (s == nullptr) return res::invalid_value;
  {
    // Unmapping memory a kernel still reads would fault: wait as cudaFree does.
    ScopedContext scope(driver(), s->ctx);
    if (req.async)
      driver().stream_synchronize(req.stream);
    else if (block.free_sync != FreeSync::none)
      driver().ctx_synchronize();
  }
  std::lock_guard lock(mutex_);
  auto it = allocs_.find(ptr);
  if (it == allocs_.end()) return res::invalid_value;
  release(it->first, it->second);
  if (DeviceState* d = devices_.at(it->second.device)) d->by_age.erase(it->second.seq);
  allocs_.erase(it);
  // The reserve serves memory that moves back and forth: with none left on the device, it goes.
  if (s->device_bytes.load(std::memory_order_relaxed) == 0 &&
      s->host_bytes.load(std::memory_order_relaxed) == 0)
    drop_reserve(*s, block.device);
  return res::ok;
}

bool HostBackend::physical(DevPtr ptr, DevPtr* base, std::size_t* size) const {
  std::lock_guard lock(mutex_);
  auto it = allocs_.upper_bound(ptr);
  if (it == allocs_.begin()) return false;
  --it;
  for (const Piece& p : it->second.pieces) {
    if (ptr < it->first + p.offset || ptr - it->first - p.offset >= p.bytes) continue;
    *base = it->first + p.offset;
    *size = p.bytes;
    return true;
  }
  return false;
}

void HostBackend::on_exported(DevPtr base) {
  std::lock_guard lock(mutex_);
  if (auto it = allocs_.find(base); it != allocs_.end()) it->second.exported = true;
}

Result HostBackend::trim(int device) {
  std::lock_guard lock(mutex_);
  for (int i = 0; i < static_cast<int>(kMaxDevices); ++i)
    if (device < 0 || i == device)
      if (DeviceState* s = devices_.at(i)) drop_reserve(*s, i);
  return res::ok;
}

bool HostBackend::find(DevPtr ptr, DevPtr* base, std::size_t* size) const {
  std::lock_guard lock(mutex_);
  auto it = allocs_.upper_bound(ptr);
  if (it == allocs_.begin()) return false;
  --it;
  if (ptr - it->first >= it->second.size) return false;
  *base = it->first;
  *size = it->second.size;
  return true;
}

Result HostBackend::enable_peer_access(int accessing_device, int peer_device) {
  DeviceState* s = devices_.at(peer_device);
  if (s == nullptr || accessing_device < 0 ||
      static_cast<std::size_t>(accessing_device) >= kMaxDevices)
    return res::invalid_device;
  std::lock_guard lock(mutex_);
  s->peers |= std::uint64_t{1} << accessing_device;
  for (const auto& [base, a] : allocs_)
    if (a.device == peer_device)
      if (const Result r = driver().mem_set_access(base, a.va_bytes, accessing_device, true);
          r != res::ok)
        return r;
  return res::ok;
}

}  // namespace host_detail

using host_detail::HostBackend;

namespace {
// Both flavours map physical memory into ranges of their own.
bool has_vmm(const Driver& driver, std::string& error) {
  if (driver.mem_create == nullptr || driver.mem_address_reserve == nullptr ||
      driver.mem_map == nullptr) {
    error = "the driver has no virtual memory management (CUDA 10.2 or newer is needed)";
    return false;
  }
  return true;
}
}  // namespace

std::unique_ptr<Backend> make_host_backend(const policy::BackendSpec& spec, const Driver& driver,
                                           std::string& error) {
  if (!has_vmm(driver, error)) return nullptr;
  return std::make_unique<HostBackend>(spec.name, driver, nullptr);
}

std::unique_ptr<Backend> make_spill_host_backend(const Driver& driver, Budget& budget,
                                                 std::string& error) {
  if (!has_vmm(driver, error)) return nullptr;
  return std::make_unique<HostBackend>("spill (host)", driver, &budget);
}

}  // namespace allocshim
