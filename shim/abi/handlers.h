// What the handler files share (handlers.cpp, handlers_ipc.cpp, handlers_contexts.cpp): the
// CUresult of the core's Result, and the call forwarded to the real entry point.
#pragma once

#include "abi/hooks.h"
#include "base/types.h"

namespace allocshim::abi::handler {

inline CUresult to_cu(Result r) { return static_cast<CUresult>(r); }

// Calls the real entry point, which exists whenever libcuda does; a program can only reach a hook
// without libcuda by calling through a stale pointer, and gets an error rather than a crash.
template <class Fn, class... Args>
CUresult forward(Fn fn, Args... args) {
  return fn ? fn(args...) : CUDA_ERROR_NOT_INITIALIZED;
}

}  // namespace allocshim::abi::handler
