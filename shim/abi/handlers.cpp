// The handler behind each exported wrapper: convert the driver's arguments, call the core, return
// its CUresult. When the core is unavailable (no usable driver table) the call is forwarded as is.
#include <cstring>

#include "abi/hooks.h"
#include "base/clock.h"
#include "core/core.h"
#include "ipc/ipc.h"

namespace allocshim::abi::handler {
namespace {

CUresult to_cu(Result r) { return static_cast<CUresult>(r); }

// Calls the real entry point, which exists whenever libcuda does; a program can only reach a hook
// without libcuda by calling through a stale pointer, and gets an error rather than a crash.
template <class Fn, class... Args>
CUresult forward(Fn fn, Args... args) {
  return fn ? fn(args...) : CUDA_ERROR_NOT_INITIALIZED;
}

// A null stream means the legacy default stream for the plain variants and the calling thread's
// default stream for _ptsz ones: make that explicit so the core and backends never need to know
// which variant they were reached through.
Stream legacy(CUstream s) { return s ? static_cast<Stream>(s) : kStreamLegacy; }
Stream per_thread(CUstream s) { return s ? static_cast<Stream>(s) : kStreamPerThread; }

CUresult alloc(Api api, CUdeviceptr* dptr, size_t bytes, Stream stream = kStreamLegacy,
               CUmemoryPool pool = nullptr) {
  Core* core = process_core();
  if (!core) return CUDA_ERROR_NOT_INITIALIZED;
  AllocRequest req;
  req.size = bytes;
  req.api = api;
  req.stream = stream;
  req.pool = pool;
  return to_cu(core->alloc(req, reinterpret_cast<DevPtr*>(dptr)));
}

CUresult free_block(CUdeviceptr ptr, bool async, Stream stream) {
  Core* core = process_core();
  if (!core) return CUDA_ERROR_NOT_INITIALIZED;
  return to_cu(core->free(ptr, FreeRequest{stream, async}));
}

Location to_location(const CUmemLocation& l) {
  Location out;
  out.id = l.id;
  switch (l.type) {
    case CU_MEM_LOCATION_TYPE_HOST: out.type = Location::Type::host; break;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: out.type = Location::Type::host_numa; break;
    default: out.type = Location::Type::device; break;
  }
  return out;
}

}  // namespace

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return alloc(Api::alloc, dptr, bytesize);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                            unsigned int element) {
  Core* core = process_core();
  if (!core) return CUDA_ERROR_NOT_INITIALIZED;
  AllocRequest req;
  req.api = Api::pitch;
  req.size = width * height;
  req.pitch_width = width;
  req.pitch_height = height;
  req.pitch_element = element;
  req.pitch_out = pitch;
  return to_cu(core->alloc(req, reinterpret_cast<DevPtr*>(dptr)));
}

CUresult cuMemFree_v2(CUdeviceptr dptr) { return free_block(dptr, false, kStreamLegacy); }

CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  Core* core = process_core();
  if (!core) return CUDA_ERROR_NOT_INITIALIZED;
  AllocRequest req;
  req.size = bytesize;
  req.api = Api::managed;
  req.flags = flags;
  return to_cu(core->alloc(req, reinterpret_cast<DevPtr*>(dptr)));
}

CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return alloc(Api::async, dptr, bytesize, legacy(stream));
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return alloc(Api::async, dptr, bytesize, per_thread(stream));
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream stream) {
  return alloc(Api::async, dptr, bytesize, legacy(stream), pool);
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream stream) {
  return alloc(Api::async, dptr, bytesize, per_thread(stream), pool);
}
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  return free_block(dptr, true, legacy(stream));
}
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  return free_block(dptr, true, per_thread(stream));
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
  Core* core = process_core();
  if (!core || !prop) return forward(real::cuMemCreate, handle, size, prop, flags);
  struct Request {
    CUmemGenericAllocationHandle* handle;
    size_t size;
    const CUmemAllocationProp* prop;
    unsigned long long flags;
  } request{handle, size, prop, flags};
  // Where the core decided the request goes: as the program made it, or at another location.
  const Core::MakeCreate make = [](void* ctx, const Location* at, bool plain) -> Result {
    const Request& q = *static_cast<const Request*>(ctx);
    if (!at) return forward(real::cuMemCreate, q.handle, q.size, q.prop, q.flags);
    CUmemAllocationProp moved = *q.prop;
    moved.location.type = at->type == Location::Type::host_numa ? CU_MEM_LOCATION_TYPE_HOST_NUMA
                          : at->type == Location::Type::host    ? CU_MEM_LOCATION_TYPE_HOST
                                                                : CU_MEM_LOCATION_TYPE_DEVICE;
    moved.location.id = at->id;
    if (plain) {
      moved.allocFlags.gpuDirectRDMACapable = 0;
      moved.allocFlags.compressionType = 0;
    }
    return forward(real::cuMemCreate, q.handle, q.size, &moved, q.flags);
  };
  const bool device_flags =
      prop->allocFlags.gpuDirectRDMACapable || prop->allocFlags.compressionType;
  return to_cu(
      core->create(handle, size, to_location(prop->location), device_flags, make, &request));
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  const CUresult r = forward(real::cuMemRelease, handle);
  if (r == CUDA_SUCCESS)
    if (Core* core = process_core()) core->on_released(handle);
  return r;
}

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  Core* core = process_core();
  return core ? to_cu(core->mem_get_info(free, total))
              : forward(real::cuMemGetInfo_v2, free, total);
}

// Sub-allocated memory: the enclosing range is the block the program was given, not the shim's
// larger driver allocation (see docs/architecture.md, "Pointer queries").
CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr dptr) {
  Core* core = process_core();
  DevPtr b = 0;
  std::size_t s = 0;
  if (core && core->find_block(dptr, &b, &s)) {
    if (base) *base = b;
    if (size) *size = s;
    return CUDA_SUCCESS;
  }
  return forward(real::cuMemGetAddressRange_v2, base, size, dptr);
}

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  const CUresult r = forward(real::cuPointerGetAttribute, data, attribute, ptr);
  if (r != CUDA_SUCCESS || !data) return r;
  if (attribute != CU_POINTER_ATTRIBUTE_RANGE_START_ADDR &&
      attribute != CU_POINTER_ATTRIBUTE_RANGE_SIZE)
    return r;
  Core* core = process_core();
  DevPtr b = 0;
  std::size_t s = 0;
  if (core && core->find_block(ptr, &b, &s)) {
    if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
      *static_cast<CUdeviceptr*>(data) = b;
    else
      *static_cast<size_t*>(data) = s;
  }
  return r;
}

CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                                CUdeviceptr ptr) {
  const CUresult r = forward(real::cuPointerGetAttributes, count, attributes, data, ptr);
  if (r != CUDA_SUCCESS || !attributes || !data) return r;
  Core* core = process_core();
  DevPtr b = 0;
  std::size_t s = 0;
  if (!core || !core->find_block(ptr, &b, &s)) return r;
  for (unsigned i = 0; i < count; ++i) {
    if (!data[i]) continue;
    if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
      *static_cast<CUdeviceptr*>(data[i]) = b;
    if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_SIZE) *static_cast<size_t*>(data[i]) = s;
  }
  return r;
}

// IPC (shim/ipc, docs/ipc.md): memory a shim backend serves gets the shim's own handle, which the
// importer's shim maps; native memory, driver handles and pointers not opened from a shim handle go
// to the driver untouched, through the variant the program called.
CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  Core* core = process_core();
  if (core && handle) {
    IpcHandle h;
    bool passthrough = true;
    const Result r = ipc::get_mem_handle(*core, dptr, &h, &passthrough);
    if (!passthrough) {
      if (r == res::ok) std::memcpy(handle, &h, sizeof h);
      return to_cu(r);
    }
  }
  return forward(real::cuIpcGetMemHandle, handle, dptr);
}

namespace {
// A shim handle is opened by the shim; *passthrough otherwise.
CUresult open_shim_handle(CUdeviceptr* dptr, const CUipcMemHandle& handle, unsigned flags,
                          bool* passthrough) {
  *passthrough = true;
  Core* core = process_core();
  if (!core) return CUDA_SUCCESS;
  IpcHandle h;
  static_assert(sizeof h == sizeof handle);
  std::memcpy(&h, &handle, sizeof h);
  DevPtr out = 0;
  const Result r = ipc::open_mem_handle(*core, h, flags, &out, passthrough);
  if (!*passthrough && r == res::ok && dptr) *dptr = out;
  return to_cu(r);
}
}  // namespace

CUresult cuIpcOpenMemHandle(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags) {
  bool passthrough = true;
  const CUresult r = open_shim_handle(dptr, handle, flags, &passthrough);
  return passthrough ? forward(real::cuIpcOpenMemHandle, dptr, handle, flags) : r;
}
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags) {
  bool passthrough = true;
  const CUresult r = open_shim_handle(dptr, handle, flags, &passthrough);
  return passthrough ? forward(real::cuIpcOpenMemHandle_v2, dptr, handle, flags) : r;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  if (Core* core = process_core()) {
    bool passthrough = true;
    const Result r = ipc::close_mem_handle(*core, dptr, &passthrough);
    if (!passthrough) return to_cu(r);
  }
  return forward(real::cuIpcCloseMemHandle, dptr);
}

CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  const CUresult r = forward(real::cuStreamCreate, stream, flags);
  if (r == CUDA_SUCCESS && stream)
    if (Core* core = process_core()) core->on_stream_created(*stream, flags);
  return r;
}

CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int priority) {
  const CUresult r = forward(real::cuStreamCreateWithPriority, stream, flags, priority);
  if (r == CUDA_SUCCESS && stream)
    if (Core* core = process_core()) core->on_stream_created(*stream, flags);
  return r;
}

CUresult cuStreamDestroy_v2(CUstream stream) {
  if (Core* core = process_core()) core->on_stream_destroyed(stream);
  return forward(real::cuStreamDestroy_v2, stream);
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  const CUresult r = forward(real::cuDevicePrimaryCtxRetain, pctx, dev);
  if (r == CUDA_SUCCESS && pctx != nullptr)
    if (Core* core = process_core()) core->after_primary_retain(dev, *pctx);
  return r;
}

// Both variants take the same arguments and reset the same way; each forwards to itself.
CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  if (Core* core = process_core()) core->on_primary_reset(dev);
  return forward(real::cuDevicePrimaryCtxReset, dev);
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  if (Core* core = process_core()) core->on_primary_reset(dev);
  return forward(real::cuDevicePrimaryCtxReset_v2, dev);
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  Core* core = process_core();
  Context ctx = core ? core->primary_context(dev) : nullptr;
  const CUresult r = forward(real::cuDevicePrimaryCtxRelease_v2, dev);
  if (core && r == CUDA_SUCCESS) core->after_primary_release(dev, ctx);
  return r;
}

CUresult cuCtxDestroy(CUcontext ctx) {
  if (Core* core = process_core()) core->on_context_destroy(ctx);
  return forward(real::cuCtxDestroy, ctx);
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
  if (Core* core = process_core()) core->on_context_destroy(ctx);
  return forward(real::cuCtxDestroy_v2, ctx);
}

// The program's synchronizations: a context synchronization completes `barrier` frees made before
// it began (numbered before the real call), and each is a safe point for migration. The core runs
// them after the driver returned (what the program waited for is done), and only on success, with
// how long the program waited there (two rdtsc: a process waiting for its own work is using the
// device, one polling an idle device is not).
CUresult cuCtxSynchronize() {
  Core* core = process_core();
  const Core::Syncing syncing(core);
  const std::uint64_t sync = core ? core->before_context_sync() : 0;
  const std::uint64_t t0 = clock::ticks();
  const CUresult r = forward(real::cuCtxSynchronize);
  if (r == CUDA_SUCCESS && core) core->after_context_sync(sync, clock::to_ns(clock::ticks() - t0));
  return r;
}

CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  Core* core = process_core();
  const Core::Syncing syncing(core);
  const std::uint64_t sync = core ? core->before_context_sync() : 0;
  const std::uint64_t t0 = clock::ticks();
  const CUresult r = forward(real::cuCtxSynchronize_v2, ctx);
  const std::uint64_t waited = clock::ticks() - t0;
  if (r != CUDA_SUCCESS) return r;
  Context current = nullptr;
  // Another context than the current one is not the one the core serves from: nothing to report.
  if (core && (ctx == nullptr || (core->driver().ctx_get_current(&current) == res::ok &&
                                  current == static_cast<Context>(ctx))))
    core->after_context_sync(sync, clock::to_ns(waited));
  return r;
}

CUresult cuStreamSynchronize(CUstream stream) {
  const Core::Syncing syncing(process_core());
  const std::uint64_t t0 = clock::ticks();
  const CUresult r = forward(real::cuStreamSynchronize, stream);
  if (r == CUDA_SUCCESS)
    if (Core* core = process_core()) core->after_partial_sync(clock::to_ns(clock::ticks() - t0));
  return r;
}

CUresult cuStreamSynchronize_ptsz(CUstream stream) {
  const Core::Syncing syncing(process_core());
  const std::uint64_t t0 = clock::ticks();
  const CUresult r = forward(real::cuStreamSynchronize_ptsz, stream);
  if (r == CUDA_SUCCESS)
    if (Core* core = process_core()) core->after_partial_sync(clock::to_ns(clock::ticks() - t0));
  return r;
}

CUresult cuEventSynchronize(CUevent event) {
  const Core::Syncing syncing(process_core());
  const std::uint64_t t0 = clock::ticks();
  const CUresult r = forward(real::cuEventSynchronize, event);
  if (r == CUDA_SUCCESS)
    if (Core* core = process_core()) core->after_partial_sync(clock::to_ns(clock::ticks() - t0));
  return r;
}

CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  Core* core = process_core();
  return core ? to_cu(core->enable_peer_access(peer, flags))
              : forward(real::cuCtxEnablePeerAccess, peer, flags);
}

CUresult cuModuleUnload(CUmodule module) {
  const CUresult r = forward(real::cuModuleUnload, module);
  if (r == CUDA_SUCCESS)
    if (Core* core = process_core()) core->on_module_unloaded();
  return r;
}

CUresult cuLibraryUnload(CUlibrary library) {
  const CUresult r = forward(real::cuLibraryUnload, library);
  if (r == CUDA_SUCCESS)
    if (Core* core = process_core()) core->on_module_unloaded();
  return r;
}

CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  Core* core = process_core();
  return core ? to_cu(core->host_alloc(pp, bytesize, flags, true))
              : forward(real::cuMemHostAlloc, pp, bytesize, flags);
}

CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  Core* core = process_core();
  return core ? to_cu(core->host_alloc(pp, bytesize, 0, false))
              : forward(real::cuMemAllocHost_v2, pp, bytesize);
}

CUresult cuMemFreeHost(void* p) {
  Core* core = process_core();
  return core ? to_cu(core->host_free(p)) : forward(real::cuMemFreeHost, p);
}

}  // namespace allocshim::abi::handler
