// `managed`: unified memory (cuMemAllocManaged) with advice and prefetch applied on allocation.
//
// Options (policy::BackendSpec): `read_mostly`; `preferred_location` device|host; `accessed_by`
// (the allocating device is advised as an accessor: host-resident pages are mapped for it instead of
// faulting); `prefetch` (to the preferred location, on the request's stream; for cudaMalloc-style
// requests the legacy stream); `stripe`: a fraction f of the allocation's 2 MiB pages is advised
// preferred-location host and the rest device, spread evenly (page i is a host page when
// floor((i+1)f) > floor(if)), with the device advised as accessor of all of them, so a fixed share
// of the range is read over the link and the rest at device speed, with no page migrating back and
// forth. "auto": f = 1 - room/size, the room being what is left under the device's budget (0 when
// the allocation fits, or without a budget). Advice and prefetch use the CUDA 13 forms that take a
// CUmemLocation (cuMemAdvise_v2, cuMemPrefetchAsync_v2 in the driver table); advice the driver
// refuses (a device without concurrent managed access) is ignored: it is a hint.
//
// Safety (docs/design/oversubscription.md): on shared machines UVM eviction can hang the GPU, so this backend never holds
// more managed memory on a device than the driver reports free on it: each request is checked
// against cuMemGetInfo's free bytes minus what every managed backend of the process already holds
// there, and refused with out_of_memory past it. Managed memory is not counted against the device
// budget (the driver places and evicts its pages).
//
// Frees: cuMemFree (which synchronizes); cuMemFreeAsync waits for its stream first.
#pragma once

#include <memory>
#include <string>

#include "core/backend.h"
#include "policy/policy.h"

namespace allocshim {

class Budget;

std::unique_ptr<Backend> make_managed_backend(const policy::BackendSpec& spec, const Driver& driver,
                                              std::string& error);
// The budget's spill target for spill = "managed": managed memory preferring the host, mapped for
// the allocating device (accessed_by), counted in the budget's spill statistics.
std::unique_ptr<Backend> make_spill_managed_backend(const Driver& driver, Budget& budget,
                                                    std::string& error);
// Gives a managed backend the budget it reads for stripe = "auto" (null: none).
void set_managed_budget(Backend& backend, Budget* budget);

}  // namespace allocshim
