// The handlers of legacy IPC handles (cuIpc*).
#include <cstring>

#include "abi/handlers.h"
#include "core/core.h"
#include "ipc/ipc.h"

namespace allocshim::abi::handler {

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

}  // namespace allocshim::abi::handler
