#include "backends/host.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include "backends/free_sync.h"
#include "backends/request.h"
#include "core/budget.h"

namespace allocshim {
namespace {

constexpr std::size_t kMaxRequest = std::size_t{1} << 48;
constexpr std::size_t kDefaultChunk = std::size_t{2} << 20;

std::size_t align_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

class HostBackend final : public Backend {
 public:
  // `budget` non-null: the spill target (device chunks up to the budget, host chunks of one chunk
  // each, promotable); null: the `host` kind (everything on the host, one physical allocation).
  HostBackend(std::string name, const Driver& driver, Budget* budget)
      : Backend(std::move(name), BackendKind::host, driver), budget_(budget) {}
  ~HostBackend() override;

  bool find(DevPtr ptr, DevPtr* base, std::size_t* size) const override;
  std::size_t reserved(int device) const override {
    const DeviceState* s = state(device);
    return s ? s->device_bytes.load(std::memory_order_relaxed) : 0;
  }
  Result enable_peer_access(int accessing_device, int peer_device) override;
  bool drop_context(int device, Context ctx, bool alive) override;
  bool physical(DevPtr ptr, DevPtr* base, std::size_t* size) const override {
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
  void on_exported(DevPtr base) override {
    std::lock_guard lock(mutex_);
    if (auto it = allocs_.find(base); it != allocs_.end()) it->second.exported = true;
  }

  std::size_t spilled(int device) const {
    const DeviceState* s = state(device);
    return s ? s->host_bytes.load(std::memory_order_relaxed) : 0;
  }
  std::size_t promote(int device);
  HostInfo info(int device) const;

 private:
  // A piece of an allocation's range backed by one physical allocation.
  struct Piece {
    std::size_t offset = 0;
    std::size_t bytes = 0;
    MemHandle handle = 0;
    bool on_device = false;
  };
  struct Allocation {
    int device = 0;
    bool exported = false;  // shared with another process: its chunks stay where they are
    std::size_t va_bytes = 0;
    std::size_t size = 0;  // the program's
    std::vector<Piece> pieces;
  };
  struct DeviceState {
    bool ready = false;
    Context ctx = nullptr;
    std::size_t chunk = kDefaultChunk;
    Location host;
    std::atomic<bool> posix_fd{false};  // chunks exportable (IPC) as POSIX file descriptors
    std::uint64_t peers = 0;  // devices granted access besides this one (bit per device)
    DevPtr scratch = 0;       // one chunk of VA where promotion copies land
    std::size_t promoted = 0;
    std::atomic<std::size_t> device_bytes{0}, host_bytes{0};
  };

  Result do_allocate(const AllocRequest& req, FreeSync sync, DevPtr* out,
                     std::uint64_t* cookie) override;
  Result do_deallocate(DevPtr ptr, const Block& block, const FreeRequest& req) override;

  DeviceState* state(int device) {
    return device >= 0 && static_cast<std::size_t>(device) < kMaxDevices
               ? &devices_[static_cast<std::size_t>(device)]
               : nullptr;
  }
  const DeviceState* state(int device) const { return const_cast<HostBackend*>(this)->state(device); }
  Result init(DeviceState& s, int device);
  // Grants `device` and the `peers` read-write access to [ptr, ptr + bytes).
  Result grant(std::uint64_t peers, int device, DevPtr ptr, std::size_t bytes);
  // Creates physical memory of `bytes` at `location` (exportable where `s` allows) and maps it at `at`.
  Result map_new(DeviceState& s, DevPtr at, std::size_t bytes, const Location& location, MemHandle* handle);
  // Unmaps and releases every piece and the range.
  void unmap_all(DevPtr base, const Allocation& a);
  // unmap_all for a live allocation: its bytes leave the counters, its device chunks the budget.
  void release(DevPtr base, const Allocation& a);
  // Moves one host piece to a new device chunk at the same address (lock held).
  Result move_to_device(DeviceState& s, int device, DevPtr base, Piece& piece);

  Budget* budget_;
  mutable std::mutex mutex_;  // allocs_, the devices' init and peers, promotion
  std::map<DevPtr, Allocation> allocs_;
  std::array<DeviceState, kMaxDevices> devices_;
};

HostBackend::~HostBackend() {
  std::lock_guard lock(mutex_);
  // unmap_all, not release: the budget may be gone already (the core destroys it first).
  for (const auto& [base, a] : allocs_) unmap_all(base, a);
  allocs_.clear();
  for (DeviceState& s : devices_)
    if (s.scratch != 0) driver().mem_address_free(s.scratch, s.chunk);
}

Result HostBackend::init(DeviceState& s, int device) {
  const Driver& d = driver();
  int vmm = 0;
  if (const Result r = d.device_get_attribute(&vmm, DevAttr::vmm_supported, device); r != res::ok)
    return r;
  if (vmm == 0) return res::not_supported;
  if (const Result r = d.ctx_get_current(&s.ctx); r != res::ok) return r;
  // HOST_NUMA where the device has a NUMA node and supports it; plain HOST otherwise.
  int numa = -1, numa_vmm = 0;
  if (d.device_get_attribute(&numa, DevAttr::host_numa_id, device) != res::ok) numa = -1;
  if (d.device_get_attribute(&numa_vmm, DevAttr::host_numa_vmm, device) != res::ok) numa_vmm = 0;
  s.host = numa >= 0 && numa_vmm != 0 ? Location{Location::Type::host_numa, numa}
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
  s.posix_fd.store(d.device_get_attribute(&posix_fd, DevAttr::posix_fd_supported, device) == res::ok && posix_fd != 0,
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

Result HostBackend::map_new(DeviceState& s, DevPtr at, std::size_t bytes, const Location& location,
                            MemHandle* handle) {
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
  if (r != res::ok) return r;
  if (const Result r = driver().mem_map(at, bytes, 0, *handle); r != res::ok) {
    driver().mem_release(*handle);
    return r;
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
  unmap_all(base, a);
  std::size_t on_device = 0, on_host = 0;
  for (const Piece& p : a.pieces) (p.on_device ? on_device : on_host) += p.bytes;
  DeviceState* s = state(a.device);
  if (s == nullptr) return;  // never: allocations exist only for valid devices
  s->device_bytes.fetch_sub(on_device, std::memory_order_relaxed);
  s->host_bytes.fetch_sub(on_host, std::memory_order_relaxed);
  if (budget_ && on_device) budget_->unclaim(a.device, on_device);
}

bool HostBackend::drop_context(int device, Context ctx, bool alive) {
  DeviceState* s = state(device);
  if (s == nullptr) return false;
  std::lock_guard lock(mutex_);
  if (!s->ready || !in_context(s->ctx, ctx)) return false;
  ScopedContext scope(driver(), alive ? s->ctx : nullptr);  // VMM memory only: no context objects
  for (auto it = allocs_.begin(); it != allocs_.end();) {
    if (it->second.device != device) {
      ++it;
      continue;
    }
    release(it->first, it->second);
    it = allocs_.erase(it);
  }
  if (s->scratch != 0) driver().mem_address_free(s->scratch, s->chunk);
  s->scratch = 0;
  s->ready = false;
  s->ctx = nullptr;
  s->peers = 0;  // the reset disables peer access too: the program enables it again
  return true;
}

Result HostBackend::do_allocate(const AllocRequest& req, FreeSync, DevPtr* out, std::uint64_t*) {
  DeviceState* s = state(req.device);
  if (s == nullptr) return res::invalid_device;
  std::size_t size = 0;
  if (const Result r = request_bytes(req, &size); r != res::ok) return r;
  if (size > kMaxRequest) return res::out_of_memory;
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
  // The spill target takes device chunks first, as many as the budget has room for.
  std::size_t on_device = budget_ ? budget_->claim(req.device, a.va_bytes, chunk) : 0;
  DevPtr base = 0;
  if (const Result r = driver().mem_address_reserve(&base, a.va_bytes, 0, 0); r != res::ok) {
    if (on_device) budget_->unclaim(req.device, on_device);
    return r;
  }
  Result r = res::ok;
  if (on_device > 0) {
    Piece p{0, on_device, 0, true};
    r = map_new(*s, base, on_device, Location{Location::Type::device, req.device}, &p.handle);
    if (r == res::ok) {
      a.pieces.push_back(p);
    } else {
      // The driver has less than the budget says (another process, or fragmentation): the rest
      // goes to the host.
      budget_->unclaim(req.device, on_device);
      on_device = 0;
      r = res::ok;
    }
  }
  // Host pieces: one per chunk for the spill target (each promotable alone), one in all otherwise.
  const std::size_t step = budget_ ? chunk : a.va_bytes;
  for (std::size_t off = on_device; r == res::ok && off < a.va_bytes; off += step) {
    Piece p{off, std::min(step, a.va_bytes - off), 0, false};
    r = map_new(*s, base + off, p.bytes, s->host, &p.handle);
    if (r == res::ok) a.pieces.push_back(p);
  }
  if (r == res::ok) r = grant(peers, req.device, base, a.va_bytes);
  if (r != res::ok) {
    // Nothing may leak: every piece mapped so far goes back, and the claim with it.
    unmap_all(base, a);
    if (on_device) budget_->unclaim(req.device, on_device);
    return r;
  }
  const std::size_t on_host = a.va_bytes - on_device;
  s->device_bytes.fetch_add(on_device, std::memory_order_relaxed);
  s->host_bytes.fetch_add(on_host, std::memory_order_relaxed);
  {
    std::lock_guard lock(mutex_);
    // Peers enabled while this range was being mapped get access too.
    if (s->peers != peers) grant(s->peers, req.device, base, a.va_bytes);
    allocs_.emplace(base, std::move(a));
  }
  if (budget_ && on_host > 0) budget_->on_spilled(req.device, on_host);
  *out = base;
  return res::ok;
}

Result HostBackend::do_deallocate(DevPtr ptr, const Block& block, const FreeRequest& req) {
  DeviceState* s = state(block.device);
  if (s == nullptr) return res::invalid_value;
  {
    // Unmapping memory a kernel still reads would fault: wait as cudaFree does.
    ScopedContext scope(driver(), s->ctx);
    if (req.async) driver().stream_synchronize(req.stream);
    else if (block.free_sync != FreeSync::none) driver().ctx_synchronize();
  }
  std::lock_guard lock(mutex_);
  auto it = allocs_.find(ptr);
  if (it == allocs_.end()) return res::invalid_value;
  release(it->first, it->second);
  allocs_.erase(it);
  return res::ok;
}

Result HostBackend::move_to_device(DeviceState& s, int device, DevPtr base, Piece& piece) {
  const Driver& d = driver();
  const DevPtr at = base + piece.offset;
  MemHandle fresh = 0;
  if (const Result r = map_new(s, s.scratch, piece.bytes, Location{Location::Type::device, device}, &fresh);
      r != res::ok)
    return r;
  Result r = d.mem_set_access(s.scratch, piece.bytes, device, true);
  if (r == res::ok) r = d.memcpy_dtod(s.scratch, at, piece.bytes);
  // A device-to-device copy may return before it is done: the data must be in place before the
  // host chunk goes away.
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
    // Put the host chunk back where it was: the program's data is still there.
    d.mem_unmap(at, piece.bytes);
    d.mem_release(fresh);
    d.mem_map(at, piece.bytes, 0, piece.handle);
    grant(s.peers, device, at, piece.bytes);
    return r;
  }
  d.mem_release(piece.handle);
  piece.handle = fresh;
  piece.on_device = true;
  return res::ok;
}

std::size_t HostBackend::promote(int device) {
  DeviceState* s = state(device);
  if (s == nullptr || budget_ == nullptr) return 0;
  std::lock_guard lock(mutex_);
  if (!s->ready || s->host_bytes.load(std::memory_order_relaxed) == 0) return 0;
  ScopedContext scope(driver(), s->ctx);
  if (s->scratch == 0 && driver().mem_address_reserve(&s->scratch, s->chunk, 0, 0) != res::ok) {
    s->scratch = 0;
    return 0;
  }
  // Work issued before the free that triggered this is done before any chunk is read.
  if (driver().ctx_synchronize() != res::ok) return 0;
  std::size_t moved = 0;
  for (auto& [base, a] : allocs_) {
    // An importer maps the chunks it was sent: a promoted chunk would be another one to it.
    if (a.device != device || a.exported) continue;
    for (Piece& p : a.pieces) {
      if (p.on_device) continue;
      const std::size_t got = budget_->claim(device, p.bytes, p.bytes);
      if (got != p.bytes) {
        budget_->unclaim(device, got);
        return moved;
      }
      if (move_to_device(*s, device, base, p) != res::ok) {
        budget_->unclaim(device, p.bytes);
        return moved;
      }
      s->device_bytes.fetch_add(p.bytes, std::memory_order_relaxed);
      s->host_bytes.fetch_sub(p.bytes, std::memory_order_relaxed);
      s->promoted += p.bytes;
      budget_->on_promoted(device, p.bytes);
      moved += p.bytes;
    }
  }
  return moved;
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
  DeviceState* s = state(peer_device);
  if (s == nullptr || accessing_device < 0 || static_cast<std::size_t>(accessing_device) >= kMaxDevices)
    return res::invalid_device;
  std::lock_guard lock(mutex_);
  s->peers |= std::uint64_t{1} << accessing_device;
  for (const auto& [base, a] : allocs_)
    if (a.device == peer_device)
      if (const Result r = driver().mem_set_access(base, a.va_bytes, accessing_device, true); r != res::ok)
        return r;
  return res::ok;
}

HostInfo HostBackend::info(int device) const {
  HostInfo v;
  const DeviceState* s = state(device);
  if (s == nullptr) return v;
  std::lock_guard lock(mutex_);
  for (const auto& [base, a] : allocs_) {
    if (a.device != device) continue;
    ++v.allocations;
    v.mappings += a.pieces.size();
  }
  v.device_bytes = s->device_bytes.load(std::memory_order_relaxed);
  v.host_bytes = s->host_bytes.load(std::memory_order_relaxed);
  v.promoted_bytes = s->promoted;
  v.host_location = s->host;
  return v;
}

}  // namespace

std::unique_ptr<Backend> make_host_backend(const policy::BackendSpec& spec, const Driver& driver,
                                           std::string& error) {
  if (driver.mem_create == nullptr || driver.mem_address_reserve == nullptr || driver.mem_map == nullptr) {
    error = "the driver has no virtual memory management (CUDA 10.2 or newer is needed)";
    return nullptr;
  }
  return std::make_unique<HostBackend>(spec.name, driver, nullptr);
}

std::unique_ptr<Backend> make_spill_host_backend(const Driver& driver, Budget& budget, std::string& error) {
  policy::BackendSpec spec;
  spec.name = "spill (host)";
  spec.kind = BackendKind::host;
  auto b = make_host_backend(spec, driver, error);
  if (!b) return nullptr;
  return std::make_unique<HostBackend>(spec.name, driver, &budget);
}

std::size_t host_spilled_bytes(const Backend& backend, int device) {
  if (backend.kind() != BackendKind::host) return 0;
  return static_cast<const HostBackend&>(backend).spilled(device);
}

std::size_t promote_host_chunks(Backend& backend, int device) {
  if (backend.kind() != BackendKind::host) return 0;
  return static_cast<HostBackend&>(backend).promote(device);
}

HostInfo host_info(const Backend& backend, int device) {
  if (backend.kind() != BackendKind::host) return {};
  return static_cast<const HostBackend&>(backend).info(device);
}

}  // namespace allocshim
