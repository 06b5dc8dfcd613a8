// The simulated device (see simulated_device.h): devices, contexts, classic and VMM memory. Pools,
// streams and events are in simulated_pools.cpp.
#include "sim/simulated_device_state.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace allocshim::sim {
namespace {

SimulatedDevice::State* g_state = nullptr;
thread_local int t_device = -1;  // the current context's device; -1: none made current (device 0)

}  // namespace

SimulatedDevice::State& state() { return *g_state; }

int SimulatedDevice::State::current() const {
  return t_device < 0 || t_device >= config.devices ? 0 : t_device;
}

bool SimulatedDevice::State::charge(int device, std::size_t bytes) {
  if (device < 0) return true;  // host memory: not counted
  auto& d = devices[static_cast<std::size_t>(device)];
  if (bytes > d.capacity - d.used) return false;
  d.used += bytes;
  if (d.used > d.peak) d.peak = d.used;
  return true;
}

void SimulatedDevice::State::uncharge(int device, std::size_t bytes) {
  if (device >= 0) devices[static_cast<std::size_t>(device)].used -= bytes;
}

DevPtr SimulatedDevice::State::take_addresses(std::size_t bytes, std::size_t alignment) {
  const std::size_t a = alignment > config.granularity ? alignment : config.granularity;
  const DevPtr at = align_up(next_address, a);
  next_address = at + align_up(bytes == 0 ? 1 : bytes, config.granularity);
  return at;
}

Result SimulatedDevice::State::add_block(DevPtr* ptr, std::size_t bytes, std::size_t counted,
                                         int device) {
  if (!charge(device, counted)) return res::out_of_memory;
  *ptr = take_addresses(bytes, 0);
  blocks[*ptr] = Block{bytes, counted, device, nullptr};
  return res::ok;
}

Result SimulatedDevice::State::free_block(DevPtr ptr) {
  auto it = blocks.find(ptr);
  if (it == blocks.end()) return res::invalid_value;
  const Block b = it->second;
  blocks.erase(it);
  if (b.pool != nullptr) {
    pool_block_freed(*b.pool, ptr, b.counted);
  } else {
    uncharge(b.device, b.counted);
  }
  return res::ok;
}

void SimulatedDevice::State::phys_unref(MemHandle handle) {
  auto it = phys.find(handle);
  if (it == phys.end() || it->second.refs > 0 || it->second.maps > 0) return;
  uncharge(it->second.device, it->second.size);
  phys.erase(it);
}

namespace impl {
namespace {

using Lock = std::lock_guard<std::mutex>;
inline constexpr std::size_t kAllocAlign = 256;  // cudaMalloc's guaranteed alignment
inline constexpr std::size_t kPitchAlign = 512;

bool valid(int device) { return device >= 0 && device < state().config.devices; }

// Devices and contexts: one primary context per device, whose handle is its slot.
Result init(unsigned) { return res::ok; }
Result driver_get_version(int* version) {
  *version = 13000;
  return res::ok;
}
Result device_get_count(int* count) {
  *count = state().config.devices;
  return res::ok;
}
Result device_get_attribute(int* value, DevAttr attr, int device) {
  if (!valid(device)) return res::invalid_device;
  *value = attr == DevAttr::host_numa_id ? 0 : 1;  // every capability, host NUMA node 0
  return res::ok;
}
Result device_get_name(char* name, int len, int device) {
  if (!valid(device) || len <= 0) return res::invalid_value;
  std::snprintf(name, static_cast<std::size_t>(len), "allocshim simulated device %d", device);
  return res::ok;
}
Result device_total_mem(std::size_t* bytes, int device) {
  if (!valid(device)) return res::invalid_device;
  *bytes = state().devices[static_cast<std::size_t>(device)].capacity;
  return res::ok;
}
Result device_get_uuid(unsigned char uuid[16], int device) {
  if (!valid(device)) return res::invalid_device;
  std::memset(uuid, 0, 16);
  std::memcpy(uuid, "simulated", 9);
  std::memcpy(uuid + 12, &device, sizeof device);
  return res::ok;
}
Context context_of(int device) { return &state().devices[static_cast<std::size_t>(device)]; }
int device_of(Context ctx) {
  auto& d = state().devices;
  for (std::size_t i = 0; i < d.size(); ++i)
    if (ctx == &d[i]) return static_cast<int>(i);
  return -1;
}
Result ctx_get_device(int* device) {
  *device = state().current();
  return res::ok;
}
Result ctx_get_current(Context* ctx) {
  *ctx = context_of(state().current());
  return res::ok;
}
Result ctx_set_current(Context ctx) {
  const int d = ctx == nullptr ? -1 : device_of(ctx);
  if (ctx != nullptr && d < 0) return res::invalid_context;
  t_device = d;
  return res::ok;
}
Result ctx_synchronize() {
  Lock lock(state().mu);
  state().apply_release_thresholds();
  return res::ok;
}
Result primary_ctx_retain(Context* ctx, int device) {
  if (!valid(device)) return res::invalid_device;
  *ctx = context_of(device);
  return res::ok;
}
Result primary_ctx_release(int device) { return valid(device) ? res::ok : res::invalid_device; }
Result primary_ctx_active(int device, int* active) {
  if (!valid(device)) return res::invalid_device;
  *active = 1;
  return res::ok;
}
Result ctx_get_id(Context ctx, std::uint64_t* id) {
  const int d = device_of(ctx);
  if (d < 0) return res::invalid_context;
  *id = static_cast<std::uint64_t>(d) + 1;
  return res::ok;
}
Result ctx_enable_peer_access(Context peer, unsigned) {
  return device_of(peer) < 0 ? res::invalid_context : res::ok;
}
Result mem_get_info(std::size_t* free, std::size_t* total) {
  Lock lock(state().mu);
  const auto& d = state().devices[static_cast<std::size_t>(state().current())];
  *free = d.capacity - d.used;
  *total = d.capacity;
  return res::ok;
}

// Classic allocations.
Result mem_alloc(DevPtr* ptr, std::size_t bytes) {
  Lock lock(state().mu);
  return state().add_block(ptr, bytes, align_up(bytes, kAllocAlign), state().current());
}
Result mem_alloc_pitch(DevPtr* ptr, std::size_t* pitch, std::size_t width, std::size_t height,
                       unsigned) {
  *pitch = align_up(width, kPitchAlign);
  return mem_alloc(ptr, *pitch * height);
}
Result mem_free(DevPtr ptr) {
  Lock lock(state().mu);
  return ptr == 0 ? res::ok : state().free_block(ptr);
}
Result mem_alloc_managed(DevPtr* ptr, std::size_t bytes, unsigned) {
  Lock lock(state().mu);
  return state().add_block(ptr, bytes, 0, -1);
}
Result mem_host_alloc(void** ptr, std::size_t bytes, unsigned) {
  Lock lock(state().mu);
  DevPtr p = 0;
  const Result r = state().add_block(&p, bytes, 0, -1);
  *ptr = reinterpret_cast<void*>(p);
  return r;
}
Result mem_alloc_host(void** ptr, std::size_t bytes) { return mem_host_alloc(ptr, bytes, 0); }
Result mem_free_host(void* ptr) { return mem_free(reinterpret_cast<DevPtr>(ptr)); }
Result mem_get_address_range(DevPtr* base, std::size_t* size, DevPtr ptr) {
  Lock lock(state().mu);
  auto it = state().blocks.upper_bound(ptr);
  if (it == state().blocks.begin()) return res::not_found;
  --it;
  if (ptr >= it->first + (it->second.size == 0 ? 1 : it->second.size)) return res::not_found;
  if (base != nullptr) *base = it->first;
  if (size != nullptr) *size = it->second.size;
  return res::ok;
}
Result pointer_get_attribute(void*, int, DevPtr) { return res::not_supported; }
Result pointer_get_attributes(unsigned, int*, void**, DevPtr) { return res::not_supported; }
Result mem_advise(DevPtr, std::size_t, Advice, Location) { return res::ok; }
Result mem_prefetch_async(DevPtr, std::size_t, Location, Stream) { return res::ok; }

// Virtual memory management.
int device_of(const Location& l) { return l.type == Location::Type::device ? l.id : -1; }
Result mem_get_granularity(std::size_t* bytes, const PhysSpec&) {
  *bytes = state().config.granularity;
  return res::ok;
}
Result mem_create(MemHandle* handle, std::size_t bytes, const PhysSpec& spec) {
  auto& s = state();
  const int device = device_of(spec.location);
  if (bytes == 0 || bytes % s.config.granularity != 0 || (device >= 0 && !valid(device)))
    return res::invalid_value;
  Lock lock(s.mu);
  if (!s.charge(device, bytes)) return res::out_of_memory;
  *handle = s.next_handle++;
  s.phys[*handle] = Phys{bytes, device, 1, 0};
  return res::ok;
}
Result mem_release(MemHandle handle) {
  Lock lock(state().mu);
  auto it = state().phys.find(handle);
  if (it == state().phys.end() || it->second.refs == 0) return res::invalid_value;
  --it->second.refs;
  state().phys_unref(handle);
  return res::ok;
}
Result mem_address_reserve(DevPtr* ptr, std::size_t bytes, std::size_t alignment, DevPtr) {
  if (bytes == 0) return res::invalid_value;
  Lock lock(state().mu);
  *ptr = state().take_addresses(bytes, alignment);
  state().reservations[*ptr] = bytes;
  return res::ok;
}
Result mem_address_free(DevPtr ptr, std::size_t bytes) {
  Lock lock(state().mu);
  auto it = state().reservations.find(ptr);
  if (it == state().reservations.end() || it->second != bytes) return res::invalid_value;
  state().reservations.erase(it);
  return res::ok;
}
Result mem_map(DevPtr ptr, std::size_t bytes, std::size_t, MemHandle handle) {
  auto& s = state();
  Lock lock(s.mu);
  auto ph = s.phys.find(handle);
  auto r = s.reservations.upper_bound(ptr);
  if (ph == s.phys.end() || r == s.reservations.begin()) return res::invalid_value;
  --r;
  if (ptr + bytes > r->first + r->second || s.mappings.count(ptr) != 0) return res::invalid_value;
  ++ph->second.maps;
  s.mappings[ptr] = {bytes, handle};
  return res::ok;
}
// The mapping holding `ptr`, or mappings.end().
auto mapping_at(DevPtr ptr) {
  auto& m = state().mappings;
  auto it = m.upper_bound(ptr);
  if (it == m.begin()) return m.end();
  --it;
  return ptr < it->first + it->second.first ? it : m.end();
}
Result mem_unmap(DevPtr ptr, std::size_t bytes) {
  auto& s = state();
  Lock lock(s.mu);
  auto it = s.mappings.lower_bound(ptr);
  if (it == s.mappings.end() || it->first >= ptr + bytes) return res::invalid_value;
  while (it != s.mappings.end() && it->first < ptr + bytes) {
    const MemHandle h = it->second.second;
    it = s.mappings.erase(it);
    --s.phys[h].maps;
    s.phys_unref(h);
  }
  return res::ok;
}
Result mem_set_access(DevPtr ptr, std::size_t, int device, bool) {
  Lock lock(state().mu);
  return valid(device) && mapping_at(ptr) != state().mappings.end() ? res::ok : res::invalid_value;
}
Result mem_retain_allocation_handle(MemHandle* handle, DevPtr ptr) {
  auto& s = state();
  Lock lock(s.mu);
  auto it = mapping_at(ptr);
  if (it == s.mappings.end()) return res::invalid_value;
  *handle = it->second.second;
  ++s.phys[*handle].refs;
  return res::ok;
}
Result mem_export_to_fd(int*, MemHandle) { return res::not_supported; }
Result mem_import_from_fd(MemHandle*, int) { return res::not_supported; }

// Native IPC, copies and fills, kernel parameters: no memory behind the addresses.
Result ipc_get_mem_handle(IpcHandle*, DevPtr) { return res::not_supported; }
Result ipc_open_mem_handle(DevPtr*, const IpcHandle&, unsigned) { return res::not_supported; }
Result ipc_close_mem_handle(DevPtr) { return res::not_supported; }
Result memcpy_htod(DevPtr, const void*, std::size_t) { return res::ok; }
Result memcpy_dtoh(void* dst, DevPtr, std::size_t bytes) {
  std::memset(dst, 0, bytes);
  return res::ok;
}
Result memset_d8(DevPtr, unsigned char, std::size_t) { return res::ok; }
Result memcpy_dtod(DevPtr, DevPtr, std::size_t) { return res::ok; }
Result func_get_param_info(void*, std::size_t, std::size_t*, std::size_t*) {
  return res::not_supported;
}
Result kernel_get_param_info(void*, std::size_t, std::size_t*, std::size_t*) {
  return res::not_supported;
}

}  // namespace
}  // namespace impl

SimulatedDevice::SimulatedDevice(SimConfig config) : state_(std::make_unique<State>()) {
  if (g_state != nullptr) {
    std::fprintf(stderr, "allocshim: only one simulated device may exist at a time\n");
    std::abort();
  }
  if (config.devices < 1) config.devices = 1;
  state_->config = config;
  state_->devices.resize(static_cast<std::size_t>(config.devices));
  for (auto& d : state_->devices) d.capacity = config.capacity;
  state_->default_pools.assign(state_->devices.size(), nullptr);
  t_device = -1;
  Driver& t = state_->table;
#define ALLOCSHIM_SIM_ENTRY(name) t.name = impl::name;
  ALLOCSHIM_SIM_DEVICE_ENTRIES(ALLOCSHIM_SIM_ENTRY)
#undef ALLOCSHIM_SIM_ENTRY
  fill_pool_entries(t);
  g_state = state_.get();
}

SimulatedDevice::~SimulatedDevice() { g_state = nullptr; }

const Driver& SimulatedDevice::driver() const { return state_->table; }

std::size_t SimulatedDevice::used(int device) const {
  std::lock_guard lock(state_->mu);
  return state_->devices.at(static_cast<std::size_t>(device)).used;
}

std::size_t SimulatedDevice::peak_used(int device) const {
  std::lock_guard lock(state_->mu);
  return state_->devices.at(static_cast<std::size_t>(device)).peak;
}

}  // namespace allocshim::sim
