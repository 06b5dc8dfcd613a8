// The trace recorder (see recorder.h): per-thread record buffers, the writer's collection, start,
// stop and fork. Stacks and definitions are recorder_stacks.cpp's.
#include "trace/recorder.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <new>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "trace/recorder_impl.h"

namespace allocshim::trace {

namespace {

// The core's event sink (base/events.h): the running recorder, maybe tagged in a forked child.
std::atomic<EventSink*>& g_sink = allocshim::detail::g_event_sink;

thread_local ThreadState* t_state = nullptr;
thread_local std::uint64_t t_owner = 0;  // serial of the Impl t_state belongs to
thread_local bool t_exited = false;
struct ThreadExit {
  void touch() {}
  ~ThreadExit() {
    if (t_state) t_state->orphan.store(true, std::memory_order_release);
    t_state = nullptr;
    t_exited = true;
  }
};
thread_local ThreadExit t_exit;

std::atomic<std::uint64_t> g_serial{0};

}  // namespace

Recorder::Impl::Impl(const Config& c)
    : config(c),
      serial(++g_serial),
      python([this](std::uint32_t id, std::uint32_t line, const std::string& name,
                    const std::string& file) {
        std::lock_guard<std::mutex> lock(defs_mutex);
        Encoder e(defs);
        e.tag(Tag::py_func);
        e.u(id);
        e.u(line);
        e.str(name);
        e.str(file);
      }) {}

ThreadState& Recorder::Impl::thread_state() {
  if (t_state && t_owner == serial) return *t_state;
  auto* ts = new ThreadState;
  ts->tid = static_cast<std::uint32_t>(syscall(SYS_gettid));
  ts->buf = writer->take_empty();
  if (!t_exited) t_exit.touch();  // registers the exit hook on first use in this thread
  {
    std::lock_guard<std::mutex> lock(threads_mutex);
    threads.push_back(ts);
  }
  t_state = ts;
  t_owner = serial;
  return *ts;
}

// With ts.lock held: the buffer is full, pass it on (or drop it if the writer is far behind).
void Recorder::Impl::handoff(ThreadState& ts) {
  if (writer->submit(ts.buf)) {
    ts.buf = writer->take_empty();
  } else {
    ts.lost += ts.records;
    lost_total.fetch_add(ts.records, std::memory_order_relaxed);
    ts.buf->used = 0;
  }
  ts.records = 0;
  ts.need_header = true;
}

// Writer thread: hand over every partial buffer, the definitions, and finished threads' states.
void Recorder::Impl::collect(std::vector<std::unique_ptr<Buffer>>& out) {
  {
    std::lock_guard<std::mutex> lock(defs_mutex);
    if (!defs.empty()) {
      auto b = std::make_unique<Buffer>(defs.size());
      std::memcpy(b->data.get(), defs.data(), defs.size());
      b->used = defs.size();
      defs.clear();
      // Definitions first, so a streaming reader usually meets them before their uses.
      out.insert(out.begin(), std::move(b));
    }
  }
  std::lock_guard<std::mutex> lock(threads_mutex);
  for (std::size_t i = 0; i < threads.size();) {
    ThreadState* ts = threads[i];
    const bool orphan = ts->orphan.load(std::memory_order_acquire);
    ts->lock.lock();
    if (ts->buf->used > 0) {
      auto b = std::make_unique<Buffer>(ts->buf->used);
      std::memcpy(b->data.get(), ts->buf->data.get(), ts->buf->used);
      b->used = ts->buf->used;
      out.push_back(std::move(b));
      ts->buf->used = 0;
      ts->records = 0;
      ts->need_header = true;
    }
    ts->lock.unlock();
    if (orphan) {
      finished_events += ts->events;
      delete ts;
      threads[i] = threads.back();
      threads.pop_back();
    } else {
      ++i;
    }
  }
}

bool Recorder::Impl::open(std::string& error) {
  path = expand_path(config.path, static_cast<int>(getpid()));
  writer = std::make_unique<Writer>();
  FileHeader h;
  h.pid = static_cast<std::uint32_t>(getpid());
  h.start_mono_ns = mono_ns();
  h.start_real_ns = real_ns();
  if (!writer->open(path, h, error)) return false;
  define_process();
  {
    std::lock_guard<std::mutex> lock(intern_mutex);
    define_modules_locked();
  }
  writer->start([this](std::vector<std::unique_ptr<Buffer>>& out) { collect(out); },
                config.flush_ms);
  return true;
}

// ---- Recorder ------------------------------------------------------------------------------

// Stopped recorders: never deleted (a thread that loaded the pointer before stop() may still be
// inside on_*), and kept on a list so that they stay reachable, not leaked, for LeakSanitizer.
// Plain stores: fork's child handler uses it too.
struct Retired {
  static inline Recorder* head = nullptr;
  static void add(Recorder* r) {
    r->impl_->retired_next = head;
    head = r;
  }
};

namespace {
std::mutex g_start_mutex;
// Whether the running recorder's path has %p (read by the fork handler, which must not parse it).
std::atomic<bool> g_per_process{false};
// In a forked child of a process tracing to a path without %p: that recorder (never deleted), whose
// path this process must not trace to.
Recorder* g_parent_untraced = nullptr;

void fork_prepare() { g_start_mutex.lock(); }
void fork_parent() { g_start_mutex.unlock(); }
void fork_child();

EventSink* tagged(Recorder* r) {
  return reinterpret_cast<EventSink*>(reinterpret_cast<std::uintptr_t>(static_cast<EventSink*>(r)) |
                                      allocshim::detail::kForkedTag);
}
bool is_tagged(const EventSink* s) {
  return (reinterpret_cast<std::uintptr_t>(s) & allocshim::detail::kForkedTag) != 0;
}
Recorder* untagged(EventSink* s) {
  return static_cast<Recorder*>(reinterpret_cast<EventSink*>(reinterpret_cast<std::uintptr_t>(s) &
                                                             ~allocshim::detail::kForkedTag));
}
}  // namespace

Recorder::Recorder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Recorder::~Recorder() = default;

// With g_start_mutex held.
Recorder* Recorder::start_locked(const Config& config, std::string& error) {
  EventSink* running = g_sink.load();
  if (running && !is_tagged(running)) return static_cast<Recorder*>(running);
  if (g_parent_untraced && config.path == g_parent_untraced->config().path) return nullptr;
  auto impl = std::make_unique<Impl>(config);
  if (config.stacks == StackMode::native || config.stacks == StackMode::both)
    impl->unwinder_name = impl->unwinder.init();
  // Preloaded as a shared library, the shim's own frames are dropped from stacks; linked into a
  // program (tests, benchmarks) there is nothing to drop beyond the recorder's two.
  Dl_info self{}, main_info{};
  const auto* main_phdr = reinterpret_cast<const void*>(getauxval(AT_PHDR));
  if (dladdr(reinterpret_cast<void*>(&Recorder::start), &self) && main_phdr &&
      dladdr(main_phdr, &main_info) && self.dli_fbase != main_info.dli_fbase) {
    std::vector<Module> mods;
    ModuleMap all;
    all.rescan(mods);
    for (const Module& m : mods)
      if (m.bias == reinterpret_cast<std::uint64_t>(self.dli_fbase)) {
        impl->own_start = m.start;
        impl->own_end = m.end;
      }
  }
  if (!impl->open(error)) return nullptr;
  // Never deleted (see Retired).
  auto* r = new Recorder(std::move(impl));
  static bool registered = false;
  if (!registered) {
    registered = true;
    pthread_atfork(fork_prepare, fork_parent, fork_child);
  }
  g_per_process.store(config.path.find("%p") != std::string::npos);
  g_sink.store(r, std::memory_order_release);
  return r;
}

Recorder* Recorder::start(const Config& config, std::string& error) {
  std::lock_guard<std::mutex> lock(g_start_mutex);
  return start_locked(config, error);
}

EventSink* Recorder::in_forked_child() {
  std::string error;
  Recorder* r = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_start_mutex);
    EventSink* current = g_sink.load();
    if (!is_tagged(current)) return current;  // started (or stopped) by another thread meanwhile
    const Config config = untagged(current)->config();
    r = Recorder::start_locked(config, error);
    if (!r) g_sink.store(nullptr);
  }
  if (!r) {
    // Once, and the child goes on untraced, like a parent whose trace could not start.
    char msg[512];
    std::snprintf(msg, sizeof msg, "allocshim: trace of the forked child %d: %s\n",
                  static_cast<int>(getpid()), error.c_str());
    [[maybe_unused]] ssize_t ignored = ::write(2, msg, std::strlen(msg));
  }
  return r;
}

void Recorder::stop() {
  std::lock_guard<std::mutex> lock(g_start_mutex);
  EventSink* s = g_sink.exchange(nullptr);
  if (!s || is_tagged(s)) return;  // a forked child whose own trace never started
  Recorder* r = static_cast<Recorder*>(s);
  Impl& im = *r->impl_;
  Retired::add(r);
  // What was recorded goes into chunks of its own first, so that a file cut in its last bytes
  // loses only the end record, not a short run's every event.
  im.writer->flush();
  {
    std::lock_guard<std::mutex> l(im.defs_mutex);
    Encoder e(im.defs);
    e.tag(Tag::end);
    e.u(r->events());
    e.u(r->lost());
  }
  im.writer->stop();
}

namespace {
// From the loader's finalizers, after every atexit handler: frees made by the CUDA runtime's and
// the program's own teardown are still recorded.
__attribute__((destructor)) void stop_at_exit() { Recorder::stop(); }

// The child of a multi-threaded program may only do async-signal-safe work here (another thread
// may have held the loader's or stdio's locks at the fork): plain stores, nothing else. The
// parent's writer thread does not exist in the child, so its recorder is never used here again.
void fork_child() {
  new (&g_start_mutex) std::mutex;  // held by the parent's forking thread: a fresh, unheld one
  EventSink* s = g_sink.load(std::memory_order_relaxed);
  if (s == nullptr || is_tagged(s)) return;  // untraced, or a child whose trace never started
  Recorder* r = static_cast<Recorder*>(s);
  Retired::add(r);  // never used here again, kept reachable
  if (g_per_process.load(std::memory_order_relaxed)) {
    g_sink.store(tagged(r), std::memory_order_relaxed);
  } else {
    // Without %p the child would write over its parent's file: it is not traced.
    g_parent_untraced = r;
    g_sink.store(nullptr, std::memory_order_relaxed);
  }
}
}  // namespace

void Recorder::describe_backend(int index, BackendKind kind, std::string_view name) {
  std::vector<unsigned char> rec;
  Encoder e(rec);
  e.tag(Tag::backend);
  e.u(static_cast<std::uint64_t>(index));
  e.u(static_cast<std::uint64_t>(kind));
  e.str(name);
  std::lock_guard<std::mutex> lock(impl_->defs_mutex);
  impl_->backend_defs.append(rec.begin(), rec.end());
  impl_->defs.insert(impl_->defs.end(), rec.begin(), rec.end());
}

Recorder* start_from_policy(const policy::Policy& policy, std::string& error) {
  Config c;
  std::string env_error;
  if (!config_from(policy.trace, c, env_error)) error = env_error;
  if (c.path.empty()) return nullptr;
  std::string start_error;
  Recorder* r = Recorder::start(c, start_error);
  if (!r) error = start_error;
  return r;
}

void Recorder::flush() { impl_->writer->flush(); }
const std::string& Recorder::path() const { return impl_->path; }
const Config& Recorder::config() const { return impl_->config; }
const std::string& Recorder::unwinder() const { return impl_->unwinder_name; }

std::uint64_t Recorder::events() const {
  std::lock_guard<std::mutex> lock(impl_->threads_mutex);
  std::uint64_t n = impl_->finished_events;
  for (const ThreadState* ts : impl_->threads) n += ts->events;
  return n;
}
std::uint64_t Recorder::lost() const { return impl_->lost_total.load(std::memory_order_relaxed); }

}  // namespace allocshim::trace
