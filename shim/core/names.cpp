// Names of the core's enums, as they appear in policies, summaries and traces.
#include "core/types.h"

namespace allocshim {

const char* api_name(Api api) {
  switch (api) {
    case Api::alloc: return "alloc";
    case Api::pitch: return "pitch";
    case Api::managed: return "managed";
    case Api::async: return "async";
    case Api::host: return "host";
    case Api::create: return "create";
  }
  return "?";
}

const char* backend_kind_name(BackendKind kind) {
  switch (kind) {
    case BackendKind::native: return "native";
    case BackendKind::async_pool: return "async_pool";
    case BackendKind::vmm: return "vmm";
    case BackendKind::managed: return "managed";
    case BackendKind::host: return "host";
  }
  return "?";
}

const char* free_sync_name(FreeSync sync) {
  switch (sync) {
    case FreeSync::device: return "device";
    case FreeSync::barrier: return "barrier";
    case FreeSync::none: return "none";
  }
  return "?";
}

}  // namespace allocshim
