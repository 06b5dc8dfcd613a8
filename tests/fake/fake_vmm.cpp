// Virtual memory management: reservations are PROT_NONE host VA, physical handles are memfds, and
// cuMemMap maps a memfd into a reservation. Errors follow cuMemMap/cuMemUnmap's documentation:
// anything outside a reservation, over a mapping, or not granularity-aligned is invalid_value.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "fake_state.h"

namespace allocshim::fake {
namespace detail {
namespace {

// The memfd name carries the location, so an importer (maybe another process) can recover it.
constexpr const char* kDeviceName = "allocshim-fake-dev";
constexpr const char* kHostName = "allocshim-fake-host";

bool aligned(std::size_t v, std::size_t a) { return v % a == 0; }

void free_phys(State& s, MemHandle handle) {
  PhysState& p = s.phys.at(handle);
  close(p.fd);
  if (p.counted != 0)
    s.uncharge(p.location.type == Location::Type::device ? p.location.id : -1, p.counted);
  s.phys.erase(handle);
}

// The mappings exactly covering [ptr, ptr + bytes), in order; empty if there is a gap, or a
// mapping straddles either end.
std::vector<std::map<DevPtr, Mapping>::iterator> covering(State& s, DevPtr ptr, std::size_t bytes) {
  std::vector<std::map<DevPtr, Mapping>::iterator> out;
  auto it = s.mappings.find(ptr);
  DevPtr at = ptr;
  while (it != s.mappings.end() && it->first == at && at < ptr + bytes) {
    out.push_back(it);
    at += it->second.size;
    ++it;
  }
  if (at != ptr + bytes) out.clear();
  return out;
}

// Host protection that mirrors the most any device may do (strict_access mode only).
int host_protection(const Access& a) {
  if (a.write != 0) return PROT_READ | PROT_WRITE;
  return a.read != 0 ? PROT_READ : PROT_NONE;
}

}  // namespace

const Mapping* State::find_mapping(DevPtr ptr, DevPtr* base) const {
  auto it = mappings.upper_bound(ptr);
  if (it == mappings.begin()) return nullptr;
  --it;
  if (ptr - it->first >= it->second.size) return nullptr;
  *base = it->first;
  return &it->second;
}

namespace impl {

Result mem_get_granularity(std::size_t* bytes, const PhysSpec& spec) {
  FAKE_ENTRY(mem_get_granularity);
  if (bytes == nullptr) return res::invalid_value;
  if (spec.location.type == Location::Type::device && !s.valid_device(spec.location.id))
    return res::invalid_device;
  *bytes = s.config.granularity;
  return res::ok;
}

Result mem_create(MemHandle* handle, std::size_t bytes, const PhysSpec& spec) {
  FAKE_ENTRY(mem_create);
  if (handle == nullptr || bytes == 0 || !aligned(bytes, s.config.granularity))
    return res::invalid_value;
  const bool on_device = spec.location.type == Location::Type::device;
  if (on_device && !s.valid_device(spec.location.id)) return res::invalid_device;
  if (!on_device && s.config.attributes[static_cast<int>(DevAttr::host_numa_vmm)] == 0)
    return res::not_supported;
  // "HOST allocations are not IPC capable" (cuda.h, cuMemCreate; the H100 answers so too).
  if (spec.location.type == Location::Type::host && spec.posix_fd) return res::invalid_value;
  std::lock_guard lock(s.mu);
  const int charged = on_device ? spec.location.id : -1;
  if (!s.charge(charged, bytes)) return res::out_of_memory;
  char name[64];
  if (on_device)
    std::snprintf(name, sizeof(name), "%s%d", kDeviceName, spec.location.id);
  else
    std::snprintf(name, sizeof(name), "%s", kHostName);
  const int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    if (fd >= 0) close(fd);
    s.uncharge(charged, bytes);
    return res::out_of_memory;
  }
  PhysState p;
  p.fd = fd;
  p.size = bytes;
  p.location = spec.location;
  p.posix_fd = spec.posix_fd;
  p.counted = bytes;
  p.block_id = s.next_id++;
  *handle = p.block_id;
  s.phys.emplace(*handle, p);
  return res::ok;
}

Result mem_release(MemHandle handle) {
  FAKE_ENTRY(mem_release);
  std::lock_guard lock(s.mu);
  auto it = s.phys.find(handle);
  if (it == s.phys.end() || it->second.refs <= 0) return res::invalid_value;
  // Physical memory outlives its handle while mapped, as on a real driver.
  if (--it->second.refs == 0 && it->second.maps == 0) free_phys(s, handle);
  return res::ok;
}

Result mem_address_reserve(DevPtr* ptr, std::size_t bytes, std::size_t alignment, DevPtr hint) {
  FAKE_ENTRY(mem_address_reserve);
  const std::size_t g = s.config.granularity;
  if (ptr == nullptr || bytes == 0 || !aligned(bytes, g)) return res::invalid_value;
  if (alignment == 0) alignment = g;
  if ((alignment & (alignment - 1)) != 0) return res::invalid_value;
  if (alignment < g) alignment = g;
  constexpr int kFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  std::lock_guard lock(s.mu);
  void* at = MAP_FAILED;
  if (hint != 0 && aligned(hint, alignment)) {
    at = mmap(reinterpret_cast<void*>(hint), bytes, PROT_NONE, kFlags | MAP_FIXED_NOREPLACE, -1, 0);
    if (at != MAP_FAILED && at != reinterpret_cast<void*>(hint)) {  // old kernels: just a hint
      munmap(at, bytes);
      at = MAP_FAILED;
    }
  }
  if (at == MAP_FAILED) {
    // Over-reserve and trim both ends to honour the alignment.
    void* raw = mmap(nullptr, bytes + alignment, PROT_NONE, kFlags, -1, 0);
    if (raw == MAP_FAILED) return res::out_of_memory;
    const auto r = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t base = align_up(r, alignment);
    if (base > r) munmap(raw, base - r);
    const std::uintptr_t end = base + bytes;
    if (r + bytes + alignment > end)
      munmap(reinterpret_cast<void*>(end), r + bytes + alignment - end);
    at = reinterpret_cast<void*>(base);
  }
  *ptr = reinterpret_cast<DevPtr>(at);
  s.reservations.emplace(*ptr, bytes);
  return res::ok;
}

// Stricter than the driver documents: freeing a range that still has mappings is refused, so a
// backend that leaks mappings fails in tests.
Result mem_address_free(DevPtr ptr, std::size_t bytes) {
  FAKE_ENTRY(mem_address_free);
  std::lock_guard lock(s.mu);
  auto it = s.reservations.find(ptr);
  if (it == s.reservations.end() || it->second != bytes) return res::invalid_value;
  auto m = s.mappings.lower_bound(ptr);
  if (m != s.mappings.end() && m->first < ptr + bytes) return res::invalid_value;
  munmap(reinterpret_cast<void*>(ptr), bytes);
  s.reservations.erase(it);
  return res::ok;
}

Result mem_map(DevPtr ptr, std::size_t bytes, std::size_t offset, MemHandle handle) {
  FAKE_ENTRY(mem_map);
  const std::size_t g = s.config.granularity;
  if (bytes == 0 || !aligned(ptr, g) || !aligned(bytes, g) || !aligned(offset, g))
    return res::invalid_value;
  std::lock_guard lock(s.mu);
  auto ph = s.phys.find(handle);
  if (ph == s.phys.end() || ph->second.refs <= 0) return res::invalid_value;
  if (offset > ph->second.size || bytes > ph->second.size - offset) return res::invalid_value;
  // Inside one reservation...
  auto rv = s.reservations.upper_bound(ptr);
  if (rv == s.reservations.begin()) return res::invalid_value;
  --rv;
  if (ptr < rv->first || ptr + bytes > rv->first + rv->second) return res::invalid_value;
  // ...and over no existing mapping.
  auto next = s.mappings.lower_bound(ptr);
  if (next != s.mappings.end() && next->first < ptr + bytes) return res::invalid_value;
  if (next != s.mappings.begin() && std::prev(next)->first + std::prev(next)->second.size > ptr)
    return res::invalid_value;
  const int prot = s.config.strict_access ? PROT_NONE : PROT_READ | PROT_WRITE;
  void* m = mmap(reinterpret_cast<void*>(ptr), bytes, prot, MAP_SHARED | MAP_FIXED, ph->second.fd,
                 static_cast<off_t>(offset));
  if (m == MAP_FAILED) return res::out_of_memory;
  Mapping mp;
  mp.size = bytes;
  mp.offset = offset;
  mp.handle = handle;
  mp.access.resize(bytes / g);
  s.mappings.emplace(ptr, std::move(mp));
  ++ph->second.maps;
  if (ph->second.location.type != Location::Type::device) ++s.host_maps;
  return res::ok;
}

Result mem_unmap(DevPtr ptr, std::size_t bytes) {
  FAKE_ENTRY(mem_unmap);
  std::lock_guard lock(s.mu);
  auto covered = covering(s, ptr, bytes);
  if (bytes == 0 || covered.empty()) return res::invalid_value;
  for (auto it : covered) {
    // Back to a reserved, inaccessible range.
    mmap(reinterpret_cast<void*>(it->first), it->second.size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    const MemHandle h = it->second.handle;
    s.mappings.erase(it);
    PhysState& p = s.phys.at(h);
    if (--p.maps == 0 && p.refs == 0) free_phys(s, h);
  }
  return res::ok;
}

// read_write false revokes access (CU_MEM_ACCESS_FLAGS_PROT_NONE), as shim/driver does; read-only
// access is reachable through set_access_flags (the fake libcuda's cuMemSetAccess with PROT_READ).
Result mem_set_access(DevPtr ptr, std::size_t bytes, int device, bool read_write) {
  return set_access_flags(ptr, bytes, device, read_write, read_write);
}

Result mem_export_to_fd(int* fd, MemHandle handle) {
  FAKE_ENTRY(mem_export_to_fd);
  if (fd == nullptr) return res::invalid_value;
  std::lock_guard lock(s.mu);
  auto it = s.phys.find(handle);
  if (it == s.phys.end() || !it->second.posix_fd) return res::invalid_value;
  *fd = dup(it->second.fd);
  return *fd < 0 ? res::unknown : res::ok;
}

Result mem_import_from_fd(MemHandle* handle, int fd) {
  FAKE_ENTRY(mem_import_from_fd);
  if (handle == nullptr || fd < 0) return res::invalid_value;
  char path[64], target[256];
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(path, target, sizeof(target) - 1);
  if (n <= 0) return res::invalid_value;
  target[n] = '\0';
  // "/memfd:allocshim-fake-dev0 (deleted)": only handles the fake exported are accepted.
  Location loc;
  const char* name = std::strstr(target, "memfd:");
  if (name == nullptr) return res::invalid_value;
  name += 6;
  if (std::strncmp(name, kDeviceName, std::strlen(kDeviceName)) == 0) {
    loc = {Location::Type::device, std::atoi(name + std::strlen(kDeviceName))};
  } else if (std::strncmp(name, kHostName, std::strlen(kHostName)) == 0) {
    loc = {Location::Type::host, 0};
  } else {
    return res::invalid_value;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) return res::invalid_value;
  std::lock_guard lock(s.mu);
  PhysState p;
  p.fd = dup(fd);  // the caller keeps (and closes) its own fd
  if (p.fd < 0) return res::invalid_value;
  p.size = static_cast<std::size_t>(st.st_size);
  p.location = loc;
  p.posix_fd = false;  // as the driver: an imported handle cannot be exported again
  p.imported = true;   // the exporter's capacity already counts it
  p.block_id = s.next_id++;
  *handle = p.block_id;
  s.phys.emplace(*handle, p);
  return res::ok;
}

Result mem_retain_allocation_handle(MemHandle* handle, DevPtr ptr) {
  FAKE_ENTRY(mem_retain_allocation_handle);
  if (handle == nullptr) return res::invalid_value;
  std::lock_guard lock(s.mu);
  DevPtr base = 0;
  const Mapping* m = s.find_mapping(ptr, &base);
  if (m == nullptr) return res::invalid_value;
  ++s.phys.at(m->handle).refs;
  *handle = m->handle;
  return res::ok;
}

}  // namespace impl
}  // namespace detail

Result set_access_flags(DevPtr ptr, std::size_t bytes, int device, bool read, bool write) {
  detail::State& s = detail::state();
  if (Result r = s.enter(FakeOp::mem_set_access)) return r;
  const std::size_t g = s.config.granularity;
  if (!s.valid_device(device)) return res::invalid_device;
  if (bytes == 0 || !detail::aligned(ptr, g) || !detail::aligned(bytes, g))
    return res::invalid_value;
  std::lock_guard lock(s.mu);
  // The whole range must be mapped (it may span several mappings, and start or end inside one).
  DevPtr base = 0;
  for (DevPtr at = ptr; at < ptr + bytes; at += g)
    if (s.find_mapping(at, &base) == nullptr) return res::invalid_value;
  const std::uint64_t bit = std::uint64_t{1} << device;
  for (DevPtr at = ptr; at < ptr + bytes; at += g) {
    s.find_mapping(at, &base);
    detail::Access& a = s.mappings.at(base).access[(at - base) / g];
    a.read = read || write ? a.read | bit : a.read & ~bit;
    a.write = write ? a.write | bit : a.write & ~bit;
    if (s.config.strict_access)
      mprotect(reinterpret_cast<void*>(at), g, detail::host_protection(a));
  }
  return res::ok;
}

// ---- Test queries -----------------------------------------------------------------------------

std::size_t FakeDriver::live_handles() const {
  std::lock_guard lock(state_->mu);
  return state_->phys.size();
}

std::uint64_t FakeDriver::host_maps() const {
  std::lock_guard lock(state_->mu);
  return state_->host_maps;
}

std::size_t FakeDriver::reservations() const {
  std::lock_guard lock(state_->mu);
  return state_->reservations.size();
}

std::size_t FakeDriver::mappings() const {
  std::lock_guard lock(state_->mu);
  return state_->mappings.size();
}

bool FakeDriver::is_mapped(DevPtr ptr) const {
  std::lock_guard lock(state_->mu);
  DevPtr base = 0;
  return state_->find_mapping(ptr, &base) != nullptr;
}

bool FakeDriver::has_access(DevPtr ptr, int device, bool read_write) const {
  std::lock_guard lock(state_->mu);
  DevPtr base = 0;
  const detail::Mapping* m = state_->find_mapping(ptr, &base);
  if (m == nullptr || !state_->valid_device(device)) return false;
  const detail::Access& a = m->access[(ptr - base) / state_->config.granularity];
  return ((read_write ? a.write : a.read) >> device) & 1;
}

}  // namespace allocshim::fake
