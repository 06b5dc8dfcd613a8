#include "backends/host_pinner.h"

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <system_error>

#include "os/thread.h"

namespace allocshim::host_detail {
namespace {

// Every live pinner of this process, for the exit handler. Plain arrays under one mutex, so the
// forked child's handler can forget them with plain stores.
constexpr int kMaxPinners = 64;
std::mutex g_mutex;
Pinner* g_pinners[kMaxPinners];
int g_count = 0;
bool g_atfork = false;  // under g_mutex
// Whether the exit handler is registered; not under g_mutex, which kick() must not take (its
// caller may hold the spill target's lock, which close_all's owners take).
std::atomic<bool> g_atexit{false};

void fork_prepare() { g_mutex.lock(); }
void fork_parent() { g_mutex.unlock(); }
// The parent's pinner threads do not exist here and their owners are never used again.
void fork_child() {
  new (&g_mutex) std::mutex;
  g_count = 0;
}

void at_exit() { Pinner::close_all(); }

}  // namespace

Pinner::Pinner(Pass pass, Close close) : pass_(std::move(pass)), close_(std::move(close)) {
  std::lock_guard lock(g_mutex);
  if (!g_atfork) g_atfork = pthread_atfork(fork_prepare, fork_parent, fork_child) == 0;
  if (g_count < kMaxPinners) g_pinners[g_count++] = this;
}

Pinner::~Pinner() {
  {
    std::lock_guard lock(g_mutex);
    for (int i = 0; i < g_count; ++i)
      if (g_pinners[i] == this) {
        g_pinners[i] = g_pinners[--g_count];
        break;
      }
  }
  stop();
}

void Pinner::kick() {
  {
    std::lock_guard lock(mutex_);
    if (closed_) return;
    kicked_ = true;
    if (running_) {
      wake_.notify_one();
      return;
    }
    try {
      thread_ = os::start_thread([this] { run(); });
      running_ = true;
      pthread_setname_np(thread_.native_handle(), "allocshim-ahead");
    } catch (const std::system_error&) {
      return;  // no thread: demotions pin as they would without pinning ahead
    }
  }
  // Registered after the CUDA runtime's handler (it registers at its own start), so it runs first.
  if (!g_atexit.exchange(true)) std::atexit(at_exit);
}

void Pinner::stop() {
  std::thread t;
  {
    std::unique_lock lock(mutex_);
    if (!running_) return;
    stop_ = true;
    wake_.notify_all();
    if (!thread_.joinable()) {  // another stop() joins it
      stopped_.wait(lock, [&] { return !running_; });
      return;
    }
    t = std::move(thread_);
  }
  t.join();
  std::lock_guard lock(mutex_);
  running_ = false;
  stop_ = false;
  kicked_ = false;
  stopped_.notify_all();
}

bool Pinner::running() const {
  std::lock_guard lock(mutex_);
  return running_;
}

void Pinner::run() {
  std::unique_lock lock(mutex_);
  Clock::time_point due = Clock::time_point::max();
  while (!stop_) {
    if (!kicked_) {
      if (due == Clock::time_point::max()) {
        wake_.wait(lock);
        continue;
      }
      if (due != Clock::time_point::min() && Clock::now() < due) {
        wake_.wait_until(lock, due);
        continue;
      }
    }
    kicked_ = false;
    lock.unlock();
    due = pass_();
    lock.lock();
  }
}

void Pinner::close_for_exit() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
  }
  stop();
  if (close_) close_();
}

void Pinner::close_all() {
  // Closed without g_mutex held: closing takes the owners' locks, under which kick() may run.
  Pinner* pinners[kMaxPinners];
  int n = 0;
  {
    std::lock_guard lock(g_mutex);
    n = g_count;
    for (int i = 0; i < n; ++i) pinners[i] = g_pinners[i];
  }
  for (int i = 0; i < n; ++i) pinners[i]->close_for_exit();
}

int Pinner::registered() {
  std::lock_guard lock(g_mutex);
  return g_count;
}

}  // namespace allocshim::host_detail
