// A spin lock for critical sections of tens of nanoseconds (registry tables, vmm cache slots, the
// trace recorder's buffers), where a mutex's system call on contention would cost more than the wait.
#pragma once

#include <sched.h>

#include <atomic>

namespace allocshim {

class SpinLock {
 public:
  void lock() {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      // Spin briefly (a holder keeps the lock for tens of nanoseconds), then yield: with more
      // threads than cores the holder may be descheduled, and spinning would only delay it.
      for (int spins = 0; flag_.load(std::memory_order_relaxed); ++spins) {
        if (spins < 128)
          pause();
        else
          sched_yield();
      }
    }
  }
  void unlock() { flag_.store(false, std::memory_order_release); }
  void reset() { flag_.store(false, std::memory_order_relaxed); }

 private:
  static void pause() {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  std::atomic<bool> flag_{false};
};

}  // namespace allocshim
