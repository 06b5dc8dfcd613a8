// The `vmm` backend beyond its allocation path: teardown, trimming, pointer lookups, peer access,
// context destruction and synchronization, statistics, and the factory.
#include <memory>
#include <mutex>

#include "backends/vmm_impl.h"
#include "base/scoped_context.h"

namespace allocshim {
namespace vmm_detail {

VmmBackend::~VmmBackend() {
  threads::remove_exit_hook(&VmmBackend::on_thread_exit, this);
  for (DeviceState& s : devices_) {
    std::lock_guard lock(s.mutex);
    if (!s.dev) continue;
    ScopedContext scope(driver(), s.ctx.load(std::memory_order_acquire));
    s.dev->deferred.drain(releaser(*s.dev));
    s.dev.reset();  // the region unmaps and releases everything, live blocks included
  }
}

void VmmBackend::on_thread_exit(void* self, int id) {
  auto* b = static_cast<VmmBackend*>(self);
  for (DeviceState& s : b->devices_) {
    Device* d = s.ready.load(std::memory_order_acquire);
    if (d == nullptr) continue;
    std::lock_guard lock(s.mutex);
    d->cache.reclaim_own(id, true,
                         [b, d](const ThreadCache::Parked& p) { b->release_parked(*d, p); });
  }
}

Result VmmBackend::trim(int device) {
  for (int i = 0; i < static_cast<int>(kMaxDevices); ++i) {
    if (device >= 0 && i != device) continue;
    DeviceState& s = devices_[static_cast<std::size_t>(i)];
    std::lock_guard lock(s.mutex);
    if (!s.dev) continue;
    Device& d = *s.dev;
    ScopedContext scope(driver(), s.ctx.load(std::memory_order_acquire));
    d.deferred.close(releaser(d));
    d.deferred.poll(~std::size_t{0}, releaser(d));
    flush_cache(d);
    d.scratch.clear();
    d.small.take_empty(d.scratch);
    for (Heap::Node* n : d.scratch) release_node(d, n);
    d.region.trim(0);
    note_reserved(d, i);
  }
  return res::ok;
}

bool VmmBackend::find(DevPtr ptr, DevPtr* base, std::size_t* size) const {
  for (const DeviceState& s : devices_) {
    std::lock_guard lock(s.mutex);
    if (!s.dev || !s.dev->region.contains(ptr)) continue;
    const Heap::Node* n = s.dev->small_heap.find(ptr);
    if (n == nullptr) n = s.dev->large_heap.find(ptr);
    if (n == nullptr || n->free) return false;
    DevPtr b = n->addr;
    std::size_t bytes = n->size;
    if (n->owner != nullptr) {
      const auto& slab = *static_cast<const SmallClasses::Slab*>(n->owner);
      if (!SmallClasses::slot_in_use(slab, ptr)) return false;
      b = slab.base + (ptr - slab.base) / slab.slot_bytes * slab.slot_bytes;
      bytes = slab.slot_bytes;
    }
    if (s.dev->cache.holds(b)) return false;     // freed by the program, parked in a thread cache
    if (s.dev->deferred.holds(b)) return false;  // freed by the program, waiting for its events
    *base = b;
    *size = bytes;
    return true;
  }
  return false;
}

std::size_t VmmBackend::reserved(int device) const {
  const DeviceState* s = devices_.at(device);
  if (s == nullptr) return 0;
  std::lock_guard lock(s->mutex);
  return s->dev ? s->dev->region.reserved_bytes() : 0;
}

Result VmmBackend::enable_peer_access(int accessing_device, int peer_device) {
  DeviceState* s = devices_.at(peer_device);
  if (s == nullptr || accessing_device < 0 ||
      static_cast<std::size_t>(accessing_device) >= kMaxDevices)
    return res::invalid_device;
  std::lock_guard lock(s->mutex);
  s->peers |= std::uint64_t{1} << accessing_device;
  return s->dev ? s->dev->region.add_accessor(accessing_device) : res::ok;
}

bool VmmBackend::drop_context(int device, Context ctx, bool alive) {
  DeviceState* s = devices_.at(device);
  if (s == nullptr) return false;
  std::lock_guard lock(s->mutex);
  if (!s->dev || !in_context(s->ctx.load(std::memory_order_acquire), ctx)) return false;
  // No thread may take a parked block from here on (a program allocating on another thread while
  // it resets the device races with the reset natively too).
  s->ready.store(nullptr, std::memory_order_release);
  {
    ScopedContext scope(driver(), alive ? s->ctx.load(std::memory_order_acquire) : nullptr);
    if (!alive) s->dev->deferred.abandon();  // its events died with the context
    s->dev.reset();  // the events of pending frees, every chunk and the address space
  }
  s->ctx.store(nullptr, std::memory_order_release);
  s->peers = 0;  // the reset disables peer access too: the program enables it again
  mutable_stats().device(device).set_reserved(0);
  return true;
}

void VmmBackend::context_synchronized(int device, std::uint64_t sync) {
  DeviceState* s = devices_.at(device);
  if (s == nullptr || s->ready.load(std::memory_order_acquire) == nullptr) return;
  std::lock_guard lock(s->mutex);
  if (!s->dev || s->dev->deferred.empty()) return;
  ScopedContext scope(driver(), s->ctx.load(std::memory_order_acquire));
  s->dev->deferred.context_synchronized(sync, releaser(*s->dev));
}

void VmmBackend::close_epochs(int device, Stream dying) {
  DeviceState* s = devices_.at(device);
  if (s == nullptr || s->ready.load(std::memory_order_acquire) == nullptr) return;
  std::lock_guard lock(s->mutex);
  if (!s->dev) return;
  ScopedContext scope(driver(), s->ctx.load(std::memory_order_acquire));
  s->dev->deferred.close(releaser(*s->dev), dying);
}

VmmInfo VmmBackend::info(int device) const {
  VmmInfo v;
  const DeviceState* s = devices_.at(device);
  if (s == nullptr) return v;
  std::lock_guard lock(s->mutex);
  if (!s->dev) return v;
  const Device& d = *s->dev;
  v.va_bytes = d.region.va_bytes();
  v.mapped_bytes = d.region.mapped_bytes();
  v.free_bytes = d.region.free_bytes();
  v.segments = d.region.segments();
  v.slabs = d.small.slabs();
  v.pending = d.deferred.pending();
  v.events = d.deferred.events_created();
  v.epochs = d.deferred.epochs();
  v.parked = d.cache.parked();
  v.parked_bytes = d.cache.parked_bytes();
  v.central = d.cache.central_parked();
  v.locked_calls = d.locked_calls;
  v.classed = d.classed.load(std::memory_order_relaxed);
  v.creates = d.region.creates();
  v.heap_free_blocks = d.small_heap.free_blocks() + d.large_heap.free_blocks();
  v.chunk = d.region.chunk();
  return v;
}

}  // namespace vmm_detail

std::unique_ptr<Backend> make_vmm_backend(const policy::BackendSpec& spec, const Driver& driver,
                                          StreamTracker& streams, std::string& error) {
  if (driver.mem_create == nullptr || driver.mem_address_reserve == nullptr ||
      driver.mem_map == nullptr) {
    error = "the driver has no virtual memory management (CUDA 10.2 or newer is needed)";
    return nullptr;
  }
  return std::make_unique<vmm_detail::VmmBackend>(spec, driver, streams);
}

VmmInfo vmm_info(const Backend& backend, int device) {
  if (backend.kind() != BackendKind::vmm) return {};
  return static_cast<const vmm_detail::VmmBackend&>(backend).info(device);
}

}  // namespace allocshim
