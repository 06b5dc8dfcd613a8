// `vmm`: a growable region per device built on the driver's virtual memory management.
//
// Layers (each its own file):
//   vmm_region  reserved VA ranges, physical chunks (a handle and a mapping each) mapped on demand,
//               wholly free chunks moved where growth needs them before any memory is created,
//               and released past the release threshold or when memory is short, never in use;
//   vmm_heap    best fit with coalescing over the reserved ranges, for blocks above 16 KiB;
//   vmm_small   32 size classes up to 16 KiB, carved in slabs from the heap;
//   vmm_cache   per-thread caches of freed blocks: a free with nothing to wait for parks its block,
//               and the thread's next request that fits takes it back without the lock (exact
//               sizes; size classes up to 4 MiB once a second thread allocates);
//   free_sync   what a free waits for before its block is reused (device / barrier / none).
// This file ties them together per device, behind one mutex per device (not taken by a cache hit).
// Blocks below a quarter
// chunk (slabs included) and larger blocks come from two heaps over separate VA ranges, so small
// blocks do not pin chunks among large ones (tests/unit/vmm_test.cpp bounds peak reserved / peak
// live for a training loop, alloc_latency --mixed and random lifetimes).
//
// Guarantees: every block is 256-byte aligned and a multiple of 256 bytes; blocks never overlap;
// a block is usable from any stream when the call returns (its chunks are mapped and access is set
// before it is handed out), also for api = "async" requests; a pool hit makes no driver call
// (`none`), or one event query per call (`barrier`); a miss makes a cuMemCreate and a cuMemMap per
// chunk it maps (a larger `chunk` means fewer), one cuMemSetAccess per run. cuMemFreeAsync waits for
// its stream. The VA reserved per range is `reserve` or, by default, twice the device's memory; more
// ranges are reserved when it runs out. Out of memory: pending frees are waited for, empty slabs and free chunks go
// back to the driver, and the request is retried once; then cuMemCreate's error is returned.
//
// Pointer queries: find() answers with the enclosing block's base and its size rounded up to its
// size class (or to 256 bytes above 16 KiB), where cuMemGetAddressRange would give the whole
// allocation; the driver itself sees only the mapped chunks.
#pragma once

#include <memory>
#include <string>

#include "core/backend.h"
#include "base/streams.h"
#include "policy/policy.h"

namespace allocshim {

std::unique_ptr<Backend> make_vmm_backend(const policy::BackendSpec& spec, const Driver& driver,
                                          StreamTracker& streams, std::string& error);

// Introspection for tests and the summary (0 for another kind or an unused device).
struct VmmInfo {
  std::size_t va_bytes = 0;        // reserved address space
  std::size_t mapped_bytes = 0;    // physical memory mapped
  std::size_t free_bytes = 0;      // of the reserved memory, wholly free chunks and cached handles
  std::size_t segments = 0;        // live mappings
  std::size_t slabs = 0;           // small-class slabs
  std::size_t pending = 0;         // frees waiting for their events
  std::size_t events = 0;          // events created for barriers
  std::uint64_t epochs = 0;        // barrier epochs closed with events
  std::size_t parked = 0;          // freed blocks in the thread caches (vmm_cache.h)
  std::size_t parked_bytes = 0;    // their bytes
  std::size_t central = 0;         // of the parked blocks, those in the central lists (no thread's)
  std::uint64_t locked_calls = 0;  // allocations and frees that took the device lock
  bool classed = false;            // the thread caches use size classes (a second thread came)
  std::uint64_t creates = 0;       // cuMemCreate calls
  std::size_t heap_free_blocks = 0;
  std::size_t chunk = 0;
};
VmmInfo vmm_info(const Backend& backend, int device);

}  // namespace allocshim
