// Instances a forked child must forget: an object holding an open file description of a node region
// would keep the parent's slot looking alive for as long as the child lives. Each type registers
// its live instances here, and in the child every registered one gets forget_after_fork() (from
// pthread_atfork's child handler, before the child's own code runs).
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstddef>

namespace allocshim::os {

template <typename T>
class ForkRegistry {
 public:
  // A fixed table, lock-free for the child handler: a process has a few such objects, and one past
  // the table is not forgotten.
  static constexpr std::size_t kSlots = 16;

  static void track(T* t) {
    static const int registered = pthread_atfork(nullptr, nullptr, forget_all_in_child);
    (void)registered;
    for (auto& slot : slots_) {
      T* expected = nullptr;
      if (slot.compare_exchange_strong(expected, t)) return;
    }
  }
  static void untrack(T* t) {
    for (auto& slot : slots_) {
      T* expected = t;
      if (slot.compare_exchange_strong(expected, nullptr)) return;
    }
  }

 private:
  static void forget_all_in_child() {
    for (auto& slot : slots_)
      if (T* t = slot.load(std::memory_order_relaxed)) t->forget_after_fork();
  }
  static inline std::atomic<T*> slots_[kSlots]{};
};

}  // namespace allocshim::os
