// Compile-time proof that the core's cuda.h-free vocabulary matches the driver's (the
// interception_type_test idea from compiler-rt): a drift breaks the build, not a program.
#include <cuda.h>

#include "placement/use_tracker.h"

#include <type_traits>

#include "base/driver.h"
#include "base/types.h"

namespace allocshim {

static_assert(std::is_same_v<DevPtr, CUdeviceptr>);
static_assert(std::is_same_v<MemHandle, CUmemGenericAllocationHandle>);
static_assert(sizeof(MemHandle) == sizeof(CUmemGenericAllocationHandle));
static_assert(sizeof(Stream) == sizeof(CUstream) && sizeof(Event) == sizeof(CUevent));
static_assert(sizeof(Pool) == sizeof(CUmemoryPool) && sizeof(Context) == sizeof(CUcontext));
static_assert(sizeof(IpcHandle) == sizeof(CUipcMemHandle));
static_assert(sizeof(Result) == sizeof(CUresult));

static_assert(res::ok == CUDA_SUCCESS);
static_assert(res::invalid_value == CUDA_ERROR_INVALID_VALUE);
static_assert(res::out_of_memory == CUDA_ERROR_OUT_OF_MEMORY);
static_assert(res::not_initialized == CUDA_ERROR_NOT_INITIALIZED);
static_assert(res::deinitialized == CUDA_ERROR_DEINITIALIZED);
static_assert(res::no_device == CUDA_ERROR_NO_DEVICE);
static_assert(res::invalid_device == CUDA_ERROR_INVALID_DEVICE);
static_assert(res::invalid_context == CUDA_ERROR_INVALID_CONTEXT);
static_assert(res::context_is_destroyed == CUDA_ERROR_CONTEXT_IS_DESTROYED);
static_assert(res::map_failed == CUDA_ERROR_MAP_FAILED);
static_assert(res::invalid_handle == CUDA_ERROR_INVALID_HANDLE);
static_assert(res::not_found == CUDA_ERROR_NOT_FOUND);
static_assert(res::not_ready == CUDA_ERROR_NOT_READY);
static_assert(res::peer_access_already_enabled == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
static_assert(res::not_supported == CUDA_ERROR_NOT_SUPPORTED);
static_assert(res::unknown == CUDA_ERROR_UNKNOWN);

// kStreamLegacy / kStreamPerThread are pointer constants (not constant expressions): handlers.cpp
// uses the cuda.h macros' values 0x1 and 0x2, documented in cuda.h as stable ABI.
static_assert(kStreamNonBlocking == CU_STREAM_NON_BLOCKING);
static_assert(kEventDisableTiming == CU_EVENT_DISABLE_TIMING);

static_assert(static_cast<int>(Advice::set_read_mostly) == CU_MEM_ADVISE_SET_READ_MOSTLY);
static_assert(static_cast<int>(Advice::unset_read_mostly) == CU_MEM_ADVISE_UNSET_READ_MOSTLY);
static_assert(static_cast<int>(Advice::set_preferred_location) ==
              CU_MEM_ADVISE_SET_PREFERRED_LOCATION);
static_assert(static_cast<int>(Advice::unset_preferred_location) ==
              CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION);
static_assert(static_cast<int>(Advice::set_accessed_by) == CU_MEM_ADVISE_SET_ACCESSED_BY);
static_assert(static_cast<int>(Advice::unset_accessed_by) == CU_MEM_ADVISE_UNSET_ACCESSED_BY);

static_assert(UseTracker::kParamEnd == CU_LAUNCH_PARAM_END_AS_INT);
static_assert(UseTracker::kParamBufferPointer == CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT);
static_assert(UseTracker::kParamBufferSize == CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT);

}  // namespace allocshim
