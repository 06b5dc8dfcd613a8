// The `vmm` backend's allocation path: a device's region, heaps and slabs made at its first
// allocation, blocks carved and mapped, thread caches refilled, frees deferred until their
// streams are done (vmm_impl.h has the class).
#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/request.h"
#include "backends/vmm_impl.h"
#include "base/clock.h"
#include "base/scoped_context.h"

namespace allocshim {
namespace vmm_detail {

Result VmmBackend::init(DeviceState& s, int device) {
  const Driver& d = driver();
  int supported = 0;
  Result r = d.device_get_attribute(&supported, DevAttr::vmm_supported, device);
  if (r != res::ok) return r;
  if (supported == 0) return res::not_supported;
  Context ctx = nullptr;
  r = d.ctx_get_current(&ctx);
  if (r != res::ok) return r;
  // IPC (docs/ipc.md): chunks are exportable as POSIX fds wherever the device allows it, so that
  // cuIpcGetMemHandle works on vmm memory with no policy option.
  int posix_fd = 0;
  const bool exportable =
      spec_.ipc.value_or(false) ||
      (d.device_get_attribute(&posix_fd, DevAttr::posix_fd_supported, device) == res::ok &&
       posix_fd != 0);
  vmm::RegionConfig config;
  config.device = device;
  config.posix_fd = exportable;
  PhysSpec phys;
  phys.location = Location{Location::Type::device, device};
  phys.posix_fd = exportable;
  std::size_t granularity = 0;
  r = d.mem_get_granularity(&granularity, phys);
  if (r != res::ok) return r;
  if (granularity == 0) granularity = 2u << 20;
  config.chunk = vmm::align_up(std::max<std::size_t>(spec_.chunk, granularity), granularity);
  if (spec_.reserve != 0) {
    config.reserve = spec_.reserve;
  } else {
    // Twice the device's memory: room for the program's whole footprint plus fragmentation,
    // without a second range (a block never spans two). Address space is cheap.
    std::size_t total = 0;
    if (d.device_total_mem(&total, device) != res::ok) total = 0;
    config.reserve = std::max(kMinReserve, 2 * total);
  }
  s.dev = std::make_unique<Device>(d, config, &streams_, ctx,
                                   &mutable_stats().device(device).sync(), spec_.thread_cache);
  for (int peer = 0; peer < static_cast<int>(kMaxDevices); ++peer)
    if ((s.peers >> peer & 1) != 0) s.dev->region.add_accessor(peer);
  s.ctx.store(ctx, std::memory_order_release);
  s.ready.store(s.dev.get(), std::memory_order_release);
  return res::ok;
}

Result VmmBackend::obtain(Device& d, int device, std::size_t bytes, Heap::Node** out,
                          std::size_t* mapped) {
  Heap& heap = d.heap_for(bytes);
  for (int attempt = 0;; ++attempt) {
    Heap::Node* n = heap.allocate(bytes);
    if (n == nullptr || !d.region.backed(n->addr, n->size)) {
      // Before taking new address space or memory, take back every free whose wait is over and
      // every block parked at its exact size: neither may make the region grow. Classed blocks stay
      // parked (vmm_cache.h: their bound is their cost); out of memory takes them back too. The
      // open epoch is closed first if it holds enough frees to be worth its events
      // (close_at_shortage); its frees become reusable as soon as those complete.
      if (n != nullptr) heap.free(n);
      d.deferred.close_at_shortage(clock::ticks(), releaser(d));
      d.deferred.poll(~std::size_t{0}, releaser(d));
      flush_cache(d, false);
      n = heap.allocate(bytes);
    }
    if (n == nullptr) {
      DevPtr base = 0;
      std::size_t size = 0;
      const Result r = d.region.grow(bytes, &base, &size);
      if (r != res::ok) return r;
      heap.add_range(base, size);
      n = heap.allocate(bytes);
      if (n == nullptr) return res::out_of_memory;  // unreachable: the new range fits it
    }
    const Result r = d.region.acquire(n->addr, n->size, mapped);
    if (r == res::ok) {
      if (*mapped > 0) note_reserved(d, device);
      *out = n;
      return res::ok;
    }
    heap.free(n);
    if (r != res::out_of_memory || attempt > 0) {
      note_reserved(d, device);
      return r;
    }
    reclaim(d);
    note_reserved(d, device);
  }
}

void VmmBackend::release_node(Device& d, Heap::Node* node) {
  d.region.release(node->addr, node->size);
  d.heap_for(node->size).free(node);
}

void VmmBackend::release_block(Device& d, DevPtr ptr, std::uint64_t cookie) {
  if (vmm::is_small_cookie(cookie)) {
    if (Heap::Node* empty = d.small.free(vmm::slab_of(cookie), ptr)) release_node(d, empty);
  } else {
    release_node(d, vmm::node_of(cookie));
  }
}

void VmmBackend::reclaim(Device& d) {
  d.deferred.drain(releaser(d));
  flush_cache(d);
  d.scratch.clear();
  d.small.take_empty(d.scratch);
  for (Heap::Node* n : d.scratch) release_node(d, n);
  d.region.trim(0);
}

void VmmBackend::apply_threshold(Device& d, int device) {
  if (d.region.free_bytes() <= spec_.vmm_release_threshold) return;
  d.region.trim(spec_.vmm_release_threshold);
  note_reserved(d, device);
}

Result VmmBackend::carve(Device& d, int device, std::size_t bytes, DevPtr* out,
                         std::uint64_t* cookie, std::size_t* mapped) {
  if (bytes <= SmallClasses::kMaxSmall) {
    const int cls = SmallClasses::class_of(bytes);
    SmallClasses::Slab* slab = nullptr;
    DevPtr p = d.small.allocate(cls, &slab);
    if (p == 0) {
      Heap::Node* n = nullptr;
      const Result r = obtain(d, device, SmallClasses::slab_bytes(cls), &n, mapped);
      if (r != res::ok) return r;
      d.small.add_slab(cls, n);
      p = d.small.allocate(cls, &slab);
    }
    *out = p;
    *cookie = vmm::small_cookie(slab);
    return res::ok;
  }
  Heap::Node* n = nullptr;
  const Result r = obtain(d, device, bytes, &n, mapped);
  if (r != res::ok) return r;
  *out = n->addr;
  *cookie = reinterpret_cast<std::uint64_t>(n);
  return res::ok;
}

void VmmBackend::refill(Device& d, int t, std::size_t bytes) {
  // About 1 MiB per refill, at most 8 blocks: the lock is taken once for them, and a class the
  // thread asks for once does not leave much parked.
  const std::size_t extra = std::min<std::size_t>(7, (std::size_t{1} << 20) / bytes);
  ThreadCache::Victims victims;
  for (std::size_t i = 0; i < extra; ++i) {
    DevPtr p = 0;
    std::uint64_t cookie = 0;
    if (bytes <= SmallClasses::kMaxSmall) {  // slots of slabs that exist
      SmallClasses::Slab* slab = nullptr;
      p = d.small.allocate(SmallClasses::class_of(bytes), &slab);
      if (p == 0) break;
      cookie = vmm::small_cookie(slab);
    } else {  // free heap blocks on mapped chunks
      Heap& heap = d.heap_for(bytes);
      Heap::Node* n = heap.allocate(bytes);
      if (n == nullptr) break;
      std::size_t mapped = 0;
      if (!d.region.backed(n->addr, n->size) ||
          d.region.acquire(n->addr, n->size, &mapped) != res::ok) {
        heap.free(n);
        break;
      }
      p = n->addr;
      cookie = reinterpret_cast<std::uint64_t>(n);
    }
    victims.count = 0;
    const bool parked =
        d.cache.put(t, bytes, true, {p, cookie}, &victims) == ThreadCache::Put::parked;
    for (int v = 0; v < victims.count; ++v)
      release_parked(d, victims.blocks[static_cast<std::size_t>(v)]);
    if (!parked) {
      release_block(d, p, cookie);
      break;
    }
  }
}

Result VmmBackend::do_allocate(const AllocRequest& req, FreeSync sync, DevPtr* out,
                               std::uint64_t* cookie) {
  DeviceState* s = devices_.at(req.device);
  if (s == nullptr) return res::invalid_device;
  std::size_t size = 0;
  if (const Result r = request_bytes(req, &size); r != res::ok) return r;  // what the driver says
  // Beyond any device's memory (and near SIZE_MAX, where rounding would wrap): the driver's answer.
  if (size > kMaxRequest) return res::out_of_memory;
  // With size classes on, a block that may pass through the thread caches has its class's size.
  const bool via_cache = cached(sync);
  Device* ready = s->ready.load(std::memory_order_acquire);
  const bool classed =
      via_cache && ready != nullptr && ready->classed.load(std::memory_order_relaxed);
  std::size_t bytes = vmm::align_up(size, vmm::kAlign);
  if (classed)
    bytes = CacheClasses::round(bytes);
  else if (bytes <= SmallClasses::kMaxSmall)
    bytes = SmallClasses::class_bytes(SmallClasses::class_of(bytes));
  // A block this thread parked: no lock, no heap.
  const int t = ThreadCache::thread();
  if (via_cache && ready != nullptr && t >= 0) {
    ThreadCache::Parked b;
    if (ready->cache.take(t, bytes, classed, &b)) {
      *out = b.ptr;
      *cookie = b.cookie;
      mutable_stats().device(req.device).on_hit();
      return res::ok;
    }
  }
  std::lock_guard lock(s->mutex);
  if (!s->dev) {
    const Result r = init(*s, req.device);
    if (r != res::ok) return r;
  }
  Device& d = *s->dev;
  ++d.locked_calls;
  if (t != d.last_thread) {
    if (d.last_thread != -1 && spec_.thread_cache != 0)
      d.classed.store(true, std::memory_order_relaxed);
    d.last_thread = t;
  }
  // Pending frees are polled only when memory is needed (obtain): a query per call while the GPU
  // lags behind cost the PyTorch loop more than the reuse it allowed.
  if (!d.deferred.empty()) d.deferred.close_if_due(clock::ticks(), releaser(d));
  // The heap decides with the large blocks this thread freed back in it (vmm_cache.h:
  // fragmentation): they are parked at their exact size and would serve no other.
  if (t >= 0)
    d.cache.reclaim_own(t, false,
                        [this, &d](const ThreadCache::Parked& p) { release_parked(d, p); });

  std::size_t mapped = 0;
  if (const Result r = carve(d, req.device, bytes, out, cookie, &mapped); r != res::ok) return r;
  if (classed && t >= 0 && bytes <= CacheClasses::kMaxClassed) refill(d, t, bytes);
  DeviceStats& stats = mutable_stats().device(req.device);
  if (mapped > 0)
    stats.on_miss();
  else
    stats.on_hit();
  return res::ok;
}

Result VmmBackend::do_deallocate(DevPtr ptr, const Block& block, const FreeRequest& req) {
  DeviceState* s = devices_.at(block.device);
  if (s == nullptr) return res::invalid_value;
  // Events and cuCtxSynchronize act on the current context: make it the block's device's.
  const bool waits = req.async || block.free_sync != FreeSync::none;
  ScopedContext scope(driver(), waits ? s->ctx.load(std::memory_order_acquire) : nullptr);
  // Before taking the lock, so other threads keep allocating while this one waits. An error means
  // the context is unusable (teardown at exit): the block is released anyway.
  if (!req.async && block.free_sync == FreeSync::device) driver().ctx_synchronize();

  // Nothing left to wait for: park the block in this thread's cache; blocks past the cache's
  // bounds come back in `victims`, released below under one lock.
  ThreadCache::Victims victims;
  bool parked = false;
  if (!req.async && cached(block.free_sync)) {
    Device* ready = s->ready.load(std::memory_order_acquire);
    if (const int t = ThreadCache::thread(); ready != nullptr && t >= 0) {
      const bool classed = ready->classed.load(std::memory_order_relaxed);
      const auto put =
          ready->cache.put(t, cookie_key(block.cookie), classed, {ptr, block.cookie}, &victims);
      parked = put == ThreadCache::Put::parked;
      if (parked && victims.count == 0) return res::ok;
    }
  }

  std::lock_guard lock(s->mutex);
  if (!s->dev) return res::invalid_value;
  Device& d = *s->dev;
  ++d.locked_calls;
  for (int i = 0; i < victims.count; ++i)
    release_parked(d, victims.blocks[static_cast<std::size_t>(i)]);
  if (parked) return res::ok;  // only the victims were left to release
  const PendingFree f{ptr, block.size, block.cookie};
  if (block.free_sync == FreeSync::barrier && !req.async) {
    const std::uint64_t now = clock::ticks();
    d.deferred.defer_barrier(f, now);
    d.deferred.close_if_due(now, releaser(d));
    apply_threshold(d, block.device);
    return res::ok;
  }
  if (req.async) {
    if (d.deferred.defer_after(f, req.stream) == res::ok) {
      d.deferred.poll(kPollBudget, releaser(d));
      apply_threshold(d, block.device);
      return res::ok;
    }
    driver().stream_synchronize(
        req.stream);  // the event could not be recorded: wait for the stream
  }
  release_block(d, ptr, block.cookie);
  apply_threshold(d, block.device);
  return res::ok;
}

}  // namespace vmm_detail
}  // namespace allocshim
