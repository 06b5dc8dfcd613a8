// IPC as the hook layer sees it: the three cuIpc*MemHandle calls, on the process's one exporter and
// one importer (created on first use, so nothing listens in a process that never exported), and
// their fork handling. docs/ipc.md describes the whole design.
//
// Every call says when it has nothing to do with the shim (*passthrough): native memory, a handle
// without the shim's magic, a pointer that was not opened from a shim handle. The hook then calls
// the driver's own entry point, untouched.
#pragma once

#include "core/core.h"
#include "base/types.h"

namespace allocshim::ipc {

// cuIpcGetMemHandle.
Result get_mem_handle(Core& core, DevPtr ptr, IpcHandle* out, bool* passthrough);
// cuIpcOpenMemHandle / _v2.
Result open_mem_handle(Core& core, const IpcHandle& handle, unsigned flags, DevPtr* out,
                       bool* passthrough);
// cuIpcCloseMemHandle.
Result close_mem_handle(Core& core, DevPtr ptr, bool* passthrough);

}  // namespace allocshim::ipc
