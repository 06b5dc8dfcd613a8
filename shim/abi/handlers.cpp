// The handler behind each exported wrapper: convert the driver's arguments, call the core, return
// its CUresult. When the core is unavailable (no usable driver table) the call is forwarded as is.
// This file: allocations and frees of every kind, VMM creation, memory info and pointer queries;
// handlers_ipc.cpp: IPC handles; handlers_contexts.cpp: contexts, streams, synchronizations.
#include "abi/handlers.h"
#include "core/core.h"

namespace allocshim::abi::handler {
namespace {

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
