// The process-wide core: created on the first hooked call (never in a constructor, where the
// loader's lock is held), dropped in a forked child, reported on at exit.
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "abi/hooks.h"
#include "core/core.h"
#include "base/log.h"
#include "base/threads.h"
#include "trace/recorder.h"
#include "driver/real_driver.h"
#include "os/env.h"
#include "os/private_file.h"
#include "policy/watch.h"

namespace allocshim {
namespace {

std::atomic<Core*> g_core{nullptr};
// Set when the driver could not be loaded: every later call forwards without trying again.
std::atomic<bool> g_unavailable{false};
std::mutex g_init_mutex;
thread_local bool t_initializing = false;
bool g_atfork_registered = false;

using os::env;

bool env_true(const char* name) {
  const char* v = env(name);
  return v && std::strcmp(v, "0") != 0 && std::strcmp(v, "false") != 0;
}

// The policy the environment asks for. A policy that does not load is reported once and replaced
// by the default: the program runs natively rather than failing because of its allocator's config.
policy::Policy load_policy() {
  policy::Policy p = policy::default_policy();
  std::vector<policy::Diagnostic> errors;
  if (const char* path = env("ALLOCSHIM_POLICY")) {
    policy::Policy loaded;
    if (policy::load_file(path, loaded, errors)) {
      p = std::move(loaded);
    } else {
      for (const auto& e : errors) log::write(log::Level::error, "%s", e.str().c_str());
      log::write(log::Level::error, "policy %s rejected: serving every allocation natively", path);
      return native_policy(std::string(path) + " (rejected)");
    }
  }
  errors.clear();
  policy::Policy overridden = p;
  if (policy::apply_overrides(overridden, env("ALLOCSHIM_BACKEND"), env("ALLOCSHIM_CONF"),
                              errors)) {
    p = std::move(overridden);
  } else {
    for (const auto& e : errors) log::write(log::Level::error, "%s", e.str().c_str());
    log::write(log::Level::error, "environment overrides ignored");
  }
  return p;
}

void before_fork() {
  g_init_mutex.lock();
  threads::before_fork();
  if (Core* c = g_core.load(std::memory_order_acquire)) c->registry_lock_all();
}

void after_fork_parent() {
  if (Core* c = g_core.load(std::memory_order_acquire)) c->registry_unlock_all();
  threads::after_fork_parent();
  g_init_mutex.unlock();
}

// The child's CUDA state is not the parent's (a child may not even use the parent's context), so
// it starts with a fresh core on its first call. The parent's core is left allocated on purpose:
// freeing it would touch driver state that belongs to the parent.
void after_fork_child() {
  if (Core* c = g_core.load(std::memory_order_acquire)) c->registry_unlock_all();
  threads::after_fork_child();
  g_core.store(nullptr, std::memory_order_release);
  new (&g_init_mutex) std::mutex;
}

void stop_control() {
  if (Core* c = g_core.load(std::memory_order_acquire)) c->stop_control();
}

Core* init_slow() {
  if (g_unavailable.load(std::memory_order_acquire) || t_initializing) return nullptr;
  std::lock_guard lock(g_init_mutex);
  if (Core* c = g_core.load(std::memory_order_acquire)) return c;
  t_initializing = true;
  std::string error;
  const Driver* driver =
      abi::load_real() ? load_real_driver(&abi::real_dlsym, false, error) : nullptr;
  Core* core = nullptr;
  if (!driver) {
    log::write(log::Level::warn, "no usable CUDA driver (%s): forwarding",
               error.empty() ? "libcuda not loaded" : error.c_str());
    g_unavailable.store(true, std::memory_order_release);
  } else {
    policy::Policy p = load_policy();
    switch (p.log.level) {
      case policy::Log::Level::error: log::set_level(log::Level::error); break;
      case policy::Log::Level::warn: log::set_level(log::Level::warn); break;
      case policy::Log::Level::info: log::set_level(log::Level::info); break;
      case policy::Log::Level::debug: log::set_level(log::Level::debug); break;
    }
    // Never freed: frees can arrive from other libraries' exit handlers after ours have run.
    core = new Core(*driver, std::move(p));
    if (!core->error().empty())
      log::write(log::Level::error, "%s: serving every allocation natively", core->error().c_str());
    const char* policy_path = env("ALLOCSHIM_POLICY");
    if (policy_path && core->error().empty() &&
        (core->policy().reload.watch || env_true("ALLOCSHIM_WATCH"))) {
      core->enable_reload(
          std::make_unique<policy::PolicyWatcher>(policy_path, core->policy().reload.interval_ms,
                                                  env("ALLOCSHIM_BACKEND"), env("ALLOCSHIM_CONF")));
    }
    std::string trace_error;
    if (trace::Recorder* r = trace::start_from_policy(core->policy(), trace_error)) {
      for (std::size_t i = 0; i < core->backend_count(); ++i)
        r->describe_backend(static_cast<int>(i), core->backend(i).kind(), core->backend(i).name());
      // Without libunwind beside the shim, native stacks cost ~20x more per allocation.
      if (!r->unwinder().empty() && r->unwinder().rfind("libunwind", 0) != 0)
        log::write(log::Level::warn, "trace: native stacks use %s", r->unwinder().c_str());
    }
    if (!trace_error.empty()) log::write(log::Level::error, "trace: %s", trace_error.c_str());
    if (!g_atfork_registered) {
      pthread_atfork(before_fork, after_fork_parent, after_fork_child);
      g_atfork_registered = true;
    }
    // allocshim ctl, idle_sleep_ms and [compute] slices. Stopped by an atexit handler, which runs
    // before the CUDA runtime's (registered earlier, at its own initialization): the threads move
    // no memory and hold no work while the runtime tears its contexts down.
    static bool stop_registered = false;
    if (core->start_control() && !stop_registered) stop_registered = std::atexit(stop_control) == 0;
    g_core.store(core, std::memory_order_release);
  }
  t_initializing = false;
  return core;
}

std::string expand_pid(const char* path) {
  std::string out;
  for (const char* p = path; *p; ++p) {
    if (p[0] == '%' && p[1] == 'p') {
      out += std::to_string(getpid());
      ++p;
    } else {
      out += *p;
    }
  }
  return out;
}

// Runs from the loader's finalizers, after every atexit handler (the CUDA runtime's teardown
// included), so the summary counts the frees made during teardown. Touches no driver state.
__attribute__((destructor)) void report_at_exit() {
  Core* core = g_core.load(std::memory_order_acquire);
  if (!core) return;
  // Nothing may escape a destructor of the program's exit (only out-of-memory can throw here).
  try {
    if (const char* path = env("ALLOCSHIM_STATS")) {
      const std::string file = expand_pid(path);
      os::PrivateFile f = os::create_private(file);
      if (!f.error.empty()) log::write(log::Level::error, "statistics: %s", f.error.c_str());
      if (f.fd >= 0) {
        const std::string json = core->stats_json();
        if (!os::write_all(f.fd, json.data(), json.size()))
          log::write(log::Level::error, "cannot write the statistics to %s: %s", file.c_str(),
                     std::strerror(errno));
        ::close(f.fd);
      }
    }
    if (!env_true("ALLOCSHIM_QUIET") && core->policy().log.summary) {
      const std::string s = core->summary();
      ssize_t ignored = ::write(2, s.data(), s.size());
      (void)ignored;
    }
  } catch (const std::exception& e) {
    log::write(log::Level::error, "exit report: %s", e.what());
  }
  // Other processes get this one's share of a shared budget back now rather than when the next
  // of them notices it is gone.
  core->budget().leave_node();
}

}  // namespace

Core* process_core() {
  Core* c = g_core.load(std::memory_order_acquire);
  return __builtin_expect(c != nullptr, 1) ? c : init_slow();
}

}  // namespace allocshim
