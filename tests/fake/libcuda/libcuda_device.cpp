// The fake libcuda's instance, call counters and introspection (fakecuda.h), and the device,
// context and error-string entry points.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "fakecuda.h"
#include "symbols.h"

namespace fakecuda {
namespace {

constexpr int kSymbols = static_cast<int>(Sym::count);

constexpr const char* kNames[] = {
#define FAKECUDA_SYM_NAME(n) #n,
    FAKECUDA_SYMBOLS(FAKECUDA_SYM_NAME)
#undef FAKECUDA_SYM_NAME
};

std::atomic<unsigned long long> g_calls[kSymbols];
std::atomic<void*> g_last_stream[kSymbols];

int find(const char* symbol) {
  if (symbol == nullptr) return -1;
  for (int i = 0; i < kSymbols; ++i)
    if (std::strcmp(kNames[i], symbol) == 0) return i;
  return -1;
}

long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtol(v, nullptr, 10) : fallback;
}

allocshim::fake::FakeConfig config_from_env() {
  allocshim::fake::FakeConfig c;
  c.devices = static_cast<int>(env_long("FAKECUDA_DEVICES", 1));
  c.capacity = static_cast<std::size_t>(env_long("FAKECUDA_CAPACITY_MB", 1024)) << 20;
  c.driver_version = static_cast<int>(env_long("FAKECUDA_DRIVER_VERSION", 13000));
  return c;
}

}  // namespace

void enter(Sym sym) { g_calls[static_cast<int>(sym)].fetch_add(1, std::memory_order_relaxed); }

void enter(Sym sym, CUstream stream) {
  enter(sym);
  g_last_stream[static_cast<int>(sym)].store(stream, std::memory_order_relaxed);
}

const char* name(Sym sym) { return kNames[static_cast<int>(sym)]; }

allocshim::fake::FakeDriver& fake() {
  static allocshim::fake::FakeDriver* f = new allocshim::fake::FakeDriver(config_from_env());
  return *f;
}

const allocshim::Driver& drv() { return fake().driver(); }

allocshim::Location location(const CUmemLocation& l) {
  using T = allocshim::Location::Type;
  switch (l.type) {
    case CU_MEM_LOCATION_TYPE_HOST: return {T::host, 0};
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: return {T::host_numa, l.id};
    default: return {T::device, l.id};
  }
}

}  // namespace fakecuda

using namespace fakecuda;

// ---- Introspection ------------------------------------------------------------------------------

FAKECUDA_EXPORT unsigned long long fakecuda_calls(const char* symbol) {
  const int i = find(symbol);
  return i < 0 ? 0 : g_calls[i].load();
}

FAKECUDA_EXPORT void* fakecuda_last_stream(const char* symbol) {
  const int i = find(symbol);
  return i < 0 ? nullptr : g_last_stream[i].load();
}

FAKECUDA_EXPORT void fakecuda_reset(void) {
  for (int i = 0; i < kSymbols; ++i) {
    g_calls[i].store(0);
    g_last_stream[i].store(nullptr);
  }
}

FAKECUDA_EXPORT size_t fakecuda_live_allocations(void) { return fake().live_allocations(); }

FAKECUDA_EXPORT int fakecuda_reset_primary_context(int device) {
  return fake().reset_primary_context(device) == allocshim::res::ok ? 0 : -1;
}

FAKECUDA_EXPORT size_t fakecuda_used(int device) { return fake().used(device); }

FAKECUDA_EXPORT int fakecuda_fail_next(const char* op, int result, int count) {
  allocshim::fake::FakeOp o{};
  if (op == nullptr || !allocshim::fake::op_from_name(op, &o)) return -1;
  fake().fail_next(o, result, count);
  return 0;
}

// ---- Initialization, devices, contexts ----------------------------------------------------------

FAKECUDA_FORWARD(cuInit, (unsigned int flags), drv().init(flags))

FAKECUDA_FORWARD(cuDriverGetVersion, (int* version), drv().driver_get_version(version))

FAKECUDA_EXPORT CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  FAKECUDA_ENTER(cuDeviceGet);
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= fake().config().devices) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

FAKECUDA_FORWARD(cuDeviceGetCount, (int* count), drv().device_get_count(count))

FAKECUDA_EXPORT CUresult CUDAAPI cuDeviceGetAttribute(int* value, CUdevice_attribute attrib,
                                                      CUdevice dev) {
  FAKECUDA_ENTER(cuDeviceGetAttribute);
  using allocshim::DevAttr;
  DevAttr a{};
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: a = DevAttr::vmm_supported; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: a = DevAttr::pools_supported; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      a = DevAttr::posix_fd_supported;
      break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
      a = DevAttr::concurrent_managed_access;
      break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: a = DevAttr::host_numa_id; break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      a = DevAttr::host_numa_vmm;
      break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED: a = DevAttr::host_numa_pools; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: a = DevAttr::unified_addressing; break;
    default: {
      // Attributes the model does not cover answer like an H100, so runtimes that ask get on.
      if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
      if (dev < 0 || dev >= fake().config().devices) return CUDA_ERROR_INVALID_DEVICE;
      switch (attrib) {
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = 9; break;
        case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 132; break;
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
        case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; break;
        case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *value = 1; break;
        default: *value = 0; break;
      }
      return CUDA_SUCCESS;
    }
  }
  return cu(drv().device_get_attribute(value, a, dev));
}

FAKECUDA_FORWARD(cuDeviceGetName, (char* name, int len, CUdevice dev),
                 drv().device_get_name(name, len, dev))

FAKECUDA_V1_UNSUPPORTED(cuDeviceTotalMem, (unsigned int*, CUdevice))

FAKECUDA_FORWARD(cuDeviceTotalMem_v2, (size_t * bytes, CUdevice dev),
                 drv().device_total_mem(bytes, dev))

FAKECUDA_EXPORT CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  FAKECUDA_ENTER(cuDeviceGetUuid_v2);
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  unsigned char bytes[16];
  const CUresult r = cu(drv().device_get_uuid(bytes, dev));
  if (r == CUDA_SUCCESS) std::memcpy(uuid->bytes, bytes, sizeof bytes);
  return r;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  FAKECUDA_ENTER(cuDeviceCanAccessPeer);
  const int n = fake().config().devices;
  if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= n || peer < 0 || peer >= n) return CUDA_ERROR_INVALID_DEVICE;
  *can = dev != peer;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuCtxGetCurrent(CUcontext* ctx) {
  FAKECUDA_ENTER(cuCtxGetCurrent);
  allocshim::Context c = nullptr;
  const CUresult r = cu(drv().ctx_get_current(&c));
  if (r == CUDA_SUCCESS && ctx != nullptr) *ctx = static_cast<CUcontext>(c);
  return ctx == nullptr ? CUDA_ERROR_INVALID_VALUE : r;
}

FAKECUDA_FORWARD(cuCtxSetCurrent, (CUcontext ctx), drv().ctx_set_current(ctx))

FAKECUDA_FORWARD(cuCtxGetDevice, (CUdevice * device), drv().ctx_get_device(device))

FAKECUDA_FORWARD(cuCtxSynchronize, (void), drv().ctx_synchronize())

// CUDA 13: synchronizes `ctx` (null: the current context); the fake has one context per device.
FAKECUDA_EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  FAKECUDA_ENTER(cuCtxSynchronize_v2);
  (void)ctx;
  return cu(drv().ctx_synchronize());
}

FAKECUDA_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  FAKECUDA_ENTER(cuDevicePrimaryCtxRetain);
  return hand_out<allocshim::Context>(
      ctx, [&](allocshim::Context* c) { return drv().primary_ctx_retain(c, dev); });
}

FAKECUDA_FORWARD_TWINS(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, (CUdevice dev),
                       drv().primary_ctx_release(dev))

FAKECUDA_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags,
                                                            int* active) {
  FAKECUDA_ENTER(cuDevicePrimaryCtxGetState);
  if (flags != nullptr) *flags = 0;
  return cu(drv().primary_ctx_active(dev, active));
}

FAKECUDA_FORWARD_TWINS(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2, (CUdevice dev),
                       fakecuda::fake().reset_primary_context(dev))

// The fake has primary contexts only: destroying one is its reset.
FAKECUDA_FORWARD_TWINS(cuCtxDestroy, cuCtxDestroy_v2, (CUcontext ctx),
                       fakecuda::fake().destroy_context(ctx))

FAKECUDA_EXPORT CUresult CUDAAPI cuCtxGetId(CUcontext ctx, unsigned long long* id) {
  FAKECUDA_ENTER(cuCtxGetId);
  std::uint64_t v = 0;
  const CUresult r = cu(drv().ctx_get_id(static_cast<allocshim::Context>(ctx), &v));
  if (r == CUDA_SUCCESS && id != nullptr) *id = v;
  return r;
}

FAKECUDA_FORWARD(cuCtxEnablePeerAccess, (CUcontext peer, unsigned int flags),
                 drv().ctx_enable_peer_access(peer, flags))

FAKECUDA_EXPORT CUresult CUDAAPI cuGetErrorString(CUresult error, const char** str) {
  FAKECUDA_ENTER(cuGetErrorString);
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *str = error == CUDA_SUCCESS ? "no error" : "fake driver error";
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuGetErrorName(CUresult error, const char** str) {
  FAKECUDA_ENTER(cuGetErrorName);
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *str = error == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR_FAKE";
  return CUDA_SUCCESS;
}
