// `host`: pinned host memory mapped into the device's address space (zero-copy), and the budget's
// spill target that mixes device and host chunks in one range.
//
// Each allocation gets a VA range of its own (its size rounded up to the granularity, 2 MiB), backed
// by physical memory from cuMemCreate and mapped with cuMemMap; the device (and every peer the
// program enabled) is granted read-write access before the address is handed out, so the memory is
// usable from any stream when the call returns. Host chunks are created with location HOST_NUMA and
// the id from CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID (what also reaches EGM on Grace systems; node 0 where
// the host has no NUMA id), or location HOST where the device has no HOST_NUMA VMM support. Device
// kernels read them over the link, far slower than device memory (docs/oversubscription.md).
//
// Two flavours:
//   - `host` as a policy kind: the whole allocation on the host, one physical allocation for it.
//   - the spill target (make_spill_host_backend): the allocation's first chunks are device chunks up
//     to what the core claimed from the budget for it, the rest host chunks, one per 2 MiB so
//     that each can later be promoted on its own. A 12 GiB request with 8 GiB of room is one range
//     whose first 8 GiB read at device speed.
//
// Migration (migrate = "promote" / "auto", host_migrate.cpp): the spill target implements
// placement/movable.h, the mechanism; what moves and when is placement/migration.h's. Pieces move between
// device and host memory at the same virtual address, with the launch gate closed. The
// device part of a range is mapped in pieces of at most 64 MiB so that demotion frees room in
// bounded steps. The host pieces a promotion frees are kept (the host reserve, up to
// [backends.host] host_reserve bytes) for the next demotion or spill of the same size, which then
// pins nothing.
//
// Out of memory midway (cuMemCreate or cuMemMap refused): everything mapped for the request is
// unmapped and released, and the driver's error is returned (the core gives the claim back).
// Frees wait as cudaFree does (free_sync device or barrier: the context is synchronized; async:
// the stream), since unmapping memory a kernel still reads would fault.
#pragma once

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
// The spill target's host side ([backends.host]) under the migrate mode in effect: what it pins
// with how many threads, what its host reserve keeps, whether it pins ahead. Ignored by the `host`
// kind, which moves nothing.
void set_host_side(Backend& spill, const policy::BackendSpec& host_side,
                   policy::Budget::Migrate mode);

}  // namespace allocshim
