// Everything generated from hooks.def: real pointers, exported wrappers, the substitution table.
#include "abi/hooks.h"

#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "core/core.h"
#include "placement/migration.h"

#define ALLOCSHIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace allocshim::abi {

thread_local bool t_in_shim __attribute__((tls_model("initial-exec"))) = false;

namespace real {
#define ALLOCSHIM_HOOK(symbol, params, args) CUresult(CUDAAPI* symbol) params = nullptr;
#include "abi/hooks.def"
#undef ALLOCSHIM_HOOK
CUresult(CUDAAPI* cuGetProcAddress)(const char*, void**, int, cuuint64_t) = nullptr;
CUresult(CUDAAPI* cuGetProcAddress_v2)(const char*, void**, int, cuuint64_t,
                                       CUdriverProcAddressQueryResult*) = nullptr;
}  // namespace real

}  // namespace allocshim::abi

namespace allocshim::abi {
namespace {

// The device buffers a 2D/3D copy names (its host or array sides name none).
DevPtr on_device(CUmemorytype type, CUdeviceptr ptr) {
  return type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED ? ptr : 0;
}
template <class Copy>
DevPtr copy_dst(const Copy* c) {
  return c ? on_device(c->dstMemoryType, c->dstDevice) : 0;
}
template <class Copy>
DevPtr copy_src(const Copy* c) {
  return c ? on_device(c->srcMemoryType, c->srcDevice) : 0;
}

// The stream a `_ptsz` launch goes to: its null stream is the calling thread's per-thread stream.
CUstream per_thread(CUstream s) { return s ? s : CU_STREAM_PER_THREAD; }

// A submission while migration may move memory: inside the launch gate from before the driver call
// until it returned, the buffers it names marked as used.
class Submission {
 public:
  explicit Submission(Core* core) : core_(core) {
    if (core_) core_->submit_enter();
  }
  ~Submission() {
    if (core_) core_->submit_leave();
  }
  Submission(const Submission&) = delete;
  Submission& operator=(const Submission&) = delete;
  Core* core() const { return core_; }

 private:
  Core* core_;
};

}  // namespace
}  // namespace allocshim::abi

#define ALLOCSHIM_UNPAREN(...) __VA_ARGS__
#define ALLOCSHIM_CALL_REAL(symbol, args) \
  (real::symbol ? real::symbol args : CUDA_ERROR_NOT_INITIALIZED)

// Submissions call the driver at once unless some core may move memory (one relaxed load);
// otherwise they enter the launch gate (Submission) and name what they use.
#define ALLOCSHIM_SUBMISSION_ENTRY(symbol, args)                           \
  using namespace allocshim::abi;                                          \
  if (__builtin_expect(real::symbol == nullptr, 0)) load_real();           \
  if (__builtin_expect(t_in_shim || !allocshim::submissions_watched(), 1)) \
    return ALLOCSHIM_CALL_REAL(symbol, args);                              \
  Guard guard;                                                             \
  Submission submission(allocshim::process_core());
#define ALLOCSHIM_SUBMIT(symbol, params, args, uses)                             \
  ALLOCSHIM_EXPORT CUresult CUDAAPI symbol params {                              \
    ALLOCSHIM_SUBMISSION_ENTRY(symbol, args)                                     \
    if (submission.core())                                                       \
      for (allocshim::DevPtr p : {allocshim::DevPtr{0}, ALLOCSHIM_UNPAREN uses}) \
        if (p != 0) submission.core()->submit_uses(p);                           \
    return ALLOCSHIM_CALL_REAL(symbol, args);                                    \
  }
// A launch the core times (placement/host_cost.h) gets its end recorded after the driver call.
#define ALLOCSHIM_LAUNCH(symbol, params, args, function, kernel_params, extra, stream)        \
  ALLOCSHIM_EXPORT CUresult CUDAAPI symbol params {                                           \
    ALLOCSHIM_SUBMISSION_ENTRY(symbol, args)                                                  \
    allocshim::Core* const core_ = submission.core();                                         \
    if (!core_) return ALLOCSHIM_CALL_REAL(symbol, args);                                     \
    const auto stream_ = reinterpret_cast<allocshim::Stream>(stream);                         \
    const std::uint32_t timing_ =                                                             \
        core_->launch_uses(reinterpret_cast<void*>(function), kernel_params, extra, stream_); \
    const CUresult result_ = ALLOCSHIM_CALL_REAL(symbol, args);                               \
    if (__builtin_expect(timing_ != 0, 0))                                                    \
      core_->launch_done(timing_, stream_, result_ == CUDA_SUCCESS);                          \
    return result_;                                                                           \
  }

// The exported wrappers. A call from inside the shim (t_in_shim) goes straight to the driver.
#define ALLOCSHIM_HOOK(symbol, params, args)                                                \
  ALLOCSHIM_EXPORT CUresult CUDAAPI symbol params {                                         \
    using namespace allocshim::abi;                                                         \
    /* A program linked with -lcuda may reach any hook first: find libcuda on that call. */ \
    if (__builtin_expect(real::symbol == nullptr, 0)) load_real();                          \
    if (__builtin_expect(t_in_shim, 0))                                                     \
      return real::symbol ? real::symbol args : CUDA_ERROR_NOT_INITIALIZED;                 \
    Guard guard;                                                                            \
    return handler::symbol args;                                                            \
  }
#include "abi/hooks.def"
#undef ALLOCSHIM_HOOK
#undef ALLOCSHIM_SUBMIT
#undef ALLOCSHIM_LAUNCH

// Defined in resolver.cpp.
ALLOCSHIM_EXPORT CUresult CUDAAPI cuGetProcAddress(const char*, void**, int, cuuint64_t);
ALLOCSHIM_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char*, void**, int, cuuint64_t,
                                                      CUdriverProcAddressQueryResult*);

namespace allocshim::abi {
namespace {

struct Entry {
  const char* name;
  void** real;    // where the real address is stored
  void* wrapper;  // the exported wrapper
};

// The lookup table of every substitutable entry point, in hooks.def order.
Entry g_entries[] = {
#define ALLOCSHIM_HOOK(symbol, params, args) \
  {#symbol, reinterpret_cast<void**>(&real::symbol), reinterpret_cast<void*>(&::symbol)},
#include "abi/hooks.def"
#undef ALLOCSHIM_HOOK
    {"cuGetProcAddress", reinterpret_cast<void**>(&real::cuGetProcAddress),
     reinterpret_cast<void*>(&::cuGetProcAddress)},
    {"cuGetProcAddress_v2", reinterpret_cast<void**>(&real::cuGetProcAddress_v2),
     reinterpret_cast<void*>(&::cuGetProcAddress_v2)},
};

std::atomic<bool> g_loaded{false};
std::mutex g_load_mutex;

}  // namespace

bool load_real() {
  if (__builtin_expect(g_loaded.load(std::memory_order_acquire), 1)) return true;
  std::lock_guard lock(g_load_mutex);
  if (g_loaded.load(std::memory_order_relaxed)) return true;
  // RTLD_NOLOAD: the program has loaded libcuda if it is calling into it; the shim never loads it.
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!handle) return false;
  for (Entry& e : g_entries) *e.real = real_dlsym(handle, e.name);
  g_loaded.store(true, std::memory_order_release);
  return true;
}

bool is_hooked_name(const char* name) {
  if (name[0] != 'c' || name[1] != 'u') return false;
  for (const Entry& e : g_entries)
    if (std::strcmp(e.name, name) == 0) return true;
  return false;
}

void* substitute(void* fn) {
  if (!fn || !load_real()) return fn;
  for (const Entry& e : g_entries)
    if (*e.real == fn) return e.wrapper;
  return fn;
}

}  // namespace allocshim::abi
