// The recorder's internals, shared by recorder.cpp (buffers, interning, lifecycle) and events.cpp
// (the record layout of each event). Not part of the capture API: include recorder.h instead.
#pragma once

#include <time.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/spin_lock.h"
#include "os/unwinder.h"
#include "trace/python.h"
#include "trace/recorder.h"
#include "trace/stacks.h"
#include "trace/writer.h"

namespace allocshim::trace {

namespace detail {

inline std::uint64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}
inline std::uint64_t real_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

constexpr std::size_t kMaxRecord = 128;  // tag + up to 12 varints
constexpr int kMaxFrames = 256;
constexpr std::size_t kStackCacheSlots = 512;  // per thread, direct-mapped
// How deep into an unwind the recorder's own frames may reach (the unwinder's wrapper, stack_id()
// and the on_* entry point, more in a build that inlines less): the stack starts at the frame that
// returns to where the on_* entry point was called from.
constexpr int kMaxOwnFrames = 8;

inline std::uint64_t hash_frames(const std::uint64_t* f, int n) {
  std::uint64_t h = 0x9e3779b97f4a7c15ull ^ static_cast<std::uint64_t>(n);
  for (int i = 0; i < n; ++i) {
    h ^= f[i];
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  return h;
}

struct StackEntry {
  std::uint64_t hash;
  std::uint32_t id;  // leaf node of the stack in the trie
  int depth;
  std::unique_ptr<std::uint64_t[]> frames;  // innermost first
};

struct NodeKey {
  std::uint32_t parent;
  std::uint64_t frame;
  bool operator==(const NodeKey&) const = default;
};
struct NodeKeyHash {
  std::size_t operator()(const NodeKey& k) const {
    return static_cast<std::size_t>((k.frame * 0x9e3779b97f4a7c15ull) ^ k.parent);
  }
};

struct ThreadState {
  SpinLock lock;  // owner appends; the writer steals partial buffers
  std::unique_ptr<Buffer> buf;
  std::uint32_t tid = 0;
  std::uint64_t last_time = 0, last_addr = 0;
  std::uint64_t records = 0;  // in buf
  std::uint64_t lost = 0;     // dropped since the last LOST record
  bool need_header = true;
  std::atomic<bool> orphan{false};
  // Owner-only.
  std::atomic<std::uint64_t> events{0};  // read by Recorder::events()
  std::uint32_t sample_count = 0;
  std::uint64_t cache_generation = 0;
  struct Slot {
    std::uint64_t hash = 0;
    const StackEntry* entry = nullptr;
  } cache[kStackCacheSlots];
};

}  // namespace detail

using namespace detail;

struct Recorder::Impl {
  explicit Impl(const Config& c);

  Config config;
  std::string path;
  const std::uint64_t serial;
  std::unique_ptr<Writer> writer;
  os::NativeUnwinder unwinder;
  std::string unwinder_name;
  PythonStacks python;

  // Definitions (stack nodes, modules, functions, backends), written once each.
  std::mutex defs_mutex;
  std::vector<unsigned char> defs;
  std::string backend_defs;  // the last describe_policy() records, re-emitted in a forked child

  // Interned stacks and the module map. intern_mutex is taken before defs_mutex.
  std::mutex intern_mutex;
  std::unordered_map<std::uint64_t, std::vector<std::unique_ptr<StackEntry>>> stacks;
  std::unordered_map<NodeKey, std::uint32_t, NodeKeyHash> nodes;
  std::uint32_t next_node = 1;
  ModuleMap modules;
  std::atomic<std::uint64_t> generation{1};
  std::uint64_t own_start = 0, own_end = 0;  // liballocshim.so's range when preloaded
  std::atomic<bool> interp_known{false};
  std::uint64_t interp_start = 0, interp_end = 0;

  std::mutex threads_mutex;
  std::vector<ThreadState*> threads;
  std::uint64_t finished_events = 0;  // of threads whose state was collected
  std::atomic<std::uint64_t> lost_total{0};
  Recorder* retired_next = nullptr;  // the list of stopped recorders (recorder.cpp)

  ThreadState& thread_state();
  void handoff(ThreadState& ts);
  template <class Body>
  void emit(Tag tag, Body&& body, std::uint64_t backdate_ns = 0);
  // `caller`: __builtin_return_address(0) of the on_* entry point (kept out of line for it).
  std::uint32_t stack_id(ThreadState& ts, const void* caller);
  const StackEntry* intern(const std::uint64_t* frames, int n, std::uint64_t hash);
  void define_modules_locked();
  void collect(std::vector<std::unique_ptr<Buffer>>& out);
  void define_process();
  bool open(std::string& error);
};

// Appends one event record: `body(p)` writes the fields after the time delta and returns the end.
// The event's time is now, or `backdate_ns` earlier (never before the thread's previous event).
template <class Body>
void Recorder::Impl::emit(Tag tag, Body&& body, std::uint64_t backdate_ns) {
  ThreadState& ts = thread_state();
  std::uint64_t now = mono_ns() - backdate_ns;
  ts.lock.lock();
  // Room for a thread header, a lost record and the event.
  if (ts.buf->used + 3 * kMaxRecord > ts.buf->capacity) handoff(ts);
  unsigned char* p = ts.buf->data.get() + ts.buf->used;
  if (ts.need_header) {
    *p++ = static_cast<unsigned char>(Tag::thread);
    p = put_varint(p, ts.tid);
    p = put_varint(p, now);
    ts.last_time = now;
    ts.last_addr = 0;
    ts.need_header = false;
  }
  if (ts.lost) {
    *p++ = static_cast<unsigned char>(Tag::lost);
    p = put_varint(p, ts.lost);
    ts.lost = 0;
  }
  if (now < ts.last_time) now = ts.last_time;
  *p++ = static_cast<unsigned char>(tag);
  p = put_varint(p, now - ts.last_time);
  ts.last_time = now;
  p = body(p, ts);
  ts.buf->used = static_cast<std::size_t>(p - ts.buf->data.get());
  ++ts.records;
  ts.events.store(ts.events.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  ts.lock.unlock();
}

}  // namespace allocshim::trace
