// The trace recorder's stacks and definitions: a call site's stack unwound and interned once, the
// modules it lies in, and the process's own definition (executable, pid, command line).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include "trace/recorder_impl.h"

namespace allocshim::trace {

namespace {

std::string read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

std::uint32_t Recorder::Impl::stack_id(ThreadState& ts, const void* caller) {
  const StackMode mode = config.stacks;
  if (mode == StackMode::off) return 0;
  std::uint64_t frames[kMaxFrames];
  int n = 0;
  if (mode == StackMode::native || mode == StackMode::both) {
    void* raw[kMaxFrames];
    const int want = std::min(config.max_depth + kMaxOwnFrames + 16, kMaxFrames);
    const int got = unwinder.backtrace(raw, want);
    // The recorder's own frames end where the entry point returns to: found by address, so the
    // count of frames in between (inlining, the build type) does not matter.
    int i = 0;
    while (i < got && i < kMaxOwnFrames && raw[i] != caller) ++i;
    if (i == got || i == kMaxOwnFrames) i = 0;
    // Preloaded, the core and the hook wrapper are ours too: the stack starts at the program's
    // call into the driver API.
    while (i < got && reinterpret_cast<std::uint64_t>(raw[i]) - own_start < own_end - own_start)
      ++i;
    for (; i < got && n < config.max_depth; ++i)
      frames[n++] = reinterpret_cast<std::uint64_t>(raw[i]);
  }
  if (mode == StackMode::python || mode == StackMode::both) {
    std::uint64_t py[kMaxFrames];
    const int m = python.capture(py, kMaxFrames / 2);
    if (m > 0 && mode == StackMode::both) {
      if (!interp_known.load(std::memory_order_acquire)) {
        std::lock_guard<std::mutex> lock(intern_mutex);
        const std::uint64_t at = python.interpreter_address();
        if (at && !modules.covers(at)) define_modules_locked();
        if (const Module* mod = at ? modules.find(at) : nullptr) {
          interp_start = mod->start;
          interp_end = mod->end;
        }
        interp_known.store(true, std::memory_order_release);
      }
      // Native frames from the innermost interpreter frame outwards are the interpreter running
      // the Python frames: replace them with those.
      int cut = 0;
      while (cut < n && frames[cut] - interp_start >= interp_end - interp_start) ++cut;
      n = cut;
    }
    for (int j = 0; j < m && n < kMaxFrames; ++j) frames[n++] = py[j];
  }
  if (n == 0) return 0;
  const std::uint64_t gen = generation.load(std::memory_order_relaxed);
  if (ts.cache_generation != gen) {
    for (auto& s : ts.cache) s = {};
    ts.cache_generation = gen;
  }
  const std::uint64_t h = hash_frames(frames, n);
  ThreadState::Slot& slot = ts.cache[h % kStackCacheSlots];
  if (slot.entry && slot.hash == h && slot.entry->depth == n &&
      std::memcmp(slot.entry->frames.get(), frames,
                  sizeof(std::uint64_t) * static_cast<std::size_t>(n)) == 0)
    return slot.entry->id;
  const StackEntry* e = intern(frames, n, h);
  slot = {h, e};
  return e->id;
}

const StackEntry* Recorder::Impl::intern(const std::uint64_t* frames, int n, std::uint64_t h) {
  std::lock_guard<std::mutex> lock(intern_mutex);
  auto& bucket = stacks[h];
  for (const auto& e : bucket)
    if (e->depth == n && std::memcmp(e->frames.get(), frames,
                                     sizeof(std::uint64_t) * static_cast<std::size_t>(n)) == 0)
      return e.get();
  // A new stack: make sure the module map covers its addresses (a library may have been dlopened
  // since), then add its missing trie nodes, root side first.
  for (int i = 0; i < n; ++i) {
    if (!is_python_frame(frames[i]) && !modules.covers(frames[i])) {
      define_modules_locked();
      break;
    }
  }
  std::uint32_t parent = 0;
  std::vector<unsigned char> fresh;
  Encoder enc(fresh);
  for (int i = n - 1; i >= 0; --i) {
    auto [it, inserted] = nodes.emplace(NodeKey{parent, frames[i]}, next_node);
    if (inserted) {
      ++next_node;
      enc.tag(Tag::stack_node);
      enc.u(it->second);
      enc.u(parent);
      enc.u(frames[i]);
    }
    parent = it->second;
  }
  if (!fresh.empty()) {
    std::lock_guard<std::mutex> dl(defs_mutex);
    defs.insert(defs.end(), fresh.begin(), fresh.end());
  }
  auto e = std::make_unique<StackEntry>();
  e->hash = h;
  e->id = parent;
  e->depth = n;
  e->frames.reset(new std::uint64_t[static_cast<std::size_t>(n)]);
  std::memcpy(e->frames.get(), frames, sizeof(std::uint64_t) * static_cast<std::size_t>(n));
  bucket.push_back(std::move(e));
  return bucket.back().get();
}

// With intern_mutex held.
void Recorder::Impl::define_modules_locked() {
  std::vector<Module> added;
  modules.rescan(added);
  if (added.empty()) return;
  std::lock_guard<std::mutex> lock(defs_mutex);
  Encoder e(defs);
  for (const Module& m : added) {
    e.tag(Tag::module);
    e.u(m.id);
    e.u(m.bias);
    e.u(m.start);
    e.u(m.end);
    e.str(m.path);
    e.str(m.build_id);
  }
}

void Recorder::Impl::define_process() {
  std::string exe(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  exe.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  std::lock_guard<std::mutex> lock(defs_mutex);
  Encoder e(defs);
  e.tag(Tag::process);
  e.u(static_cast<std::uint64_t>(getpid()));
  e.u(static_cast<std::uint64_t>(getppid()));
  e.u(static_cast<std::uint64_t>(config.stacks));
  e.u(config.sample);
  e.str(exe);
  e.str(read_file("/proc/self/cmdline"));
  defs.insert(defs.end(), backend_defs.begin(), backend_defs.end());
}

}  // namespace allocshim::trace
