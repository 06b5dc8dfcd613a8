#include "base/threads.h"

#include <mutex>
#include <new>

namespace allocshim::threads {
namespace detail {
thread_local int t_id __attribute__((tls_model("initial-exec"))) = kUnassigned;
}  // namespace detail

namespace {

// Plain arrays under one mutex: nothing here has a destructor, so a thread that exits after the
// library's statics are gone (at process exit) still finds them intact.
std::mutex g_mutex;
int g_free[kMax];  // ids handed back, a stack
int g_free_count = 0;
int g_next = 0;  // ids never handed out start here
int g_in_use = 0;
struct Hook {
  ExitHook fn;
  void* ctx;
};
Hook g_hooks[kMaxHooks];
int g_hook_count = 0;
// Held while hooks run, so that remove_exit_hook() can promise the hook is not running.
std::mutex g_hook_run_mutex;

void release(int id) {
  {
    std::lock_guard run(g_hook_run_mutex);
    Hook hooks[kMaxHooks];
    int n = 0;
    {
      std::lock_guard lock(g_mutex);
      n = g_hook_count;
      for (int i = 0; i < n; ++i) hooks[i] = g_hooks[i];
    }
    for (int i = 0; i < n; ++i) hooks[i].fn(hooks[i].ctx, id);
  }
  std::lock_guard lock(g_mutex);
  g_free[g_free_count++] = id;
  --g_in_use;
}

// Constructed on a thread's first id; its destructor runs when the thread exits.
struct Owner {
  int id = kNone;
  ~Owner() {
    if (id >= 0) {
      const int mine = id;
      release(mine);
      // Calls made later by other thread-local destructors of this thread take the shared paths.
      detail::t_id = kNone;
    }
  }
};

}  // namespace

namespace detail {
int assign() {
  static thread_local Owner owner;
  int id = kNone;
  {
    std::lock_guard lock(g_mutex);
    if (g_free_count > 0)
      id = g_free[--g_free_count];
    else if (g_next < kMax)
      id = g_next++;
    if (id >= 0) ++g_in_use;
  }
  owner.id = id;
  t_id = id;
  return id;
}
}  // namespace detail

bool add_exit_hook(ExitHook hook, void* ctx) {
  std::lock_guard lock(g_mutex);
  if (g_hook_count == kMaxHooks) return false;
  g_hooks[g_hook_count++] = Hook{hook, ctx};
  return true;
}

void remove_exit_hook(ExitHook hook, void* ctx) {
  std::lock_guard run(g_hook_run_mutex);
  std::lock_guard lock(g_mutex);
  for (int i = 0; i < g_hook_count; ++i)
    if (g_hooks[i].fn == hook && g_hooks[i].ctx == ctx) {
      g_hooks[i] = g_hooks[--g_hook_count];
      return;
    }
}

void before_fork() { g_mutex.lock(); }
void after_fork_parent() { g_mutex.unlock(); }
void after_fork_child() {
  // A thread of the parent may have been running exit hooks: it does not exist here. The hooks
  // belong to the parent's core, which the child drops (its locks may be held by threads that are
  // gone), so none runs in the child; the child's own core adds its own.
  new (&g_hook_run_mutex) std::mutex;
  new (&g_mutex) std::mutex;
  g_hook_count = 0;
}

int ids_in_use() {
  std::lock_guard lock(g_mutex);
  return g_in_use;
}

}  // namespace allocshim::threads
