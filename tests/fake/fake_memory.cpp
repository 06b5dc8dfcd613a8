// Classic allocations (cuMemAlloc, pitch, managed, pinned host), pointer queries and native IPC.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include <cuda.h>

#include "fake_state.h"

namespace allocshim::fake::detail {
namespace {

// What the fake knows about an address, for cuMemGetAddressRange and the pointer attributes.
struct PtrInfo {
  bool known = false;
  DevPtr ptr = 0;
  CUmemorytype type = CU_MEMORYTYPE_DEVICE;
  int device = 0;
  DevPtr base = 0;
  std::size_t size = 0;
  bool managed = false;
  bool legacy_ipc = false;  // a whole cuMemAlloc allocation
  std::uint64_t buffer_id = 0;
  Pool pool = nullptr;
  std::uint64_t access_flags = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
};

PtrInfo describe(State& s, DevPtr ptr) {
  PtrInfo info;
  info.ptr = ptr;
  DevPtr base = 0;
  if (const Alloc* a = s.find_alloc(ptr, &base)) {
    info.known = true;
    info.base = base;
    info.size = a->size;
    info.buffer_id = a->buffer_id;
    info.device = a->device < 0 ? std::max(0, s.current_device()) : a->device;
    info.managed = a->kind == AllocKind::managed;
    info.type = a->kind == AllocKind::host      ? CU_MEMORYTYPE_HOST
                : a->kind == AllocKind::managed ? CU_MEMORYTYPE_UNIFIED
                                                : CU_MEMORYTYPE_DEVICE;
    info.legacy_ipc = a->kind == AllocKind::device;
    info.pool = a->pool;
    return info;
  }
  if (const Mapping* m = s.find_mapping(ptr, &base)) {
    const PhysState& p = s.phys.at(m->handle);
    info.known = true;
    info.base = base;
    info.size = m->size;
    info.buffer_id = p.block_id;
    const bool on_device = p.location.type == Location::Type::device;
    info.type = on_device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    info.device = on_device ? p.location.id : std::max(0, s.current_device());
    const Access& acc = m->access[(ptr - base) / s.config.granularity];
    const std::uint64_t bit = std::uint64_t{1} << std::max(0, s.current_device());
    info.access_flags = (acc.write & bit)  ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
                        : (acc.read & bit) ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ
                                           : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
  }
  return info;
}

// The attributes the fake answers, with the size of the value each one writes (cuda.h documents
// the types; booleans are written as unsigned int, as callers commonly pass one).
struct AttrInfo {
  int attribute;
  std::size_t bytes;
};
constexpr AttrInfo kAttributes[] = {
    {CU_POINTER_ATTRIBUTE_CONTEXT, sizeof(CUcontext)},
    {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, sizeof(unsigned int)},
    {CU_POINTER_ATTRIBUTE_DEVICE_POINTER, sizeof(CUdeviceptr)},
    {CU_POINTER_ATTRIBUTE_HOST_POINTER, sizeof(void*)},
    {CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, sizeof(unsigned int)},
    {CU_POINTER_ATTRIBUTE_BUFFER_ID, sizeof(unsigned long long)},
    {CU_POINTER_ATTRIBUTE_IS_MANAGED, sizeof(unsigned int)},
    {CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, sizeof(int)},
    {CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, sizeof(unsigned int)},
    {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, sizeof(CUdeviceptr)},
    {CU_POINTER_ATTRIBUTE_RANGE_SIZE, sizeof(std::size_t)},
    {CU_POINTER_ATTRIBUTE_MAPPED, sizeof(unsigned int)},
    {CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, sizeof(unsigned int)},
    {CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, sizeof(CUmemoryPool)},
    {CU_POINTER_ATTRIBUTE_MAPPING_SIZE, sizeof(std::size_t)},
    {CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, sizeof(CUdeviceptr)},
    {CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, sizeof(unsigned long long)},
};

const AttrInfo* attr_info(int attribute) {
  for (const AttrInfo& a : kAttributes)
    if (a.attribute == attribute) return &a;
  return nullptr;
}

// Writes attribute `attribute` of `info` to `data`. Unknown pointers get the null values
// cuPointerGetAttributes documents.
void write_attribute(State& s, const PtrInfo& info, const AttrInfo& a, void* data) {
  std::uint64_t v = 0;  // every attribute fits 8 bytes; the low `a.bytes` are written
  switch (a.attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      v = info.known ? reinterpret_cast<std::uintptr_t>(s.contexts[info.device].get()) : 0;
      break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: v = info.known ? info.type : 0; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:  // unified addressing: one address for both
      v = info.known ? info.ptr : 0;
      break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: v = 0; break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: v = info.buffer_id; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: v = info.managed; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      v = static_cast<std::uint32_t>(info.known ? info.device : -2);
      break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: v = info.legacy_ipc; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: v = info.base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: v = info.size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: v = info.known; break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: v = info.known ? info.access_flags : 0; break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      v = reinterpret_cast<std::uintptr_t>(info.pool);
      break;
    default: break;
  }
  std::memcpy(data, &v, a.bytes);  // x86-64 is little-endian: the low bytes come first
}

// The handle of cuIpcGetMemHandle: enough to find the allocation again in this process or in a
// child forked after the allocation (which shares its MAP_SHARED pages).
struct IpcPayload {
  char magic[8];
  std::uint64_t base;
  std::uint64_t size;
  std::uint64_t buffer_id;
  std::int32_t device;
};
static_assert(sizeof(IpcPayload) <= kIpcHandleBytes);
constexpr char kIpcMagic[8] = "FAKEIPC";

Result alloc_device(State& s, DevPtr* ptr, std::size_t bytes, std::size_t pitch) {
  const int d = s.current_device();
  if (d < 0) return res::invalid_context;
  std::lock_guard lock(s.mu);
  const std::size_t counted = align_up(bytes, kAllocAlign);
  if (!s.charge(d, counted)) return res::out_of_memory;
  Alloc a;
  a.kind = AllocKind::device;
  a.size = bytes;
  a.length = align_up(bytes, kPageBytes);
  a.device = d;
  a.counted = counted;
  a.pitch = pitch;
  DevPtr p = 0;
  if (Result r = s.map_new(a.length, &p)) {
    s.uncharge(d, counted);
    return r;
  }
  a.buffer_id = s.next_id++;
  s.allocs.emplace(p, a);
  *ptr = p;
  return res::ok;
}

Result alloc_host_kind(State& s, void** ptr, std::size_t bytes, AllocKind kind, unsigned flags) {
  (void)flags;
  std::lock_guard lock(s.mu);
  Alloc a;
  a.kind = kind;
  a.size = bytes;
  a.length = align_up(bytes, kPageBytes);
  a.device = kind == AllocKind::host ? -1 : std::max(0, s.current_device());
  if (kind == AllocKind::host) {
    if (!s.charge(-1, a.length)) return res::out_of_memory;
    a.counted = a.length;
  }
  DevPtr p = 0;
  if (Result r = s.map_new(a.length, &p)) {
    if (kind == AllocKind::host) s.uncharge(-1, a.length);
    return r;
  }
  if (kind == AllocKind::managed) s.managed_used += a.length;
  a.buffer_id = s.next_id++;
  s.allocs.emplace(p, a);
  *ptr = reinterpret_cast<void*>(p);
  return res::ok;
}

// Managed-memory calls must name memory inside one managed allocation.
bool in_managed(State& s, DevPtr ptr, std::size_t bytes) {
  DevPtr base = 0;
  const Alloc* a = s.find_alloc(ptr, &base);
  return a != nullptr && a->kind == AllocKind::managed && bytes <= base + a->size - ptr;
}

}  // namespace

const Alloc* State::find_alloc(DevPtr ptr, DevPtr* base) const {
  auto it = allocs.upper_bound(ptr);
  if (it == allocs.begin()) return nullptr;
  --it;
  if (ptr - it->first >= std::max<std::size_t>(it->second.size, 1)) return nullptr;
  *base = it->first;
  return &it->second;
}

Result State::map_new(std::size_t length, DevPtr* out) {
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return res::out_of_memory;
  *out = reinterpret_cast<DevPtr>(p);
  return res::ok;
}

void State::unmap(DevPtr base, std::size_t length) {
  munmap(reinterpret_cast<void*>(base), length);
}

namespace impl {

Result mem_alloc(DevPtr* ptr, std::size_t bytes) {
  FAKE_ENTRY(mem_alloc);
  if (ptr == nullptr || bytes == 0) return res::invalid_value;
  return alloc_device(s, ptr, bytes, 0);
}

Result mem_alloc_pitch(DevPtr* ptr, std::size_t* pitch, std::size_t width, std::size_t height,
                       unsigned element_bytes) {
  FAKE_ENTRY(mem_alloc_pitch);
  if (ptr == nullptr || pitch == nullptr || width == 0 || height == 0) return res::invalid_value;
  if (element_bytes != 4 && element_bytes != 8 && element_bytes != 16) return res::invalid_value;
  const std::size_t p = align_up(width, kPitchAlign);
  if (Result r = alloc_device(s, ptr, p * height, p)) return r;
  *pitch = p;
  return res::ok;
}

Result mem_free(DevPtr ptr) {
  FAKE_ENTRY(mem_free);
  if (ptr == 0) return res::ok;
  std::lock_guard lock(s.mu);
  auto it = s.allocs.find(ptr);
  if (it == s.allocs.end()) return res::invalid_value;
  Alloc& a = it->second;
  if (a.kind == AllocKind::host || a.kind == AllocKind::ipc_open) return res::invalid_value;
  // cuMemFree synchronizes: held work on the memory's device completes first.
  s.complete_device(a.device < 0 ? 0 : a.device);
  if (a.kind == AllocKind::pool || a.kind == AllocKind::pool_import)
    return s.free_pool_block(ptr, *s.legacy[static_cast<std::size_t>(a.device)]);
  if (a.kind == AllocKind::managed) s.managed_used -= a.length;
  s.uncharge(a.device, a.counted);
  s.unmap(ptr, a.length);
  s.allocs.erase(it);
  return res::ok;
}

Result mem_alloc_managed(DevPtr* ptr, std::size_t bytes, unsigned flags) {
  FAKE_ENTRY(mem_alloc_managed);
  if (ptr == nullptr || bytes == 0) return res::invalid_value;
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return res::invalid_value;
  void* p = nullptr;
  if (Result r = alloc_host_kind(s, &p, bytes, AllocKind::managed, flags)) return r;
  *ptr = reinterpret_cast<DevPtr>(p);
  return res::ok;
}

Result mem_host_alloc(void** ptr, std::size_t bytes, unsigned flags) {
  FAKE_ENTRY(mem_host_alloc);
  if (ptr == nullptr || bytes == 0) return res::invalid_value;
  constexpr unsigned kKnown =
      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if ((flags & ~kKnown) != 0) return res::invalid_value;
  return alloc_host_kind(s, ptr, bytes, AllocKind::host, flags);
}

Result mem_alloc_host(void** ptr, std::size_t bytes) {
  FAKE_ENTRY(mem_alloc_host);
  if (ptr == nullptr || bytes == 0) return res::invalid_value;
  return alloc_host_kind(s, ptr, bytes, AllocKind::host, 0);
}

Result mem_free_host(void* ptr) {
  FAKE_ENTRY(mem_free_host);
  std::lock_guard lock(s.mu);
  auto it = s.allocs.find(reinterpret_cast<DevPtr>(ptr));
  if (it == s.allocs.end() || it->second.kind != AllocKind::host) return res::invalid_value;
  s.uncharge(-1, it->second.counted);
  s.unmap(it->first, it->second.length);
  s.allocs.erase(it);
  return res::ok;
}

Result mem_get_address_range(DevPtr* base, std::size_t* size, DevPtr ptr) {
  FAKE_ENTRY(mem_get_address_range);
  std::lock_guard lock(s.mu);
  const PtrInfo info = describe(s, ptr);
  if (!info.known) return res::not_found;
  // As the H100's driver 580 answers on host-located VMM memory (cuMemCreate with location HOST or
  // HOST_NUMA): success, the physical allocation's size, and base 0.
  DevPtr mapped = 0;
  if (const Mapping* m = s.find_mapping(ptr, &mapped);
      m != nullptr && s.phys.at(m->handle).location.type != Location::Type::device) {
    if (base != nullptr) *base = 0;
    if (size != nullptr) *size = info.size;
    return res::ok;
  }
  if (base != nullptr) *base = info.base;
  if (size != nullptr) *size = info.size;
  return res::ok;
}

Result pointer_get_attribute(void* data, int attribute, DevPtr ptr) {
  FAKE_ENTRY(pointer_get_attribute);
  if (data == nullptr) return res::invalid_value;
  const AttrInfo* a = attr_info(attribute);
  if (a == nullptr) return res::invalid_value;
  std::lock_guard lock(s.mu);
  const PtrInfo info = describe(s, ptr);
  if (!info.known) return res::invalid_value;  // memory CUDA does not know
  write_attribute(s, info, *a, data);
  return res::ok;
}

Result pointer_get_attributes(unsigned count, int* attributes, void** data, DevPtr ptr) {
  FAKE_ENTRY(pointer_get_attributes);
  if (count > 0 && (attributes == nullptr || data == nullptr)) return res::invalid_value;
  for (unsigned i = 0; i < count; ++i)
    if (attr_info(attributes[i]) == nullptr) return res::invalid_value;
  std::lock_guard lock(s.mu);
  // Unlike the single query, unknown pointers are not an error: they read as null values.
  const PtrInfo info = describe(s, ptr);
  for (unsigned i = 0; i < count; ++i)
    if (data[i] != nullptr) write_attribute(s, info, *attr_info(attributes[i]), data[i]);
  return res::ok;
}

Result mem_advise(DevPtr ptr, std::size_t bytes, Advice advice, Location location) {
  FAKE_ENTRY(mem_advise);
  const int a = static_cast<int>(advice);
  if (a < 1 || a > 6) return res::invalid_value;
  std::lock_guard lock(s.mu);
  if (!in_managed(s, ptr, bytes)) return res::invalid_value;
  if (location.type == Location::Type::device && !s.valid_device(location.id))
    return res::invalid_device;
  s.advice.push_back({ptr, bytes, advice, location});
  return res::ok;
}

Result mem_prefetch_async(DevPtr ptr, std::size_t bytes, Location location, Stream stream) {
  FAKE_ENTRY(mem_prefetch_async);
  std::lock_guard lock(s.mu);
  if (!in_managed(s, ptr, bytes)) return res::invalid_value;
  if (location.type == Location::Type::device && !s.valid_device(location.id))
    return res::invalid_device;
  StreamState* st = s.stream(stream);
  if (st == nullptr) return res::invalid_handle;
  st->submit();
  s.prefetches.push_back({ptr, bytes, location, stream});
  return res::ok;
}

Result ipc_get_mem_handle(IpcHandle* handle, DevPtr ptr) {
  FAKE_ENTRY(ipc_get_mem_handle);
  if (handle == nullptr) return res::invalid_value;
  std::lock_guard lock(s.mu);
  auto it = s.allocs.find(ptr);
  // Native IPC covers whole cuMemAlloc allocations only.
  if (it == s.allocs.end() || it->second.kind != AllocKind::device) return res::invalid_value;
  IpcPayload p{};
  std::memcpy(p.magic, kIpcMagic, sizeof(p.magic));
  p.base = ptr;
  p.size = it->second.size;
  p.buffer_id = it->second.buffer_id;
  p.device = it->second.device;
  std::memset(handle->bytes, 0, sizeof(handle->bytes));
  std::memcpy(handle->bytes, &p, sizeof(p));
  return res::ok;
}

Result ipc_open_mem_handle(DevPtr* ptr, const IpcHandle& handle, unsigned flags) {
  FAKE_ENTRY(ipc_open_mem_handle);
  if (ptr == nullptr || (flags & ~unsigned{CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS}) != 0)
    return res::invalid_value;
  IpcPayload p;
  std::memcpy(&p, handle.bytes, sizeof(p));
  if (std::memcmp(p.magic, kIpcMagic, sizeof(p.magic)) != 0) return res::invalid_value;
  std::lock_guard lock(s.mu);
  auto it = s.allocs.find(p.base);
  if (it == s.allocs.end() || it->second.kind != AllocKind::device ||
      it->second.buffer_id != p.buffer_id)
    return res::invalid_value;
  // mremap with old size 0 maps the same shared pages a second time.
  void* q = mremap(reinterpret_cast<void*>(p.base), 0, it->second.length, MREMAP_MAYMOVE);
  if (q == MAP_FAILED) return res::map_failed;
  Alloc a;
  a.kind = AllocKind::ipc_open;
  a.size = it->second.size;
  a.length = it->second.length;
  a.device = it->second.device;
  a.buffer_id = it->second.buffer_id;
  s.allocs.emplace(reinterpret_cast<DevPtr>(q), a);
  *ptr = reinterpret_cast<DevPtr>(q);
  return res::ok;
}

Result ipc_close_mem_handle(DevPtr ptr) {
  FAKE_ENTRY(ipc_close_mem_handle);
  std::lock_guard lock(s.mu);
  auto it = s.allocs.find(ptr);
  if (it == s.allocs.end() || it->second.kind != AllocKind::ipc_open) return res::invalid_value;
  s.unmap(ptr, it->second.length);
  s.allocs.erase(it);
  return res::ok;
}

// Copies and fills check that the device side lies inside memory the fake handed out, so a test
// reading past an allocation fails instead of reading whatever the host has there.
namespace {
bool device_range_ok(State& s, DevPtr ptr, std::size_t bytes) {
  DevPtr base = 0;
  if (const Alloc* a = s.find_alloc(ptr, &base)) return bytes <= base + a->size - ptr;
  for (DevPtr at = ptr; at < ptr + bytes;) {  // VMM: possibly across adjacent mappings
    const Mapping* m = s.find_mapping(at, &base);
    if (m == nullptr) return false;
    at = base + m->size;
  }
  return true;
}
}  // namespace

Result memcpy_htod(DevPtr dst, const void* src, std::size_t bytes) {
  FAKE_ENTRY(memcpy_htod);
  if (bytes == 0) return res::ok;
  if (src == nullptr) return res::invalid_value;
  {
    std::lock_guard lock(s.mu);
    if (!device_range_ok(s, dst, bytes)) return res::invalid_value;
    s.complete_device(s.current_device() < 0 ? 0 : s.current_device());  // synchronous copy
  }
  std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
  return res::ok;
}

Result memcpy_dtoh(void* dst, DevPtr src, std::size_t bytes) {
  FAKE_ENTRY(memcpy_dtoh);
  if (bytes == 0) return res::ok;
  if (dst == nullptr) return res::invalid_value;
  {
    std::lock_guard lock(s.mu);
    if (!device_range_ok(s, src, bytes)) return res::invalid_value;
    s.complete_device(s.current_device() < 0 ? 0 : s.current_device());
  }
  std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
  return res::ok;
}

Result memset_d8(DevPtr dst, unsigned char value, std::size_t bytes) {
  FAKE_ENTRY(memset_d8);
  if (bytes == 0) return res::ok;
  {
    std::lock_guard lock(s.mu);
    if (!device_range_ok(s, dst, bytes)) return res::invalid_value;
  }
  std::memset(reinterpret_cast<void*>(dst), value, bytes);
  return res::ok;
}

Result memcpy_dtod(DevPtr dst, DevPtr src, std::size_t bytes) {
  FAKE_ENTRY(memcpy_dtod);
  if (bytes == 0) return res::ok;
  {
    std::lock_guard lock(s.mu);
    if (!device_range_ok(s, dst, bytes) || !device_range_ok(s, src, bytes))
      return res::invalid_value;
  }
  std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
  return res::ok;
}

}  // namespace impl
}  // namespace allocshim::fake::detail
