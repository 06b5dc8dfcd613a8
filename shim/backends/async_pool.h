// `async_pool`: allocations served from stream-ordered CUDA memory pools the shim owns, one per
// device (the device's default pool, which frameworks reconfigure, is never touched).
//
// How cudaMalloc semantics are kept on a stream-ordered pool:
// - Synchronous requests (cuMemAlloc and friends) allocate on an internal non-blocking stream of
//   the shim's. Nothing the program does is ever ordered on that stream, and a free reaches it only
//   once the block is idle (see free_sync.h: `device` synchronizes first, `barrier` waits for its
//   events before issuing cuMemFreeAsync there, `none` is the program's promise). So the stream
//   never waits on device work, and a block handed out from it is usable from any stream when the
//   call returns. When the pool had to grow for the request (its reserved size went up), the stream
//   is synchronized once as well, so newly mapped memory is surely in place before it is used.
// - Reuse flags: internal dependencies are turned off (the driver would otherwise hand back a block
//   freed on a program stream with a hidden wait inserted on the internal stream, i.e. not yet
//   usable elsewhere); event-dependency and opportunistic reuse stay on (both only reuse frees
//   that are known complete or already ordered before the allocating stream).
// - Requests routed here with api = "async" allocate on the program's own stream and keep
//   stream-ordered semantics (cuMemAllocFromPoolAsync keeps the program's pool too); cuMemFreeAsync
//   is passed to the driver on the program's stream.
// - `release_threshold` is the pool's CU_MEMPOOL_ATTR_RELEASE_THRESHOLD (default: keep all);
//   `initial` bytes are allocated and freed once per device when the device is first used, with the
//   threshold raised to at least `initial` so they stay reserved; `ipc` creates the pools
//   exportable as POSIX file descriptors.
// - Out of memory: pending frees are waited for, the pool is trimmed, and the request retried
//   once; then the driver's error is returned.
#pragma once

#include <memory>
#include <string>

#include "core/backend.h"
#include "base/streams.h"
#include "policy/policy.h"

namespace allocshim {

std::unique_ptr<Backend> make_async_pool_backend(const policy::BackendSpec& spec,
                                                 const Driver& driver, StreamTracker& streams,
                                                 std::string& error);

}  // namespace allocshim
