// `host`: pinned host memory mapped into the device's address space (zero-copy), and the budget's
// spill target that mixes device and host chunks in one range.
//
// Each allocation gets a VA range of its own (its size rounded up to the granularity, 2 MiB), backed
// by physical memory from cuMemCreate and mapped with cuMemMap; the device (and every peer the
// program enabled) is granted read-write access before the address is handed out, so the memory is
// usable from any stream when the call returns. Host chunks are created with location HOST_NUMA and
// the id from CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID (what also reaches EGM on Grace systems), or
// location HOST where the device reports no NUMA id or no HOST_NUMA VMM support. Device kernels read
// them over the link (~51 GB/s on an H100 PCIe gen5 against 2.3 TB/s for device memory).
//
// Two flavours:
//   - `host` as a policy kind: the whole allocation on the host, one physical allocation for it.
//   - the spill target (make_spill_host_backend): the allocation's first chunks are device chunks up
//     to what is left under the budget (claimed from it), the rest host chunks, one per 2 MiB so
//     that each can later be promoted on its own. A 12 GiB request with 8 GiB of room is one range
//     whose first 8 GiB read at device speed.
//
// Promotion (migrate = "promote", promote_host_chunks): when frees return room under the budget,
// host chunks are moved to device memory at the same virtual address: the device is synchronized
// (work issued before is done), the chunk is copied into a new device chunk mapped at a scratch
// address, the device is synchronized again, then the host chunk is unmapped and the device chunk
// mapped in its place with the same access. Addresses the program holds never change. A kernel
// issued by another thread *while* a promotion runs could touch the range between unmap and map:
// promotion runs from a synchronous cuMemFree (never cuMemFreeAsync), which a program issuing
// work concurrently from another thread on the same memory would not expect to be safe either.
//
// Out of memory midway (cuMemCreate or cuMemMap refused): everything mapped for the request is
// unmapped and released, the budget's claim is returned, and the driver's error is returned.
// Frees wait as cudaFree does (free_sync device or barrier: the context is synchronized; async:
// the stream), since unmapping memory a kernel still reads would fault.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/backend.h"
#include "policy/policy.h"

namespace allocshim {

class Budget;

std::unique_ptr<Backend> make_host_backend(const policy::BackendSpec& spec, const Driver& driver,
                                           std::string& error);
std::unique_ptr<Backend> make_spill_host_backend(const Driver& driver, Budget& budget,
                                                 std::string& error);

// Bytes of `device`'s allocations that live in host chunks (0 for another kind).
std::size_t host_spilled_bytes(const Backend& backend, int device);
// Moves host chunks of `device` back to device memory while the budget has room; returns the bytes
// moved. Spill backends only (0 otherwise).
std::size_t promote_host_chunks(Backend& backend, int device);

// Introspection for tests.
struct HostInfo {
  std::size_t allocations = 0;
  std::size_t device_bytes = 0;   // device chunks mapped
  std::size_t host_bytes = 0;     // host chunks mapped
  std::size_t mappings = 0;       // cuMemMap'ed pieces
  std::size_t promoted_bytes = 0;
  Location host_location;
};
HostInfo host_info(const Backend& backend, int device);

}  // namespace allocshim
