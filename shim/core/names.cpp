// Names of the core's enums, as they appear in policies, summaries and traces. The policy library
// owns the spelling (a policy file and a summary must agree); the core only forwards to it.
#include "core/types.h"
#include "policy/policy.h"

namespace allocshim {

const char* api_name(Api api) { return policy::api_text(api); }
const char* backend_kind_name(BackendKind kind) { return policy::kind_name(kind); }
const char* free_sync_name(FreeSync sync) { return policy::free_sync_text(sync); }

}  // namespace allocshim
