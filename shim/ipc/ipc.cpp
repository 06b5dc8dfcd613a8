#include "ipc/ipc.h"

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>

#include "ipc/exporter.h"
#include "ipc/handle.h"
#include "ipc/importer.h"

namespace allocshim::ipc {
namespace {

// Never destroyed, like the core: frees and closes can arrive from exit handlers.
std::atomic<Exporter*> g_exporter{nullptr};
std::atomic<Importer*> g_importer{nullptr};
std::mutex g_mutex;  // creation of the two, and fork
bool g_atfork = false;

void before_fork() {
  g_mutex.lock();
  if (Exporter* e = g_exporter.load()) e->lock_for_fork();
  if (Importer* i = g_importer.load()) i->lock_for_fork();
}

void after_fork_parent() {
  if (Importer* i = g_importer.load()) i->unlock_after_fork();
  if (Exporter* e = g_exporter.load()) e->unlock_after_fork();
  g_mutex.unlock();
}

// The child is a new process to its peers: it has exported nothing (no broker until it exports,
// under a nonce of its own) and imported nothing (its CUDA state is not the parent's). The parent's
// objects are left behind, their sockets closed.
void after_fork_child() {
  if (Exporter* e = g_exporter.exchange(nullptr)) e->abandon_after_fork();
  if (Importer* i = g_importer.exchange(nullptr)) i->abandon_after_fork();
  new (&g_mutex) std::mutex;
}

void register_atfork() {
  if (g_atfork) return;
  pthread_atfork(before_fork, after_fork_parent, after_fork_child);
  g_atfork = true;
}

// Runs before the CUDA runtime's own exit handler (registered earlier, so run later).
void stop_at_exit() {
  if (Exporter* e = g_exporter.load(std::memory_order_acquire)) e->stop_serving();
}

Exporter* exporter(Core& core) {
  if (Exporter* e = g_exporter.load(std::memory_order_acquire)) return e;
  std::lock_guard lock(g_mutex);
  if (Exporter* e = g_exporter.load()) return e;
  register_atfork();
  static bool at_exit = std::atexit(stop_at_exit) == 0;
  (void)at_exit;
  auto* e = new (std::nothrow) Exporter(core);
  g_exporter.store(e, std::memory_order_release);
  return e;
}

Importer* importer(Core& core) {
  if (Importer* i = g_importer.load(std::memory_order_acquire)) return i;
  std::lock_guard lock(g_mutex);
  if (Importer* i = g_importer.load()) return i;
  register_atfork();
  auto* i = new (std::nothrow) Importer(core.driver());
  g_importer.store(i, std::memory_order_release);
  return i;
}

}  // namespace

Result get_mem_handle(Core& core, DevPtr ptr, IpcHandle* out, bool* passthrough) {
  *passthrough = true;
  DevPtr base = 0;
  Block block;
  // Native memory never creates the exporter (nor, so, a broker).
  if (!core.lookup(ptr, &base, &block) || block.backend >= core.backend_count() ||
      core.backend(block.backend).kind() == BackendKind::native)
    return res::ok;
  Exporter* e = exporter(core);
  if (e == nullptr) {
    *passthrough = false;
    return res::out_of_memory;
  }
  return e->export_block(ptr, out, passthrough);
}

Result open_mem_handle(Core& core, const IpcHandle& handle, unsigned flags, DevPtr* out,
                       bool* passthrough) {
  HandleFields f;
  const Decoded d = decode(handle, &f);
  *passthrough = d == Decoded::foreign;
  if (d == Decoded::foreign) return res::ok;
  if (d == Decoded::corrupt) return res::invalid_value;
  Importer* i = importer(core);
  return i ? i->open(f, flags, out) : res::out_of_memory;
}

Result close_mem_handle(Core& core, DevPtr ptr, bool* passthrough) {
  (void)core;
  *passthrough = true;
  Importer* i = g_importer.load(std::memory_order_acquire);
  if (i == nullptr) return res::ok;
  bool ours = false;
  const Result r = i->close(ptr, &ours);
  *passthrough = !ours;
  return r;
}

}  // namespace allocshim::ipc
