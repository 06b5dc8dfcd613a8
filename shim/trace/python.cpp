// Python frames through the CPython C API (see python.h).
#include "trace/python.h"

#include <dlfcn.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "os/thread.h"
#include "trace/format.h"
#include "base/clock.h"

namespace allocshim::trace {
namespace {

// How long an allocating thread without the GIL waits for the helper to read its frames. The
// interpreter asks a running thread to drop the GIL every 5 ms (sys.getswitchinterval()).
constexpr auto kGilWait = std::chrono::milliseconds(20);
// After this many waits in a row time out, the helper path is given up: the GIL is held by
// something that does not let go (or the interpreter is shutting down).
constexpr int kMaxConsecutiveTimeouts = 8;
constexpr std::uint64_t kProbeIntervalNs = 5'000'000;

}  // namespace

// The subset of the C API we call, resolved from the process with dlsym. Types are opaque.
struct PythonStacks::Api {
  int (*is_initialized)();
  int (*is_finalizing)();
  int (*gil_check)();
  void* (*this_thread_state)();
  int (*gil_ensure)();
  void (*gil_release)(int);
  void* (*save_thread)();
  void (*restore_thread)(void*);
  void* (*get_frame)(void*);
  void* (*frame_code)(void*);
  int (*frame_line)(void*);
  void* (*frame_back)(void*);
  void (*incref)(void*);
  void (*decref)(void*);
  void* (*getattr)(void*, const char*);
  const char* (*utf8)(void*);
  long (*as_long)(void*);
  void (*err_fetch)(void**, void**, void**);
  void (*err_restore)(void*, void*, void*);

  std::mutex mutex;  // the code-object table (always used with the GIL held, but cheap to be sure)
  std::unordered_map<void*, std::uint32_t> functions;
  std::uint32_t next_function = 1;
};

// One request at a time: the allocating thread posts its thread state and waits; the helper takes
// the GIL, reads the frames, and signals.
struct PythonStacks::Helper {
  std::mutex serial;  // one request in flight
  std::mutex mutex;
  std::condition_variable wake, done;
  void* tstate = nullptr;
  std::uint64_t* out = nullptr;
  int max = 0, count = 0;
  bool pending = false, taken = false, finished = false, cancelled = false;
  std::atomic<std::uint64_t> timeouts{0};
  int consecutive_timeouts = 0;
  bool disabled = false;
  std::thread thread;
};

PythonStacks::PythonStacks(Define define) : define_(std::move(define)) {}

// The helper thread (if any) is left running: it only ever waits, and joining it at exit could
// wait on a GIL the exiting interpreter holds.
PythonStacks::~PythonStacks() {
  if (helper_ && helper_->thread.joinable()) helper_->thread.detach();
}

bool PythonStacks::available() {
  if (api_) return api_->is_initialized() && !(api_->is_finalizing && api_->is_finalizing());
  if (resolved_) return false;
  const std::uint64_t now = clock::now_ns();
  if (now < next_probe_ns_) return false;
  next_probe_ns_ = now + kProbeIntervalNs;

  auto sym = [](const char* name) { return dlsym(RTLD_DEFAULT, name); };
  void* is_init = sym("Py_IsInitialized");
  if (!is_init) return false;  // no interpreter (yet: a program may dlopen libpython later)
  auto* a = new Api{};
  a->is_initialized = reinterpret_cast<int (*)()>(is_init);
  a->is_finalizing = reinterpret_cast<int (*)()>(sym("Py_IsFinalizing"));
  if (!a->is_finalizing) a->is_finalizing = reinterpret_cast<int (*)()>(sym("_Py_IsFinalizing"));
  a->gil_check = reinterpret_cast<int (*)()>(sym("PyGILState_Check"));
  a->this_thread_state = reinterpret_cast<void* (*)()>(sym("PyGILState_GetThisThreadState"));
  a->gil_ensure = reinterpret_cast<int (*)()>(sym("PyGILState_Ensure"));
  a->gil_release = reinterpret_cast<void (*)(int)>(sym("PyGILState_Release"));
  a->save_thread = reinterpret_cast<void* (*)()>(sym("PyEval_SaveThread"));
  a->restore_thread = reinterpret_cast<void (*)(void*)>(sym("PyEval_RestoreThread"));
  a->get_frame = reinterpret_cast<void* (*)(void*)>(sym("PyThreadState_GetFrame"));
  a->frame_code = reinterpret_cast<void* (*)(void*)>(sym("PyFrame_GetCode"));
  a->frame_line = reinterpret_cast<int (*)(void*)>(sym("PyFrame_GetLineNumber"));
  a->frame_back = reinterpret_cast<void* (*)(void*)>(sym("PyFrame_GetBack"));
  a->incref = reinterpret_cast<void (*)(void*)>(sym("Py_IncRef"));
  a->decref = reinterpret_cast<void (*)(void*)>(sym("Py_DecRef"));
  a->getattr = reinterpret_cast<void* (*)(void*, const char*)>(sym("PyObject_GetAttrString"));
  a->utf8 = reinterpret_cast<const char* (*)(void*)>(sym("PyUnicode_AsUTF8"));
  a->as_long = reinterpret_cast<long (*)(void*)>(sym("PyLong_AsLong"));
  a->err_fetch = reinterpret_cast<void (*)(void**, void**, void**)>(sym("PyErr_Fetch"));
  a->err_restore = reinterpret_cast<void (*)(void*, void*, void*)>(sym("PyErr_Restore"));
  resolved_ = true;
  // PyFrame_GetBack and PyFrame_GetCode appeared in 3.9; older interpreters are not supported.
  if (!a->gil_check || !a->this_thread_state || !a->gil_ensure || !a->gil_release ||
      !a->save_thread || !a->restore_thread || !a->get_frame || !a->frame_code || !a->frame_line ||
      !a->frame_back || !a->incref || !a->decref || !a->getattr || !a->utf8 || !a->as_long ||
      !a->err_fetch || !a->err_restore) {
    delete a;
    return false;
  }
  api_ = a;
  interpreter_address_ = reinterpret_cast<std::uint64_t>(sym("PyEval_EvalCode"));
  return api_->is_initialized();
}

std::uint64_t PythonStacks::timeouts() const { return helper_ ? helper_->timeouts.load() : 0; }

std::uint32_t PythonStacks::function_id(void* code) {
  {
    std::lock_guard<std::mutex> lock(api_->mutex);
    auto it = api_->functions.find(code);
    if (it != api_->functions.end()) return it->second;
  }
  // A new code object: hold a reference so its address is never reused by another function, and
  // define it once with its names.
  Api& a = *api_;
  auto text = [&](const char* attr) {
    std::string s;
    if (void* o = a.getattr(code, attr)) {
      if (const char* u = a.utf8(o)) s = u;
      a.decref(o);
    }
    return s;
  };
  std::string name = text("co_qualname");
  if (name.empty()) name = text("co_name");
  const std::string file = text("co_filename");
  long first = 0;
  if (void* o = a.getattr(code, "co_firstlineno")) {
    first = a.as_long(o);
    a.decref(o);
  }
  std::uint32_t id;
  {
    std::lock_guard<std::mutex> lock(a.mutex);
    auto [it, inserted] = a.functions.emplace(code, a.next_function);
    if (!inserted) return it->second;
    id = a.next_function++;
    a.incref(code);
  }
  define_(id, first > 0 ? static_cast<std::uint32_t>(first) : 0, name, file);
  return id;
}

// With the GIL held, on behalf of the thread that owns `tstate`.
int PythonStacks::read_frames(void* tstate, std::uint64_t* out, int max) {
  Api& a = *api_;
  // The allocating thread is inside a C call: keep whatever exception state it has intact while
  // we look attributes up.
  void *type = nullptr, *value = nullptr, *tb = nullptr;
  a.err_fetch(&type, &value, &tb);
  int n = 0;
  void* frame = a.get_frame(tstate);
  while (frame && n < max) {
    void* code = a.frame_code(frame);
    const int line = a.frame_line(frame);
    out[n++] = python_frame(function_id(code), line > 0 ? static_cast<std::uint32_t>(line) : 0);
    a.decref(code);
    void* back = a.frame_back(frame);
    a.decref(frame);
    frame = back;
  }
  if (frame) a.decref(frame);
  a.err_restore(type, value, tb);
  return n;
}

int PythonStacks::capture(std::uint64_t* out, int max) {
  if (!available()) return 0;
  Api& a = *api_;
  if (a.gil_check()) return read_frames(a.this_thread_state(), out, max);
  void* tstate = a.this_thread_state();
  if (!tstate) return 0;  // not a Python thread

  if (!helper_) {
    helper_ = new Helper;
    Helper* h = helper_;
    h->thread = os::start_thread([this, h] {
      // Register with the interpreter once and keep the thread state: then each request is a
      // plain GIL acquire, not a thread-state creation.
      const int gs = api_->gil_ensure();
      (void)gs;
      void* self = api_->save_thread();
      std::unique_lock<std::mutex> lock(h->mutex);
      for (;;) {
        h->wake.wait(lock, [&] { return h->pending && !h->taken; });
        h->taken = true;
        lock.unlock();
        api_->restore_thread(self);
        lock.lock();
        // A request that timed out meanwhile is skipped; a newer one posted since is served.
        if (h->pending && !h->cancelled && !h->finished) {
          h->count = read_frames(h->tstate, h->out, h->max);
          h->finished = true;
          h->done.notify_all();
        }
        lock.unlock();
        self = api_->save_thread();
        lock.lock();
      }
    });
    pthread_setname_np(h->thread.native_handle(), "allocshim-py");
  }
  Helper& h = *helper_;
  std::lock_guard<std::mutex> serial(h.serial);
  std::unique_lock<std::mutex> lock(h.mutex);
  if (h.disabled) return 0;
  h.tstate = tstate;
  h.out = out;
  h.max = max;
  h.count = 0;
  h.pending = true;
  h.taken = h.finished = h.cancelled = false;
  h.wake.notify_one();
  const bool ok = h.done.wait_for(lock, kGilWait, [&] { return h.finished; });
  h.pending = false;
  if (!ok) {
    // The helper reads our frames only under h.mutex and checks `cancelled` first, so once we
    // hold the mutex and set it, it will not touch `out` after we return.
    h.cancelled = true;
    h.timeouts.fetch_add(1, std::memory_order_relaxed);
    if (++h.consecutive_timeouts >= kMaxConsecutiveTimeouts) h.disabled = true;
    return 0;
  }
  h.consecutive_timeouts = 0;
  return h.count;
}

void PythonStacks::after_fork_child() {
  // The helper thread did not survive fork; its mutexes may be in any state. Start over lazily.
  helper_ = nullptr;  // leaked on purpose: destroying a std::thread of the parent would terminate
}

}  // namespace allocshim::trace
