// Small ids for the threads that call the shim, and tables indexed by them.
//
// Everything per thread in the core (statistics stripes, registry tables, the VMM thread caches)
// is found by this id, so a hot call reads a thread-local int and touches lines only its own thread
// writes. An id is handed back when its thread exits and the next new thread takes it, with
// whatever the previous owner left in the tables (counts, registry entries of blocks still live):
// a program that makes threads without end uses as many ids as it has threads alive at once.
// Up to kMax threads alive at once get an id; the rest get kNone and take the shared, locked paths.
//
// Exit hooks run on the exiting thread (from its thread-local destructors, before the id is free
// again): the VMM backend hands back the blocks that thread parked in its cache, so memory a thread
// kept for itself returns to the pool when the thread goes, not at the next flush.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <new>

namespace allocshim::threads {

inline constexpr int kPageSize = 64;
inline constexpr int kPages = 64;
inline constexpr int kMax = kPageSize * kPages;
inline constexpr int kNone = -2;  // more than kMax threads alive: this one has no id

namespace detail {
inline constexpr int kUnassigned = -1;
extern thread_local int t_id;
int assign();
}  // namespace detail

// This thread's id in [0, kMax), or kNone.
inline int id() {
  const int i = detail::t_id;
  return __builtin_expect(i != detail::kUnassigned, 1) ? i : detail::assign();
}

// Runs hook(ctx, id) on each thread that had an id, as it exits. At most kMaxHooks at once; false
// when full (the caller then does without: what the thread left is found by the next owner of the
// id or the next flush).
using ExitHook = void (*)(void* ctx, int id);
inline constexpr int kMaxHooks = 256;
bool add_exit_hook(ExitHook hook, void* ctx);
// After it returns, the hook is not running and will not run again.
void remove_exit_hook(ExitHook hook, void* ctx);

// Ids in use now (tests).
int ids_in_use();

// fork: the id table is held across fork, and the child (one thread, whose id stays its own) starts
// with unheld locks and no exit hooks; ids of the parent's other threads stay taken there.
void before_fork();
void after_fork_parent();
void after_fork_child();

// A table of T per thread id, in pages made on first use (a page is kPageSize entries). T must be
// default-constructible; entries live as long as the table, through changes of owner.
template <class T>
class PerThread {
 public:
  PerThread() = default;
  ~PerThread() {
    for (auto& p : pages_) delete p.load(std::memory_order_relaxed);
  }
  PerThread(const PerThread&) = delete;
  PerThread& operator=(const PerThread&) = delete;

  // Thread `id`'s entry (id in [0, kMax)); null only if its page could not be allocated.
  T* get(int id) {
    Page* page = pages_[static_cast<std::size_t>(id / kPageSize)].load(std::memory_order_acquire);
    if (__builtin_expect(page == nullptr, 0)) page = make(id / kPageSize);
    return page ? &page->items[id % kPageSize] : nullptr;
  }
  // The entry if its page exists; null otherwise.
  T* find(int id) const {
    Page* page = pages_[static_cast<std::size_t>(id / kPageSize)].load(std::memory_order_acquire);
    return page ? &page->items[id % kPageSize] : nullptr;
  }
  // f(T&) for every entry of every page made so far.
  template <class F>
  void for_each(F&& f) const {
    for (const auto& p : pages_)
      if (Page* page = p.load(std::memory_order_acquire))
        for (T& item : page->items) f(item);
  }

 private:
  struct Page {
    T items[kPageSize];
  };
  Page* make(int index) {
    Page* fresh = new (std::nothrow) Page();
    Page* expected = nullptr;
    if (fresh && !pages_[static_cast<std::size_t>(index)].compare_exchange_strong(
                     expected, fresh, std::memory_order_acq_rel, std::memory_order_acquire)) {
      delete fresh;  // another thread of the same page made it first
      return expected;
    }
    return fresh;
  }
  std::array<std::atomic<Page*>, kPages> pages_{};
};

}  // namespace allocshim::threads
