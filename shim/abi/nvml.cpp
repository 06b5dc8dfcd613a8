// NVML's memory queries under a device budget: nvmlDeviceGetMemoryInfo and _v2 report the budget
// as the total and what is left of it as free, as cuMemGetInfo does (Core::budget_view), so that
// nvidia-smi, pynvml and the frameworks that size themselves from NVML see the job's limit, not
// the whole GPU. Reached through the exported symbols (a program linked with -lnvidia-ml) and
// through dlsym on any handle (nvidia-smi and pynvml dlopen libnvidia-ml.so.1). NVML's ABI for
// these three calls is declared here, as its header is not part of every toolkit. A process that
// never loads NVML never reaches this file; a device NVML names that no CUDA device matches, or
// one without a budget, gets NVML's own answer.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "abi/hooks.h"
#include "core/core.h"

namespace {

using nvmlReturn_t = int;
constexpr nvmlReturn_t kNvmlSuccess = 0;
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
struct nvmlMemory_v2_t {
  unsigned int version;
  unsigned long long total, reserved, free, used;
};
using GetInfo = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
using GetInfoV2 = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_v2_t*);
using GetUuid = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int);

// NVML's own entry points, from the first lookup that found them.
std::atomic<GetInfo> g_info{nullptr};
std::atomic<GetInfoV2> g_info_v2{nullptr};
std::atomic<GetUuid> g_uuid{nullptr};

template <class Fn>
Fn next(std::atomic<Fn>& slot, const char* name) {
  Fn fn = slot.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = reinterpret_cast<Fn>(allocshim::abi::real_dlsym(RTLD_NEXT, name));
    if (fn != nullptr) slot.store(fn, std::memory_order_release);
  }
  return fn;
}

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" to its 16 bytes.
bool parse_uuid(const char* text, unsigned char out[16]) {
  if (std::strncmp(text, "GPU-", 4) != 0) return false;
  int n = 0;
  for (const char* p = text + 4; *p && n < 32; ++p) {
    if (*p == '-') continue;
    const char c = *p;
    const int v = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (v < 0) return false;
    if (n % 2 == 0)
      out[n / 2] = static_cast<unsigned char>(v << 4);
    else
      out[n / 2] = static_cast<unsigned char>(out[n / 2] | v);
    ++n;
  }
  return n == 32;
}

// The budget's view of `device`, given NVML's free and total; false: NVML's numbers stand.
bool budget_view(nvmlDevice_t device, unsigned long long* free, unsigned long long* total) {
  using namespace allocshim;
  if (abi::t_in_shim) return false;
  const GetUuid get_uuid = next(g_uuid, "nvmlDeviceGetUUID");
  char text[96] = {};
  unsigned char uuid[16];
  if (get_uuid == nullptr || get_uuid(device, text, sizeof text) != kNvmlSuccess ||
      !parse_uuid(text, uuid))
    return false;
  abi::Guard guard;
  Core* core = process_core();
  std::uint64_t f = *free, t = *total;
  if (core == nullptr || !core->budget_view(uuid, &f, &t)) return false;
  *free = f;
  *total = t;
  return true;
}

}  // namespace

#define ALLOCSHIM_EXPORT __attribute__((visibility("default")))

extern "C" {

ALLOCSHIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  const GetInfo real = next(g_info, "nvmlDeviceGetMemoryInfo");
  if (real == nullptr) return 999;  // NVML_ERROR_UNKNOWN: no NVML behind this symbol
  const nvmlReturn_t r = real(device, memory);
  if (r == kNvmlSuccess && memory != nullptr && budget_view(device, &memory->free, &memory->total))
    memory->used = memory->total - memory->free;
  return r;
}

ALLOCSHIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device,
                                                         nvmlMemory_v2_t* memory) {
  const GetInfoV2 real = next(g_info_v2, "nvmlDeviceGetMemoryInfo_v2");
  if (real == nullptr) return 999;
  const nvmlReturn_t r = real(device, memory);
  if (r == kNvmlSuccess && memory != nullptr &&
      budget_view(device, &memory->free, &memory->total)) {
    // total = reserved + used + free: the driver's reservation lies outside the budget, whose use
    // is all "used", as cuMemGetInfo counts it.
    memory->reserved = 0;
    memory->used = memory->total - memory->free;
  }
  return r;
}

}  // extern "C"

namespace allocshim::abi {

void* nvml_substitute(void* handle, const char* name, void* fn) {
  // The entry points of the library the caller looked into, kept for the wrappers.
  if (std::strcmp(name, "nvmlDeviceGetMemoryInfo") == 0) {
    g_info.store(reinterpret_cast<GetInfo>(fn), std::memory_order_release);
    if (void* u = real_dlsym(handle, "nvmlDeviceGetUUID"))
      g_uuid.store(reinterpret_cast<GetUuid>(u));
    return reinterpret_cast<void*>(&nvmlDeviceGetMemoryInfo);
  }
  if (std::strcmp(name, "nvmlDeviceGetMemoryInfo_v2") == 0) {
    g_info_v2.store(reinterpret_cast<GetInfoV2>(fn), std::memory_order_release);
    if (void* u = real_dlsym(handle, "nvmlDeviceGetUUID"))
      g_uuid.store(reinterpret_cast<GetUuid>(u));
    return reinterpret_cast<void*>(&nvmlDeviceGetMemoryInfo_v2);
  }
  return fn;
}

}  // namespace allocshim::abi
