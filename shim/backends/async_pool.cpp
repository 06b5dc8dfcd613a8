#include "backends/async_pool.h"

#include <array>
#include <memory>
#include <mutex>

#include "backends/free_sync.h"
#include "backends/request.h"
#include "base/clock.h"
#include "base/scoped_context.h"

namespace allocshim {
namespace {

class AsyncPoolBackend final : public Backend {
 public:
  AsyncPoolBackend(const policy::BackendSpec& spec, const Driver& driver, StreamTracker& streams)
      : Backend(spec.name, BackendKind::async_pool, driver, Timing::sampled),
        spec_(spec),
        streams_(streams) {}
  ~AsyncPoolBackend() override;

  Result trim(int device) override;
  std::size_t reserved(int device) const override;
  Result enable_peer_access(int accessing_device, int peer_device) override;
  bool drop_context(int device, Context ctx, bool alive) override;
  void context_synchronized(int device, std::uint64_t sync) override;
  void close_epochs(int device, Stream dying) override;

  Pool ipc_pool(int device) const override {
    const DeviceState* s = devices_.at(device);
    if (s == nullptr) return nullptr;
    std::lock_guard lock(s->mutex);
    return s->ready ? s->pool : nullptr;
  }

 private:
  struct DeviceState {
    mutable std::mutex mutex;
    bool ready = false;
    Context ctx = nullptr;  // the context the pool's stream lives in
    Pool pool = nullptr;
    Stream stream = nullptr;     // internal, non-blocking: nothing of the program's is ever on it
    std::uint64_t reserved = 0;  // the pool's RESERVED_MEM_CURRENT as last seen
    std::uint64_t peers = 0;     // devices granted access (bit per device), also before `ready`
    std::unique_ptr<DeferredFrees> deferred;
  };

  Result do_allocate(const AllocRequest& req, FreeSync sync, DevPtr* out,
                     std::uint64_t* cookie) override;
  Result do_deallocate(DevPtr ptr, const Block& block, const FreeRequest& req) override;

  Result init(DeviceState& s, int device);
  // Issues the real free of a block whose wait (if any) is over.
  Result release(DeviceState& s, DevPtr ptr) { return driver().mem_free_async(ptr, s.stream); }
  // Memory is short: wait for pending frees, then give the pool's unused memory back.
  void reclaim(DeviceState& s);
  // Reads the pool's reserved size; true if it grew since last seen.
  bool refresh_reserved(DeviceState& s, int device);

  policy::BackendSpec spec_;
  StreamTracker& streams_;
  PerDevice<DeviceState> devices_;
};

AsyncPoolBackend::~AsyncPoolBackend() {
  // Errors are ignored throughout: at process exit the driver may already be torn down.
  for (DeviceState& s : devices_) {
    std::lock_guard lock(s.mutex);
    if (!s.ready) continue;
    ScopedContext ctx(driver(), s.ctx);
    s.deferred->drain([&](const PendingFree& f) { release(s, f.ptr); });
    s.deferred.reset();
    driver().stream_synchronize(s.stream);
    driver().stream_destroy(s.stream);
    // With blocks still outstanding the driver defers the destruction until they are freed.
    driver().mem_pool_destroy(s.pool);
    s.ready = false;
  }
}

Result AsyncPoolBackend::init(DeviceState& s, int device) {
  const Driver& d = driver();
  int supported = 0;
  Result r = d.device_get_attribute(&supported, DevAttr::pools_supported, device);
  if (r != res::ok) return r;
  if (supported == 0) return res::not_supported;
  r = d.ctx_get_current(&s.ctx);
  if (r != res::ok) return r;
  PoolSpec ps;
  ps.location = Location{Location::Type::device, device};
  // Exportable (cudaIpcGetMemHandle, docs/ipc.md) wherever the device allows it, unless the policy
  // says `ipc = false`: the cost is measured in docs/ipc.md.
  int posix_fd = 0;
  ps.posix_fd = spec_.ipc.value_or(
      d.device_get_attribute(&posix_fd, DevAttr::posix_fd_supported, device) == res::ok &&
      posix_fd != 0);
  r = d.mem_pool_create(&s.pool, ps);
  if (r != res::ok) return r;
  std::uint64_t threshold = spec_.release_threshold;  // kUnlimited is the driver's "keep all" too
  if (threshold < spec_.initial) threshold = spec_.initial;
  r = d.mem_pool_set_release_threshold(s.pool, threshold);
  if (r == res::ok && d.mem_pool_set_reuse != nullptr) {
    r = d.mem_pool_set_reuse(s.pool, PoolReuse::allow_internal_dependencies, false);
    if (r == res::ok) r = d.mem_pool_set_reuse(s.pool, PoolReuse::follow_event_dependencies, true);
    if (r == res::ok) r = d.mem_pool_set_reuse(s.pool, PoolReuse::allow_opportunistic, true);
  }
  // Non-blocking, or the internal stream would be ordered behind the program's legacy-stream work.
  if (r == res::ok) r = d.stream_create(&s.stream, kStreamNonBlocking);
  if (r != res::ok) {
    d.mem_pool_destroy(s.pool);
    return r;
  }
  for (int peer = 0; peer < static_cast<int>(kMaxDevices); ++peer)
    if ((s.peers >> peer & 1) != 0) d.mem_pool_set_access(s.pool, peer, true);
  if (spec_.initial > 0) {
    // Reserve up front: allocate and free once, and let the threshold keep it.
    DevPtr p = 0;
    if (d.mem_alloc_from_pool_async(&p, spec_.initial, s.pool, s.stream) == res::ok)
      d.mem_free_async(p, s.stream);
    d.stream_synchronize(s.stream);
  }
  s.deferred = std::make_unique<DeferredFrees>(d, &streams_, device, s.ctx,
                                               &mutable_stats().device(device).sync());
  s.ready = true;
  refresh_reserved(s, device);
  return res::ok;
}

bool AsyncPoolBackend::refresh_reserved(DeviceState& s, int device) {
  std::uint64_t now = 0;
  if (driver().mem_pool_reserved(s.pool, &now) != res::ok) return false;
  const bool grew = now > s.reserved;
  s.reserved = now;
  mutable_stats().device(device).set_reserved(now);
  return grew;
}

void AsyncPoolBackend::reclaim(DeviceState& s) {
  const Driver& d = driver();
  s.deferred->drain([&](const PendingFree& f) { release(s, f.ptr); });
  // The frees must have completed on the stream before the pool can give their memory back.
  d.stream_synchronize(s.stream);
  d.mem_pool_trim_to(s.pool, 0);
}

Result AsyncPoolBackend::do_allocate(const AllocRequest& req, FreeSync sync, DevPtr* out,
                                     std::uint64_t* cookie) {
  (void)sync;  // decides what the free waits for, not how memory is obtained
  DeviceState* s = devices_.at(req.device);
  if (s == nullptr) return res::invalid_device;
  std::size_t size = 0;
  if (const Result r = request_bytes(req, &size); r != res::ok) return r;  // what the driver says
  std::lock_guard lock(s->mutex);
  if (!s->ready) {
    const Result r = init(*s, req.device);
    if (r != res::ok) return r;
  }
  auto released = [&](const PendingFree& f) { release(*s, f.ptr); };
  // cuMemAllocFromPoolAsync names the program's own pool (its attributes, its IPC export): keep it.
  const Pool pool = req.pool != nullptr ? req.pool : s->pool;
  if (!s->deferred->empty()) {
    const std::uint64_t now = clock::ticks();
    s->deferred->close_if_due(now, released);
    // The pool grows rather than say it is short, so it is asked what it holds free first: if
    // not this request, that is a shortage, as in vmm (close_at_shortage), and every pending free
    // whose wait is over goes back to it. Asked only while frees wait: one attribute read.
    std::uint64_t used = 0;
    if (pool == s->pool && driver().mem_pool_used(s->pool, &used) == res::ok &&
        s->reserved < used + size) {
      s->deferred->close_at_shortage(now, released);
      s->deferred->poll(~std::size_t{0}, released);
    } else {
      s->deferred->poll(kPollBudget, released);
    }
  }

  const bool ordered = req.api == Api::async;
  const Stream stream = ordered ? req.stream : s->stream;
  Result r = driver().mem_alloc_from_pool_async(out, size, pool, stream);
  if (r == res::out_of_memory) {
    reclaim(*s);
    r = driver().mem_alloc_from_pool_async(out, size, pool, stream);
  }
  if (r != res::ok) {
    refresh_reserved(*s, req.device);
    return r;
  }
  DeviceStats& stats = mutable_stats().device(req.device);
  if (refresh_reserved(*s, req.device)) {
    stats.on_miss();
    // The pool had to grow after all (fragmentation, or a program's pool): the same shortage.
    // Closing whenever no earlier epoch is in flight would close one at nearly every allocation
    // under load, and each close is a barrier across the blocking streams (sync_bench.sh).
    s->deferred->close_at_shortage(clock::ticks(), released);
    // Fresh memory was mapped for this request: make sure it is in place before any stream of
    // the program touches it. Only on growth; a reused block needs no wait (see the header).
    if (!ordered) driver().stream_synchronize(s->stream);
  } else {
    stats.on_hit();
  }
  *cookie = 0;
  return res::ok;
}

Result AsyncPoolBackend::do_deallocate(DevPtr ptr, const Block& block, const FreeRequest& req) {
  DeviceState* s = devices_.at(block.device);
  if (s == nullptr) return res::invalid_value;
  if (req.async) {
    // The program's stream-ordered free: the pool's stream semantics are exactly what it asked for.
    return driver().mem_free_async(ptr, req.stream);
  }
  // The pool's stream and events belong to the block's device's context, whatever the caller's.
  Context ctx = nullptr;
  {
    std::lock_guard lock(s->mutex);
    if (!s->ready) return res::invalid_value;
    ctx = s->ctx;
  }
  ScopedContext scope(driver(), ctx);
  // Before taking the lock: other threads keep allocating while this one waits. An error means the
  // context is unusable (teardown at exit); the free is still handed to the driver.
  if (block.free_sync == FreeSync::device) driver().ctx_synchronize();
  std::lock_guard lock(s->mutex);
  if (block.free_sync == FreeSync::barrier) {
    auto released = [&](const PendingFree& p) { release(*s, p.ptr); };
    const std::uint64_t now = clock::ticks();
    s->deferred->defer_barrier(PendingFree{ptr, block.size, 0}, now);
    s->deferred->close_if_due(now, released);
    s->deferred->poll(kPollBudget, released);
    return res::ok;
  }
  return release(*s, ptr);
}

Result AsyncPoolBackend::trim(int device) {
  for (int d = 0; d < static_cast<int>(kMaxDevices); ++d) {
    if (device >= 0 && d != device) continue;
    DeviceState& s = devices_[static_cast<std::size_t>(d)];
    std::lock_guard lock(s.mutex);
    if (!s.ready) continue;
    ScopedContext scope(driver(), s.ctx);
    auto released = [&](const PendingFree& f) { release(s, f.ptr); };
    s.deferred->close(released);
    s.deferred->poll(~std::size_t{0}, released);
    driver().stream_synchronize(s.stream);
    driver().mem_pool_trim_to(s.pool, 0);
    refresh_reserved(s, d);
  }
  return res::ok;
}

std::size_t AsyncPoolBackend::reserved(int device) const {
  const DeviceState* s = devices_.at(device);
  if (s == nullptr) return 0;
  std::lock_guard lock(s->mutex);
  if (!s->ready) return 0;
  // Asked fresh: the pool also shrinks by itself at synchronization points (release threshold).
  std::uint64_t now = 0;
  return driver().mem_pool_reserved(s->pool, &now) == res::ok ? now : s->reserved;
}

Result AsyncPoolBackend::enable_peer_access(int accessing_device, int peer_device) {
  DeviceState* s = devices_.at(peer_device);
  if (s == nullptr || accessing_device < 0 ||
      static_cast<std::size_t>(accessing_device) >= kMaxDevices)
    return res::invalid_device;
  std::lock_guard lock(s->mutex);
  s->peers |= std::uint64_t{1} << accessing_device;
  // Before the pool exists, init() grants the access when it creates it.
  return s->ready ? driver().mem_pool_set_access(s->pool, accessing_device, true) : res::ok;
}

bool AsyncPoolBackend::drop_context(int device, Context ctx, bool alive) {
  DeviceState* s = devices_.at(device);
  if (s == nullptr) return false;
  std::lock_guard lock(s->mutex);
  if (!s->ready || !in_context(s->ctx, ctx)) return false;
  if (alive) {
    // Destroyed here, before the context goes, so that nothing of the shim's is left dangling. The
    // blocks of pending frees are not released: the pool goes with all its blocks.
    ScopedContext scope(driver(), s->ctx);
    s->deferred.reset();
    driver().stream_destroy(s->stream);
    driver().mem_pool_destroy(s->pool);
  } else {
    s->deferred->abandon();  // its events died with the context
    s->deferred.reset();
  }
  s->ready = false;
  s->ctx = nullptr;
  s->pool = nullptr;
  s->stream = nullptr;
  s->reserved = 0;
  s->peers = 0;  // the reset disables peer access too: the program enables it again
  mutable_stats().device(device).set_reserved(0);
  return true;
}

void AsyncPoolBackend::context_synchronized(int device, std::uint64_t sync) {
  DeviceState* s = devices_.at(device);
  if (s == nullptr) return;
  std::lock_guard lock(s->mutex);
  if (!s->ready || s->deferred->empty()) return;
  ScopedContext scope(driver(), s->ctx);
  s->deferred->context_synchronized(sync, [&](const PendingFree& f) { release(*s, f.ptr); });
}

void AsyncPoolBackend::close_epochs(int device, Stream dying) {
  DeviceState* s = devices_.at(device);
  if (s == nullptr) return;
  std::lock_guard lock(s->mutex);
  if (!s->ready) return;
  ScopedContext scope(driver(), s->ctx);
  s->deferred->close([&](const PendingFree& f) { release(*s, f.ptr); }, dying);
}

}  // namespace

std::unique_ptr<Backend> make_async_pool_backend(const policy::BackendSpec& spec,
                                                 const Driver& driver, StreamTracker& streams,
                                                 std::string& error) {
  if (driver.mem_pool_create == nullptr || driver.mem_alloc_from_pool_async == nullptr) {
    error = "the driver has no memory pools (CUDA 11.2 or newer is needed)";
    return nullptr;
  }
  return std::make_unique<AsyncPoolBackend>(spec, driver, streams);
}

}  // namespace allocshim
