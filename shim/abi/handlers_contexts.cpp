// The handlers of what the core watches without serving it: streams, contexts and modules coming
// and going, the program's synchronizations, peer access. Each calls the driver and tells the core.
#include "abi/handlers.h"
#include "base/clock.h"
#include "core/core.h"

namespace allocshim::abi::handler {

CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  const CUresult r = forward(real::cuStreamCreate, stream, flags);
  if (r == CUDA_SUCCESS && stream)
    if (Core* core = process_core()) core->on_stream_created(*stream, flags);
  return r;
}

CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int priority) {
  const CUresult r = forward(real::cuStreamCreateWithPriority, stream, flags, priority);
  if (r == CUDA_SUCCESS && stream)
    if (Core* core = process_core()) core->on_stream_created(*stream, flags);
  return r;
}

CUresult cuStreamDestroy_v2(CUstream stream) {
  if (Core* core = process_core()) core->on_stream_destroyed(stream);
  return forward(real::cuStreamDestroy_v2, stream);
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  const CUresult r = forward(real::cuDevicePrimaryCtxRetain, pctx, dev);
  if (r == CUDA_SUCCESS && pctx != nullptr)
    if (Core* core = process_core()) core->after_primary_retain(dev, *pctx);
  return r;
}

// Both variants take the same arguments and reset the same way; each forwards to itself.
CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  if (Core* core = process_core()) core->on_primary_reset(dev);
  return forward(real::cuDevicePrimaryCtxReset, dev);
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  if (Core* core = process_core()) core->on_primary_reset(dev);
  return forward(real::cuDevicePrimaryCtxReset_v2, dev);
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  Core* core = process_core();
  Context ctx = core ? core->primary_context(dev) : nullptr;
  const CUresult r = forward(real::cuDevicePrimaryCtxRelease_v2, dev);
  if (core && r == CUDA_SUCCESS) core->after_primary_release(dev, ctx);
  return r;
}

CUresult cuCtxDestroy(CUcontext ctx) {
  if (Core* core = process_core()) core->on_context_destroy(ctx);
  return forward(real::cuCtxDestroy, ctx);
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
  if (Core* core = process_core()) core->on_context_destroy(ctx);
  return forward(real::cuCtxDestroy_v2, ctx);
}

// The program's synchronizations: a context synchronization completes `barrier` frees made before
// it began (numbered before the real call), and each is a safe point for migration. The core runs
// them after the driver returned (what the program waited for is done), and only on success, with
// how long the program waited there (two rdtsc: a process waiting for its own work is using the
// device, one polling an idle device is not).
CUresult cuCtxSynchronize() {
  Core* core = process_core();
  const Core::Syncing syncing(core);
  const std::uint64_t sync = core ? core->before_context_sync() : 0;
  const std::uint64_t t0 = clock::ticks();
  const CUresult r = forward(real::cuCtxSynchronize);
  if (r == CUDA_SUCCESS && core) core->after_context_sync(sync, clock::to_ns(clock::ticks() - t0));
  return r;
}

CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  Core* core = process_core();
  const Core::Syncing syncing(core);
  const std::uint64_t sync = core ? core->before_context_sync() : 0;
  const std::uint64_t t0 = clock::ticks();
  const CUresult r = forward(real::cuCtxSynchronize_v2, ctx);
  const std::uint64_t waited = clock::ticks() - t0;
  if (r != CUDA_SUCCESS) return r;
  Context current = nullptr;
  // Another context than the current one is not the one the core serves from: nothing to report.
  if (core && (ctx == nullptr || (core->driver().ctx_get_current(&current) == res::ok &&
                                  current == static_cast<Context>(ctx))))
    core->after_context_sync(sync, clock::to_ns(waited));
  return r;
}

// A synchronization of part of the context's work (a stream, an event): the core may move memory
// after it, given how long the program waited.
template <class Fn, class Arg>
CUresult partial_sync(Fn fn, Arg arg) {
  const Core::Syncing syncing(process_core());
  const std::uint64_t t0 = clock::ticks();
  const CUresult r = forward(fn, arg);
  if (r == CUDA_SUCCESS)
    if (Core* core = process_core()) core->after_partial_sync(clock::to_ns(clock::ticks() - t0));
  return r;
}

CUresult cuStreamSynchronize(CUstream stream) {
  return partial_sync(real::cuStreamSynchronize, stream);
}

CUresult cuStreamSynchronize_ptsz(CUstream stream) {
  return partial_sync(real::cuStreamSynchronize_ptsz, stream);
}

CUresult cuEventSynchronize(CUevent event) { return partial_sync(real::cuEventSynchronize, event); }

CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  Core* core = process_core();
  return core ? to_cu(core->enable_peer_access(peer, flags))
              : forward(real::cuCtxEnablePeerAccess, peer, flags);
}

CUresult cuModuleUnload(CUmodule module) {
  const CUresult r = forward(real::cuModuleUnload, module);
  if (r == CUDA_SUCCESS)
    if (Core* core = process_core()) core->on_module_unloaded();
  return r;
}

CUresult cuLibraryUnload(CUlibrary library) {
  const CUresult r = forward(real::cuLibraryUnload, library);
  if (r == CUDA_SUCCESS)
    if (Core* core = process_core()) core->on_module_unloaded();
  return r;
}

}  // namespace allocshim::abi::handler
