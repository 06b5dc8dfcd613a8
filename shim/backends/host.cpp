#include "backends/host.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#include "backends/host_impl.h"
#include "core/budget.h"
#include "base/scoped_context.h"
#include "os/host_memory.h"

namespace allocshim {
namespace host_detail {

HostBackend::HostBackend(std::string name, const Driver& driver, Budget* budget)
    : Backend(std::move(name), BackendKind::host, driver),
      budget_(budget),
      memory_probe_(os::host_memory) {
  // No thread yet: the pinner starts at the first allocation near the budget (host_ahead.cpp).
  if (budget_)
    pinner_ = std::make_unique<Pinner>([this] { return ahead_pass(); }, [this] { close_ahead(); });
}

namespace {
// CPUs this process may run on: more threads pinning host memory than that only wait.
unsigned usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return static_cast<unsigned>(CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}
}  // namespace

void HostBackend::configure(const policy::BackendSpec& host_side, policy::Budget::Migrate mode) {
  using Migrate = policy::Budget::Migrate;
  pin_threads_.store(std::min(host_side.pin_threads, usable_cpus()), std::memory_order_relaxed);
  host_reserve_.store(mode != Migrate::off ? host_side.host_reserve : 0, std::memory_order_relaxed);
  pin_ahead_.store(mode == Migrate::auto_ && host_side.pin_ahead && host_side.host_reserve > 0,
                   std::memory_order_relaxed);
  pin_ahead_idle_ms_.store(host_side.pin_ahead_idle_ms, std::memory_order_relaxed);
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

void set_host_side(Backend& spill, const policy::BackendSpec& host_side,
                   policy::Budget::Migrate mode) {
  if (auto* h = dynamic_cast<HostBackend*>(&spill)) h->configure(host_side, mode);
}

}  // namespace allocshim
