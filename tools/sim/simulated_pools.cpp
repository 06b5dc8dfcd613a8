// The simulated device's pools, streams and events (see simulated_device.h). Work completes as it
// is submitted, so a freed block is reusable at once, on any stream.
#include "sim/simulated_device_state.h"

namespace allocshim::sim {

void SimulatedDevice::State::pool_block_freed(PoolState& p, DevPtr ptr, std::size_t length) {
  p.used -= length;
  if (p.destroyed) {
    p.reserved -= length;
    uncharge(p.device, length);
  } else {
    p.cached.emplace(length, ptr);
  }
}

void SimulatedDevice::State::trim_pool(PoolState& p, std::size_t keep) {
  for (auto it = p.cached.begin(); it != p.cached.end() && p.reserved > keep;) {
    p.reserved -= it->first;
    uncharge(p.device, it->first);
    it = p.cached.erase(it);
  }
}

void SimulatedDevice::State::apply_release_thresholds() {
  for (const auto& p : pools)
    if (p->reserved > p->release_threshold) trim_pool(*p, p->release_threshold);
}

namespace impl {
namespace {

using Lock = std::lock_guard<std::mutex>;

PoolState* pool_of(Pool handle) {
  for (const auto& p : state().pools)
    if (p.get() == handle && !p->destroyed) return p.get();
  return nullptr;
}

PoolState& default_pool(int device) {
  auto& s = state();
  PoolState*& p = s.default_pools[static_cast<std::size_t>(device)];
  if (p == nullptr) {
    s.pools.push_back(std::make_unique<PoolState>());
    p = s.pools.back().get();
    p->device = device;
  }
  return *p;
}

Result alloc_from(DevPtr* ptr, std::size_t bytes, PoolState& p) {
  auto& s = state();
  const std::size_t length = align_up(bytes == 0 ? 1 : bytes, s.config.granularity);
  if (auto hit = p.cached.find(length); hit != p.cached.end()) {
    *ptr = hit->second;
    p.cached.erase(hit);
  } else {
    // Growing the pool: a pool gives its own cached memory back before failing.
    auto fits = [&] { return p.max_size == 0 || p.reserved + length <= p.max_size; };
    if (!fits()) s.trim_pool(p, p.max_size > length ? p.max_size - length : 0);
    if (!fits()) return res::out_of_memory;
    if (!s.charge(p.device, length)) {
      s.trim_pool(p, 0);
      if (!s.charge(p.device, length)) return res::out_of_memory;
    }
    *ptr = s.take_addresses(length, 0);
    p.reserved += length;
  }
  p.used += length;
  s.blocks[*ptr] = Block{bytes, length, p.device, &p};
  return res::ok;
}

bool valid_stream(Stream stream) {
  return stream == nullptr || stream == kStreamLegacy || stream == kStreamPerThread ||
         state().streams.count(stream) != 0;
}

// Stream-ordered allocation and pools.
Result mem_alloc_async(DevPtr* ptr, std::size_t bytes, Stream stream) {
  Lock lock(state().mu);
  if (!valid_stream(stream)) return res::invalid_handle;
  return alloc_from(ptr, bytes, default_pool(state().current()));
}
Result mem_alloc_from_pool_async(DevPtr* ptr, std::size_t bytes, Pool pool, Stream stream) {
  Lock lock(state().mu);
  PoolState* p = pool_of(pool);
  if (p == nullptr || !valid_stream(stream)) return res::invalid_value;
  return alloc_from(ptr, bytes, *p);
}
Result mem_free_async(DevPtr ptr, Stream stream) {
  Lock lock(state().mu);
  if (!valid_stream(stream)) return res::invalid_handle;
  return state().free_block(ptr);
}
Result mem_pool_create(Pool* pool, const PoolSpec& spec) {
  auto& s = state();
  const bool on_device = spec.location.type == Location::Type::device;
  if (on_device && (spec.location.id < 0 || spec.location.id >= s.config.devices))
    return res::invalid_value;
  Lock lock(s.mu);
  s.pools.push_back(std::make_unique<PoolState>());
  PoolState& p = *s.pools.back();
  p.device = on_device ? spec.location.id : -1;
  p.max_size = spec.max_size;
  *pool = &p;
  return res::ok;
}
Result mem_pool_destroy(Pool pool) {
  Lock lock(state().mu);
  PoolState* p = pool_of(pool);
  if (p == nullptr) return res::invalid_value;
  for (PoolState* d : state().default_pools)
    if (d == p) return res::invalid_value;
  state().trim_pool(*p, 0);
  p->destroyed = true;
  return res::ok;
}
// Runs `fn` on a live pool under the lock.
template <typename Fn>
Result on_pool(Pool pool, Fn fn) {
  Lock lock(state().mu);
  PoolState* p = pool_of(pool);
  if (p == nullptr) return res::invalid_value;
  fn(*p);
  return res::ok;
}
Result mem_pool_set_release_threshold(Pool pool, std::uint64_t bytes) {
  return on_pool(pool, [&](PoolState& p) { p.release_threshold = bytes; });
}
Result mem_pool_trim_to(Pool pool, std::size_t keep_bytes) {
  return on_pool(pool, [&](PoolState& p) { state().trim_pool(p, keep_bytes); });
}
Result mem_pool_set_access(Pool pool, int, bool) {
  return on_pool(pool, [](PoolState&) {});
}
Result mem_pool_reserved(Pool pool, std::uint64_t* bytes) {
  return on_pool(pool, [&](PoolState& p) { *bytes = p.reserved; });
}
Result mem_pool_used(Pool pool, std::uint64_t* bytes) {
  return on_pool(pool, [&](PoolState& p) { *bytes = p.used; });
}
Result mem_pool_set_reuse(Pool pool, PoolReuse, bool) {
  return on_pool(pool, [](PoolState&) {});
}
Result mem_pool_export_to_fd(int*, Pool) { return res::not_supported; }
Result mem_pool_import_from_fd(Pool*, int) { return res::not_supported; }
Result mem_pool_export_pointer(unsigned char*, DevPtr) { return res::not_supported; }
Result mem_pool_import_pointer(DevPtr*, Pool, const unsigned char*) { return res::not_supported; }

// Streams and events: handles, counted out of one sequence.
Result new_handle(std::unordered_set<void*>& set, void** handle) {
  Lock lock(state().mu);
  *handle = reinterpret_cast<void*>(state().next_stream++);
  set.insert(*handle);
  return res::ok;
}
Result drop_handle(std::unordered_set<void*>& set, void* handle) {
  Lock lock(state().mu);
  return set.erase(handle) != 0 ? res::ok : res::invalid_handle;
}
// A synchronization: what a pool holds above its release threshold goes back.
Result synchronize(bool valid) {
  if (!valid) return res::invalid_handle;
  state().apply_release_thresholds();
  return res::ok;
}
Result stream_create(Stream* stream, unsigned) { return new_handle(state().streams, stream); }
Result stream_create_with_priority(Stream* stream, unsigned, int) {
  return new_handle(state().streams, stream);
}
Result stream_destroy(Stream stream) { return drop_handle(state().streams, stream); }
Result stream_synchronize(Stream stream) {
  Lock lock(state().mu);
  return synchronize(valid_stream(stream));
}
Result stream_query(Stream stream) {
  Lock lock(state().mu);
  return valid_stream(stream) ? res::ok : res::invalid_handle;
}
Result stream_is_capturing(Stream stream, bool* capturing) {
  *capturing = false;
  return stream_query(stream);
}
Result thread_relax_capture() { return res::ok; }  // the simulator captures nothing
Result event_query(Event event) {
  Lock lock(state().mu);
  return state().events.count(event) != 0 ? res::ok : res::invalid_handle;
}
Result stream_wait_event(Stream stream, Event event, unsigned) {
  const Result r = stream_query(stream);
  return r != res::ok ? r : event_query(event);
}
Result event_create(Event* event, unsigned) { return new_handle(state().events, event); }
Result event_record(Event event, Stream stream) { return stream_wait_event(stream, event, 0); }
Result event_synchronize(Event event) {
  Lock lock(state().mu);
  return synchronize(state().events.count(event) != 0);
}
Result event_destroy(Event event) { return drop_handle(state().events, event); }
Result event_elapsed_time(float* ms, Event start, Event end) {
  *ms = 0;
  const Result r = event_query(start);
  return r != res::ok ? r : event_query(end);
}

}  // namespace
}  // namespace impl

void fill_pool_entries(Driver& table) {
#define ALLOCSHIM_SIM_ENTRY(name) table.name = impl::name;
  ALLOCSHIM_SIM_POOL_ENTRIES(ALLOCSHIM_SIM_ENTRY)
#undef ALLOCSHIM_SIM_ENTRY
}

}  // namespace allocshim::sim
