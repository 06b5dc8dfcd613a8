// The driver's vocabulary as the core, the backends, the driver table and the tools name it, with
// the policy's (policy/types.h) beneath it.
//
// The core deliberately does not include cuda.h: it is compiled and unit-tested against a fake
// driver on machines without CUDA, and the hook layer (shim/abi) is the only place that converts
// between these types and the driver's own. shim/abi/type_check.cpp static_asserts that the values
// below match cuda.h, so a drift is a compile error, not a silent misbehaviour.
#pragma once

#include <cstddef>
#include <cstdint>

#include "policy/types.h"

namespace allocshim {

// A CUresult. Kept as a plain int so the core can return driver codes unchanged.
using Result = int;
namespace res {
inline constexpr Result ok = 0;
inline constexpr Result invalid_value = 1;
inline constexpr Result out_of_memory = 2;
inline constexpr Result not_initialized = 3;
inline constexpr Result deinitialized = 4;
inline constexpr Result no_device = 100;
inline constexpr Result invalid_device = 101;
inline constexpr Result invalid_context = 201;
inline constexpr Result map_failed = 205;
inline constexpr Result invalid_handle = 400;
inline constexpr Result not_found = 500;
inline constexpr Result not_ready = 600;
inline constexpr Result peer_access_already_enabled = 704;
inline constexpr Result context_is_destroyed = 709;
inline constexpr Result not_supported = 801;
inline constexpr Result unknown = 999;
}  // namespace res

using DevPtr = unsigned long long;     // CUdeviceptr (same type, so pointers convert without casts)
using Stream = void*;                  // CUstream
using Event = void*;                   // CUevent
using Pool = void*;                    // CUmemoryPool
using Context = void*;                 // CUcontext
using MemHandle = unsigned long long;  // CUmemGenericAllocationHandle

// Special stream handles (CU_STREAM_LEGACY / CU_STREAM_PER_THREAD). The hook layer rewrites a null
// stream into one of these according to the entry-point variant the program called (plain or _ptsz),
// so the core and the backends never have to know which variant they were reached through.
inline Stream const kStreamLegacy = reinterpret_cast<Stream>(0x1);
inline Stream const kStreamPerThread = reinterpret_cast<Stream>(0x2);

// Where physical memory lives (CUmemLocation).
struct Location {
  enum class Type : std::uint8_t { device, host, host_numa };
  Type type = Type::device;
  int id = 0;
};

inline constexpr std::size_t kIpcHandleBytes = 64;  // sizeof(CUipcMemHandle)
struct IpcHandle {
  unsigned char bytes[kIpcHandleBytes];
};

}  // namespace allocshim
