// Adapters from the core's driver table to libcuda. Each entry point is looked up by its exact
// versioned name (cuMemAlloc_v2, cuMemAdvise_v2, ...) so the ABI is the one this file was compiled
// against, whatever a resolver would pick by version number.
#include "driver/real_driver.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>

#include "driver/real_calls.h"

namespace allocshim {
namespace libcuda {

Real g_real;

}  // namespace libcuda
namespace {

using namespace libcuda;  // the entry points and conversions of real_calls.h

Driver g_table;
void* g_handle = nullptr;

// Devices, contexts and the driver itself.
void fill_devices(Driver& t) {
  t.init = [](unsigned f) { return CALL(cuInit, f); };
  t.driver_get_version = [](int* v) { return CALL(cuDriverGetVersion, v); };
  t.device_get_count = [](int* n) { return CALL(cuDeviceGetCount, n); };
  t.device_get_attribute = [](int* v, DevAttr a, int d) {
    return CALL(cuDeviceGetAttribute, v, to_cu(a), d);
  };
  t.device_get_name = [](char* n, int len, int d) { return CALL(cuDeviceGetName, n, len, d); };
  t.device_total_mem = [](std::size_t* b, int d) { return CALL(cuDeviceTotalMem_v2, b, d); };
  t.device_get_uuid = [](unsigned char u[16], int d) {
    CUuuid id{};
    const Result r = CALL(cuDeviceGetUuid_v2, &id, d);
    if (r == res::ok) std::memcpy(u, id.bytes, sizeof id.bytes);
    return r;
  };
  t.ctx_get_device = [](int* d) {
    CUdevice dev = 0;
    const Result r = CALL(cuCtxGetDevice, &dev);
    *d = dev;
    return r;
  };
  t.ctx_get_current = [](Context* c) {
    CUcontext ctx = nullptr;
    const Result r = CALL(cuCtxGetCurrent, &ctx);
    *c = ctx;
    return r;
  };
  t.ctx_set_current = [](Context c) { return CALL(cuCtxSetCurrent, static_cast<CUcontext>(c)); };
  t.ctx_synchronize = [] { return CALL(cuCtxSynchronize); };
  t.primary_ctx_retain = [](Context* c, int d) {
    CUcontext ctx = nullptr;
    const Result r = CALL(cuDevicePrimaryCtxRetain, &ctx, d);
    *c = ctx;
    return r;
  };
  t.primary_ctx_release = [](int d) { return CALL(cuDevicePrimaryCtxRelease_v2, d); };
  t.primary_ctx_active = [](int d, int* active) {
    unsigned flags = 0;
    return CALL(cuDevicePrimaryCtxGetState, d, &flags, active);
  };
  t.ctx_get_id = [](Context c, std::uint64_t* id) {
    unsigned long long v = 0;
    const Result r = CALL(cuCtxGetId, static_cast<CUcontext>(c), &v);
    *id = v;
    return r;
  };
  t.ctx_enable_peer_access = [](Context p, unsigned f) {
    return CALL(cuCtxEnablePeerAccess, static_cast<CUcontext>(p), f);
  };
}

void fill_streams_events(Driver& t) {
  t.stream_create = [](Stream* s, unsigned f) {
    CUstream st = nullptr;
    const Result r = CALL(cuStreamCreate, &st, f);
    *s = st;
    return r;
  };
  t.stream_create_with_priority = [](Stream* s, unsigned f, int prio) {
    CUstream st = nullptr;
    const Result r = CALL(cuStreamCreateWithPriority, &st, f, prio);
    *s = st;
    return r;
  };
  t.stream_destroy = [](Stream s) { return CALL(cuStreamDestroy_v2, cu(s)); };
  t.stream_synchronize = [](Stream s) { return CALL(cuStreamSynchronize, cu(s)); };
  t.stream_query = [](Stream s) { return CALL(cuStreamQuery, cu(s)); };
  if (g_real.cuStreamIsCapturing)
    t.stream_is_capturing = [](Stream s, bool* capturing) {
      CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
      const Result r = CALL(cuStreamIsCapturing, cu(s), &status);
      *capturing = status != CU_STREAM_CAPTURE_STATUS_NONE;
      return r;
    };
  if (g_real.cuThreadExchangeStreamCaptureMode)
    t.thread_relax_capture = [] {
      CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
      return CALL(cuThreadExchangeStreamCaptureMode, &mode);
    };
  t.stream_wait_event = [](Stream s, Event e, unsigned f) {
    return CALL(cuStreamWaitEvent, cu(s), cu_event(e), f);
  };
  t.event_create = [](Event* e, unsigned f) {
    CUevent ev = nullptr;
    const Result r = CALL(cuEventCreate, &ev, f);
    *e = ev;
    return r;
  };
  t.event_record = [](Event e, Stream s) { return CALL(cuEventRecord, cu_event(e), cu(s)); };
  t.event_query = [](Event e) { return CALL(cuEventQuery, cu_event(e)); };
  t.event_synchronize = [](Event e) { return CALL(cuEventSynchronize, cu_event(e)); };
  t.event_destroy = [](Event e) { return CALL(cuEventDestroy_v2, cu_event(e)); };
  t.event_elapsed_time = [](float* ms, Event a, Event b) {
    return CALL(cuEventElapsedTime, ms, cu_event(a), cu_event(b));
  };
}

// Legacy IPC handles, and the copies and memsets the shim itself issues.
void fill_ipc_copies(Driver& t) {
  t.ipc_get_mem_handle = [](IpcHandle* h, DevPtr p) {
    static_assert(sizeof(CUipcMemHandle) == sizeof(IpcHandle));
    CUipcMemHandle handle{};
    const Result r = CALL(cuIpcGetMemHandle, &handle, p);
    std::memcpy(h, &handle, sizeof handle);
    return r;
  };
  t.ipc_open_mem_handle = [](DevPtr* p, const IpcHandle& h, unsigned f) {
    CUipcMemHandle handle;
    std::memcpy(&handle, &h, sizeof handle);
    return CALL(cuIpcOpenMemHandle_v2, p, handle, f);
  };
  t.ipc_close_mem_handle = [](DevPtr p) { return CALL(cuIpcCloseMemHandle, p); };
  t.memcpy_htod = [](DevPtr dst, const void* src, std::size_t b) {
    return CALL(cuMemcpyHtoD_v2, dst, src, b);
  };
  t.memcpy_dtoh = [](void* dst, DevPtr src, std::size_t b) {
    return CALL(cuMemcpyDtoH_v2, dst, src, b);
  };
  t.memset_d8 = [](DevPtr dst, unsigned char v, std::size_t n) {
    return CALL(cuMemsetD8_v2, dst, v, n);
  };
  t.memcpy_dtod = [](DevPtr dst, DevPtr src, std::size_t b) {
    return CALL(cuMemcpyDtoD_v2, dst, src, b);
  };
}

// Parameter layouts (CUDA 12.4+): absent from older drivers, where launches mark nothing.
void fill_param_info(Driver& t) {
  if (g_real.cuFuncGetParamInfo)
    t.func_get_param_info = [](void* f, std::size_t i, std::size_t* off, std::size_t* size) {
      return CALL(cuFuncGetParamInfo, static_cast<CUfunction>(f), i, off, size);
    };
  if (g_real.cuKernelGetParamInfo)
    t.kernel_get_param_info = [](void* k, std::size_t i, std::size_t* off, std::size_t* size) {
      return CALL(cuKernelGetParamInfo, static_cast<CUkernel>(k), i, off, size);
    };
}

void fill_table() {
  Driver& t = g_table;
  fill_devices(t);
  fill_memory(t);
  fill_pools(t);
  fill_pool_sharing(t);
  fill_vmm(t);
  fill_streams_events(t);
  fill_ipc_copies(t);
  fill_param_info(t);
}

}  // namespace

const Driver* load_real_driver(SymbolLookup lookup, bool may_load, std::string& error) {
  static std::once_flag once;
  static std::string load_error;
  std::call_once(once, [&] {
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!handle && may_load) handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
      const char* why = dlerror();
      load_error = std::string("libcuda.so.1 could not be loaded: ") + (why ? why : "not found");
      return;
    }
#define X(name) g_real.name = reinterpret_cast<decltype(&::name)>(lookup(handle, #name));
    ALLOCSHIM_REAL_LIST(X)
#undef X
    if (!g_real.cuMemAlloc_v2 || !g_real.cuMemFree_v2 || !g_real.cuCtxGetDevice) {
      load_error = "libcuda.so.1 lacks cuMemAlloc_v2/cuMemFree_v2/cuCtxGetDevice";
      return;
    }
    fill_table();
    g_handle = handle;
  });
  if (!g_handle) {
    error = load_error;
    return nullptr;
  }
  return &g_table;
}

void* real_driver_handle() { return g_handle; }

}  // namespace allocshim
