#include "core/core.h"

#include "backends/native.h"
#include "core/clock.h"
#include "trace/recorder.h"

namespace allocshim {

Core::Core(const Driver& driver, policy::Policy policy) : driver_(driver), policy_(std::move(policy)) {
  clock::to_ns(0);  // calibrate the tick rate now rather than inside the first timed call
  build_backends();
}

Core::~Core() = default;

void Core::build_backends() {
  for (const policy::BackendSpec& spec : policy_.backends) {
    std::string why;
    std::unique_ptr<Backend> b = make_backend(spec, driver_, streams_, why);
    if (!b) {
      // A policy the shim cannot serve is not half-applied: everything goes native, and the
      // reason is reported (once, by the caller) instead of the program failing.
      error_ = "backend \"" + spec.name + "\": " + why;
      backends_.clear();
      policy_ = policy::default_policy();
      policy_.source += " (fallback)";
      for (const policy::BackendSpec& s : policy_.backends) {
        std::string ignored;
        backends_.push_back(make_backend(s, driver_, streams_, ignored));
      }
      break;
    }
    backends_.push_back(std::move(b));
  }
  native_ = static_cast<std::uint32_t>(backends_.size());
  for (std::uint32_t i = 0; i < backends_.size(); ++i)
    if (backends_[i]->kind() == BackendKind::native) native_ = i;
  if (native_ == backends_.size()) backends_.push_back(make_native_backend("native", driver_));
}

int Core::current_device() const {
  int device = 0;
  if (driver_.ctx_get_device(&device) != res::ok) device = 0;
  return device;
}

Result Core::alloc(AllocRequest& req, DevPtr* out) {
  if (!out) return res::invalid_value;
  req.device = current_device();
  const policy::Decision d = policy::match(policy_, req.size, req.api, req.device);
  // Managed and stream-ordered requests keep their own semantics (host access; the program's pool
  // and stream) unless a rule names their api explicitly: the default backend is for cudaMalloc.
  std::uint32_t index = static_cast<std::uint32_t>(d.backend);
  if (d.rule < 0 && (req.api == Api::managed || req.api == Api::async)) index = native_;
  if (index >= backends_.size()) index = native_;

  std::uint64_t cookie = 0;
  Backend& b = *backends_[index];
  trace::Recorder* const tr = trace::recorder();
  const std::uint64_t t0 = tr ? clock::ticks() : 0;
  const Result r = b.allocate(req, d.free_sync, out, &cookie);
  if (__builtin_expect(tr != nullptr, 0)) {
    const std::uint64_t ns = clock::to_ns(clock::ticks() - t0);
    if (r == res::ok)
      tr->on_alloc(*out, req.size, req.device, static_cast<int>(index), req.api, ns);
    else
      tr->on_alloc_failed(req.size, req.device, static_cast<int>(index), req.api, r, ns);
  }
  if (r != res::ok) return r;
  registry_.insert(*out, Block{req.size, index, static_cast<std::int16_t>(req.device), req.api,
                               d.free_sync, cookie});
  return r;
}

Result Core::free(DevPtr ptr, const FreeRequest& req) {
  Block block;
  if (!registry_.erase(ptr, &block)) {
    // Not ours (allocated before the shim saw it, or not an allocation at all): the driver decides.
    if (ptr != 0) unknown_frees_.fetch_add(1, std::memory_order_relaxed);
    return req.async ? driver_.mem_free_async(ptr, req.stream) : driver_.mem_free(ptr);
  }
  if (IpcHooks* ipc = ipc_.load(std::memory_order_acquire); __builtin_expect(ipc != nullptr, 0))
    if (ipc->on_free(ptr, block, req)) return res::ok;
  trace::Recorder* const tr = trace::recorder();
  if (__builtin_expect(tr == nullptr, 1)) return backends_[block.backend]->deallocate(ptr, block, req);
  const std::uint64_t t0 = clock::ticks();
  const Result r = backends_[block.backend]->deallocate(ptr, block, req);
  tr->on_free(ptr, block.size, block.device, static_cast<int>(block.backend),
              clock::to_ns(clock::ticks() - t0), req.async ? trace::kFreeAsync : 0);
  return r;
}

Result Core::host_alloc(void** ptr, std::size_t bytes, unsigned flags, bool portable_api) {
  const std::uint64_t t0 = clock::ticks();
  const Result r = portable_api ? driver_.mem_host_alloc(ptr, bytes, flags)
                                : driver_.mem_alloc_host(ptr, bytes);
  if (r != res::ok) {
    host_stats_.device(0).on_failure();
    return r;
  }
  host_stats_.device(0).on_alloc(bytes, clock::to_ns(clock::ticks() - t0));
  host_stats_.on_api(Api::host);
  registry_.insert(reinterpret_cast<DevPtr>(*ptr),
                   Block{bytes, native_, -1, Api::host, FreeSync::none, 0});
  return r;
}

Result Core::host_free(void* ptr) {
  Block block;
  const std::uint64_t t0 = clock::ticks();
  const bool known = registry_.erase(reinterpret_cast<DevPtr>(ptr), &block);
  const Result r = driver_.mem_free_host(ptr);
  if (known) host_stats_.device(0).on_free(block.size, clock::to_ns(clock::ticks() - t0));
  return r;
}

Result Core::admit_create(std::size_t bytes, const Location& location) {
  (void)bytes;
  (void)location;
  return res::ok;  // device budgets (oversubscription) decide here
}

void Core::on_created(MemHandle handle, std::size_t bytes, const Location& location) {
  const int device = location.type == Location::Type::device ? location.id : -1;
  created_stats_.device(device < 0 ? 0 : device).on_alloc(bytes, 0);
  created_stats_.on_api(Api::create);
  std::lock_guard lock(created_mutex_);
  created_[handle] = Created{bytes, device};
}

void Core::on_released(MemHandle handle) {
  std::lock_guard lock(created_mutex_);
  auto it = created_.find(handle);
  if (it == created_.end()) return;
  created_stats_.device(it->second.device < 0 ? 0 : it->second.device).on_free(it->second.bytes, 0);
  created_.erase(it);
}

Result Core::mem_get_info(std::size_t* free, std::size_t* total) {
  const Result r = driver_.mem_get_info(free, total);
  if (r != res::ok || !free) return r;
  // Memory the shim's pools hold but the program has freed is free to the program: report it so,
  // or frameworks that size themselves from cuMemGetInfo would see the shim's cache as used.
  const int device = current_device();
  std::size_t cached = 0;
  for (const auto& b : backends_) {
    const std::size_t reserved = b->reserved(device);
    const std::size_t live = b->stats().device(device).live_bytes();
    if (reserved > live) cached += reserved - live;
  }
  *free += cached;
  if (total && *free > *total) *free = *total;
  return r;
}

bool Core::find_block(DevPtr ptr, DevPtr* base, std::size_t* size) const {
  for (const auto& b : backends_)
    if (b->find(ptr, base, size)) return true;
  return false;
}

bool Core::lookup(DevPtr ptr, DevPtr* base, Block* block) const {
  if (registry_.find(ptr, block)) {
    *base = ptr;
    return true;
  }
  // An interior pointer: sub-allocating backends know the enclosing block.
  std::size_t size = 0;
  return find_block(ptr, base, &size) && registry_.find(*base, block);
}

Result Core::release_deferred(DevPtr ptr, const Block& block) {
  if (block.backend >= backends_.size()) return res::invalid_value;
  return backends_[block.backend]->deallocate(ptr, block, FreeRequest{});
}

void Core::on_stream_created(Stream stream, unsigned flags) {
  streams_.add(stream, flags, current_device());
}

void Core::on_stream_destroyed(Stream stream) { streams_.remove(stream); }

Result Core::enable_peer_access(Context peer, unsigned flags) {
  const Result r = driver_.ctx_enable_peer_access(peer, flags);
  if (r != res::ok && r != res::peer_access_already_enabled) return r;
  // Find the peer context's device: make it current for a moment, then restore.
  const int accessing = current_device();
  Context saved = nullptr;
  int peer_device = -1;
  if (driver_.ctx_get_current(&saved) == res::ok && driver_.ctx_set_current(peer) == res::ok) {
    driver_.ctx_get_device(&peer_device);
    driver_.ctx_set_current(saved);
  }
  if (peer_device < 0) return r;
  for (auto& b : backends_) {
    const Result e = b->enable_peer_access(accessing, peer_device);
    if (e != res::ok) return e;
  }
  return r;
}

}  // namespace allocshim
