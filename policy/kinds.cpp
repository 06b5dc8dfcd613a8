// Which backend kinds this build implements, and the names of the enums a policy spells out.
//
// kind_implemented() is the one place that says which kinds exist in this build. A policy naming
// a kind that is not implemented is rejected when loaded (never silently served natively), so
// each backend issue flips its kind here as it lands, together with the backend itself.
#include "policy/policy.h"

namespace allocshim::policy {

bool kind_implemented(BackendKind kind) {
  switch (kind) {
    // Backend issues flip these as they land.
    case BackendKind::native: return true;
    case BackendKind::async_pool: return true;
    case BackendKind::vmm: return true;
    case BackendKind::managed: return true;
    case BackendKind::host: return true;
  }
  return false;
}

std::uint32_t implemented_kinds() {
  std::uint32_t mask = 0;
  for (int k = 0; k < kBackendKindCount; ++k)
    if (kind_implemented(static_cast<BackendKind>(k))) mask |= 1u << k;
  return mask;
}

}  // namespace allocshim::policy

// The enums' spellings live with the policy: a policy file and a summary must agree.
namespace allocshim {

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

}  // namespace allocshim
