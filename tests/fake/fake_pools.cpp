// Stream-ordered allocation from memory pools. A pool's blocks are slices of one memfd (its arena),
// so an exportable pool can be shared by fd and its pointers mapped again by an importer.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "fake_state.h"

namespace allocshim::fake {
namespace detail {
namespace {

// cuMemPoolExportPointer's payload: where the block lives in the pool's arena.
struct PoolPtrPayload {
  char magic[8];
  std::uint64_t offset;
  std::uint64_t length;
  std::uint64_t size;
};
static_assert(sizeof(PoolPtrPayload) <= kIpcHandleBytes);
constexpr char kPoolPtrMagic[8] = "FAKEPTR";

std::unique_ptr<PoolState> make_pool(State& s, const PoolSpec& spec) {
  auto p = std::make_unique<PoolState>();
  p->spec = spec;
  p->id = s.next_id++;
  p->arena_fd = memfd_create("allocshim-fake-pool", MFD_CLOEXEC);
  if (p->arena_fd < 0) return nullptr;
  return p;
}

bool reusable(const CachedBlock& b, const StreamState& on) {
  return b.stream == &on || b.stream->done(b.ticket);
}

Result alloc_from(State& s, DevPtr* ptr, std::size_t bytes, PoolState& p, StreamState& st) {
  if (p.imported || p.destroyed) return res::invalid_value;
  const std::size_t length = align_up(bytes, s.config.granularity);
  const int device = s.pool_device(p);
  Alloc a;
  a.kind = AllocKind::pool;
  a.size = bytes;
  a.length = length;
  a.device = device < 0 ? std::max(0, s.current_device()) : device;
  a.pool = &p;
  auto hit = std::find_if(p.cached.begin(), p.cached.end(), [&](const CachedBlock& b) {
    return b.length == length && reusable(b, st);
  });
  if (hit != p.cached.end()) {
    const DevPtr at = hit->ptr;
    a.pool_offset = hit->offset;
    p.cached.erase(hit);
    p.used += length;
    a.buffer_id = s.next_id++;
    s.allocs.emplace(at, a);
    st.submit();
    *ptr = at;
    return res::ok;
  }
  // Growing the pool: a real pool gives its own unused cached memory back before failing.
  auto fits = [&] { return p.spec.max_size == 0 || p.reserved + length <= p.spec.max_size; };
  if (!fits()) s.trim_pool(p, p.spec.max_size > length ? p.spec.max_size - length : 0);
  if (!fits()) return res::out_of_memory;
  if (!s.charge(device, length)) {
    s.trim_pool(p, 0);
    if (!s.charge(device, length)) return res::out_of_memory;
  }
  const std::size_t offset = p.arena_end;
  void* m = MAP_FAILED;
  if (ftruncate(p.arena_fd, static_cast<off_t>(offset + length)) == 0)
    m = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, p.arena_fd,
             static_cast<off_t>(offset));
  if (m == MAP_FAILED) {
    s.uncharge(device, length);
    return res::out_of_memory;
  }
  p.arena_end = offset + length;
  p.reserved += length;
  p.used += length;
  a.pool_offset = offset;
  a.buffer_id = s.next_id++;
  const auto at = reinterpret_cast<DevPtr>(m);
  s.allocs.emplace(at, a);
  st.submit();
  *ptr = at;
  return res::ok;
}

// Runs `f` on the pool `pool` names, under the state's lock; invalid_value if it names none.
template <class F>
Result on_pool(State& s, Pool pool, F f) {
  std::lock_guard lock(s.mu);
  PoolState* p = s.pool(pool);
  if (p == nullptr) return res::invalid_value;
  f(*p);
  return res::ok;
}

}  // namespace

PoolState* State::pool(Pool handle) {
  auto it = pools.find(handle);
  if (it != pools.end()) return it->second.get();
  for (const auto& p : default_pools)
    if (p.get() == handle && handle != nullptr) return p.get();
  stale(handle);
  return nullptr;
}

PoolState& State::default_pool(int device) {
  auto& p = default_pools[static_cast<std::size_t>(device)];
  if (!p) {
    PoolSpec spec;
    spec.location = {Location::Type::device, device};
    p = make_pool(*this, spec);
    p->is_default = true;
  }
  return *p;
}

int State::pool_device(const PoolState& p) const {
  return p.spec.location.type == Location::Type::device ? p.spec.location.id : -1;
}

void State::release_block(PoolState& p, const CachedBlock& b) {
  munmap(reinterpret_cast<void*>(b.ptr), b.length);
  fallocate(p.arena_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(b.offset),
            static_cast<off_t>(b.length));
  p.reserved -= b.length;
  uncharge(pool_device(p), b.length);
}

void State::trim_pool(PoolState& p, std::size_t keep) {
  for (auto it = p.cached.begin(); it != p.cached.end() && p.reserved > keep;) {
    if (it->stream->done(it->ticket)) {
      release_block(p, *it);
      it = p.cached.erase(it);
    } else {
      ++it;
    }
  }
}

void State::apply_release_thresholds() {
  for (auto& [h, p] : pools)
    if (p->reserved > p->release_threshold) trim_pool(*p, p->release_threshold);
  for (auto& p : default_pools)
    if (p && p->reserved > p->release_threshold) trim_pool(*p, p->release_threshold);
}

Result State::free_pool_block(DevPtr ptr, StreamState& stream) {
  auto it = allocs.find(ptr);
  if (it == allocs.end()) return res::invalid_value;
  Alloc& a = it->second;
  if (a.kind == AllocKind::pool_import) {
    unmap(ptr, a.length);
    allocs.erase(it);
    return res::ok;
  }
  PoolState& p = *a.pool;
  const CachedBlock b{ptr, a.length, a.pool_offset, &stream, stream.submit()};
  p.used -= a.length;
  allocs.erase(it);
  if (p.destroyed)
    release_block(p, b);
  else
    p.cached.push_back(b);
  return res::ok;
}

namespace impl {

Result mem_alloc_async(DevPtr* ptr, std::size_t bytes, Stream stream) {
  FAKE_ENTRY(mem_alloc_async);
  if (ptr == nullptr || bytes == 0) return res::invalid_value;
  std::lock_guard lock(s.mu);
  StreamState* st = s.stream(stream);
  if (st == nullptr) return res::invalid_handle;
  return alloc_from(s, ptr, bytes, s.default_pool(st->device), *st);
}

Result mem_alloc_from_pool_async(DevPtr* ptr, std::size_t bytes, Pool pool, Stream stream) {
  FAKE_ENTRY(mem_alloc_from_pool_async);
  if (ptr == nullptr || bytes == 0) return res::invalid_value;
  std::lock_guard lock(s.mu);
  StreamState* st = s.stream(stream);
  PoolState* p = s.pool(pool);
  if (st == nullptr) return res::invalid_handle;
  if (p == nullptr) return res::invalid_value;
  return alloc_from(s, ptr, bytes, *p, *st);
}

Result mem_free_async(DevPtr ptr, Stream stream) {
  FAKE_ENTRY(mem_free_async);
  std::lock_guard lock(s.mu);
  StreamState* st = s.stream(stream);
  if (st == nullptr) return res::invalid_handle;
  auto it = s.allocs.find(ptr);
  if (it == s.allocs.end()) return res::invalid_value;
  const Alloc& a = it->second;
  if (a.kind == AllocKind::pool || a.kind == AllocKind::pool_import)
    return s.free_pool_block(ptr, *st);
  if (a.kind != AllocKind::device) return res::invalid_value;
  // cuMemAlloc memory freed in stream order: the fake frees it as cuMemFree would.
  s.complete_device(a.device);
  s.uncharge(a.device, a.counted);
  s.unmap(ptr, a.length);
  s.allocs.erase(it);
  return res::ok;
}

Result mem_pool_create(Pool* pool, const PoolSpec& spec) {
  FAKE_ENTRY(mem_pool_create);
  if (pool == nullptr) return res::invalid_value;
  if (spec.location.type == Location::Type::device && !s.valid_device(spec.location.id))
    return res::invalid_device;
  if (spec.location.type != Location::Type::device &&
      s.config.attributes[static_cast<int>(DevAttr::host_numa_pools)] == 0)
    return res::not_supported;
  std::lock_guard lock(s.mu);
  auto p = make_pool(s, spec);
  if (!p) return res::out_of_memory;
  *pool = p.get();
  s.pools.emplace(p.get(), std::move(p));
  return res::ok;
}

Result mem_pool_destroy(Pool pool) {
  FAKE_ENTRY(mem_pool_destroy);
  std::lock_guard lock(s.mu);
  auto it = s.pools.find(pool);
  if (it == s.pools.end()) {
    s.stale(pool);
    return res::invalid_value;  // unknown, or a device's default pool
  }
  PoolState& p = *it->second;
  // Cached blocks go back at once; live ones when they are freed (as the driver documents).
  for (const CachedBlock& b : p.cached) s.release_block(p, b);
  p.cached.clear();
  p.destroyed = true;
  s.dead_pools.push_back(std::move(it->second));
  s.pools.erase(it);
  return res::ok;
}

Result mem_pool_set_release_threshold(Pool pool, std::uint64_t bytes) {
  FAKE_ENTRY(mem_pool_set_release_threshold);
  return on_pool(s, pool, [&](PoolState& p) { p.release_threshold = bytes; });
}

Result mem_pool_trim_to(Pool pool, std::size_t keep_bytes) {
  FAKE_ENTRY(mem_pool_trim_to);
  return on_pool(s, pool, [&](PoolState& p) { s.trim_pool(p, keep_bytes); });
}

// read_write false revokes access: pools do not support read-only access.
Result mem_pool_set_access(Pool pool, int device, bool read_write) {
  FAKE_ENTRY(mem_pool_set_access);
  if (!s.valid_device(device)) return res::invalid_device;
  const std::uint64_t bit = std::uint64_t{1} << device;
  return on_pool(s, pool, [&](PoolState& p) {
    if (read_write) {
      p.read_access |= bit;
      p.write_access |= bit;
    } else {
      p.read_access &= ~bit;
      p.write_access &= ~bit;
    }
  });
}

Result mem_pool_reserved(Pool pool, std::uint64_t* bytes) {
  FAKE_ENTRY(mem_pool_reserved);
  if (bytes == nullptr) return res::invalid_value;
  return on_pool(s, pool, [&](const PoolState& p) { *bytes = p.reserved; });
}

Result mem_pool_used(Pool pool, std::uint64_t* bytes) {
  FAKE_ENTRY(mem_pool_used);
  if (bytes == nullptr) return res::invalid_value;
  return on_pool(s, pool, [&](const PoolState& p) { *bytes = p.used; });
}

Result mem_pool_set_reuse(Pool pool, PoolReuse which, bool enabled) {
  FAKE_ENTRY(mem_pool_set_reuse);
  const auto i = static_cast<std::size_t>(which);
  if (i >= std::size(PoolState{}.reuse)) return res::invalid_value;
  std::lock_guard lock(s.mu);
  PoolState* p = s.pool(pool);
  if (p == nullptr) return res::invalid_value;
  p->reuse[i] = enabled;
  return res::ok;
}

Result mem_pool_export_to_fd(int* fd, Pool pool) {
  FAKE_ENTRY(mem_pool_export_to_fd);
  if (fd == nullptr) return res::invalid_value;
  std::lock_guard lock(s.mu);
  PoolState* p = s.pool(pool);
  if (p == nullptr || !p->spec.posix_fd) return res::invalid_value;
  *fd = dup(p->arena_fd);
  if (*fd < 0) return res::unknown;
  p->shared = true;
  return res::ok;
}

Result mem_pool_import_from_fd(Pool* pool, int fd) {
  FAKE_ENTRY(mem_pool_import_from_fd);
  if (pool == nullptr || fd < 0) return res::invalid_value;
  std::lock_guard lock(s.mu);
  auto p = std::make_unique<PoolState>();
  p->imported = true;
  p->spec.posix_fd = true;
  p->id = s.next_id++;
  p->arena_fd = dup(fd);  // the caller keeps its fd, as with the real driver
  if (p->arena_fd < 0) return res::invalid_value;
  *pool = p.get();
  s.pools.emplace(p.get(), std::move(p));
  return res::ok;
}

Result mem_pool_export_pointer(unsigned char out[kIpcHandleBytes], DevPtr ptr) {
  FAKE_ENTRY(mem_pool_export_pointer);
  if (out == nullptr) return res::invalid_value;
  std::lock_guard lock(s.mu);
  auto it = s.allocs.find(ptr);
  if (it == s.allocs.end() || it->second.kind != AllocKind::pool ||
      !it->second.pool->spec.posix_fd || !it->second.pool->shared)
    return res::invalid_value;
  PoolPtrPayload p{};
  std::memcpy(p.magic, kPoolPtrMagic, sizeof(p.magic));
  p.offset = it->second.pool_offset;
  p.length = it->second.length;
  p.size = it->second.size;
  std::memset(out, 0, kIpcHandleBytes);
  std::memcpy(out, &p, sizeof(p));
  return res::ok;
}

Result mem_pool_import_pointer(DevPtr* ptr, Pool pool, const unsigned char data[kIpcHandleBytes]) {
  FAKE_ENTRY(mem_pool_import_pointer);
  if (ptr == nullptr || data == nullptr) return res::invalid_value;
  PoolPtrPayload p;
  std::memcpy(&p, data, sizeof(p));
  if (std::memcmp(p.magic, kPoolPtrMagic, sizeof(p.magic)) != 0) return res::invalid_value;
  std::lock_guard lock(s.mu);
  PoolState* pool_state = s.pool(pool);
  if (pool_state == nullptr || !pool_state->imported) return res::invalid_value;
  void* m = mmap(nullptr, p.length, PROT_READ | PROT_WRITE, MAP_SHARED, pool_state->arena_fd,
                 static_cast<off_t>(p.offset));
  if (m == MAP_FAILED) return res::invalid_value;
  Alloc a;
  a.kind = AllocKind::pool_import;
  a.size = p.size;
  a.length = p.length;
  a.device = std::max(0, s.current_device());
  a.pool = pool_state;
  a.pool_offset = p.offset;
  a.buffer_id = s.next_id++;
  *ptr = reinterpret_cast<DevPtr>(m);
  s.allocs.emplace(*ptr, a);
  return res::ok;
}

}  // namespace impl
}  // namespace detail

// ---- Test queries -----------------------------------------------------------------------------

Pool FakeDriver::default_pool(int device) const {
  std::lock_guard lock(state_->mu);
  if (!state_->valid_device(device)) return nullptr;
  return &state_->default_pool(device);
}

std::size_t FakeDriver::live_pools() const {
  std::lock_guard lock(state_->mu);
  return state_->pools.size();
}

std::uint64_t FakeDriver::pool_reserved(Pool pool) const {
  std::lock_guard lock(state_->mu);
  const detail::PoolState* p = state_->pool(pool);
  return p == nullptr ? 0 : p->reserved;
}

std::uint64_t FakeDriver::pool_used(Pool pool) const {
  std::lock_guard lock(state_->mu);
  const detail::PoolState* p = state_->pool(pool);
  return p == nullptr ? 0 : p->used;
}

std::uint64_t FakeDriver::pool_release_threshold(Pool pool) const {
  std::lock_guard lock(state_->mu);
  const detail::PoolState* p = state_->pool(pool);
  return p == nullptr ? 0 : p->release_threshold;
}

bool FakeDriver::pool_access(Pool pool, int device) const {
  std::lock_guard lock(state_->mu);
  const detail::PoolState* p = state_->pool(pool);
  if (p == nullptr || !state_->valid_device(device)) return false;
  // A device always accesses its own pool's memory.
  if (state_->pool_device(*p) == device) return true;
  return (p->write_access >> device) & 1;
}

bool FakeDriver::pool_reuse(Pool pool, PoolReuse which) const {
  std::lock_guard lock(state_->mu);
  const detail::PoolState* p = state_->pool(pool);
  const auto i = static_cast<std::size_t>(which);
  return p != nullptr && i < std::size(p->reuse) && p->reuse[i];
}

}  // namespace allocshim::fake
