// The policy's vocabulary, shared with every layer above it: what a rule matches on (Api, the
// device) and what it chooses (BackendKind, FreeSync). Their spellings are in policy/kinds.cpp.
// The driver's own types (results, pointers, handles) are the core's: base/types.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace allocshim {

// How the program asked for memory. Policies match on it; statistics are split by it.
enum class Api : std::uint8_t {
  alloc,    // cuMemAlloc / cudaMalloc
  pitch,    // cuMemAllocPitch / cudaMallocPitch
  managed,  // cuMemAllocManaged / cudaMallocManaged
  async,    // cuMemAllocAsync / cuMemAllocFromPoolAsync / cudaMallocAsync
  host,     // cuMemHostAlloc / cuMemAllocHost (accounting only)
  create,   // the program's own cuMemCreate (accounting only)
};
inline constexpr int kApiCount = 6;
const char* api_name(Api api);

enum class BackendKind : std::uint8_t { native, async_pool, vmm, managed, host };
inline constexpr int kBackendKindCount = 5;
const char* backend_kind_name(BackendKind kind);

// What a free must guarantee before the block may be handed out again (see docs/architecture.md).
enum class FreeSync : std::uint8_t {
  device,   // synchronize the context at free, as cuMemFree does
  barrier,  // reuse only after events recorded at free on every live stream have completed
  none,     // reuse at once: for programs that synchronize themselves
};
const char* free_sync_name(FreeSync sync);

// Device ids a rule may name; the core's per-device tables have as many entries.
inline constexpr std::size_t kMaxDevices = 64;

}  // namespace allocshim
