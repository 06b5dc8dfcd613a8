// Per-thread caches of freed blocks, for the VMM backend's hot path: a free with nothing to wait
// for (free_sync `none`, or `device` once the context is synchronized) parks its block in the
// freeing thread's cache, and that thread's next request that fits takes it back without the
// device lock or the heap.
//
// Two kinds of entries per thread and device:
// - kExact blocks matched on their exact size (the oldest swapped out when all are full). A thread's
//   miss first releases these back to the heap, so the heap decides where a new block goes with
//   the same free blocks as without the cache: one-thread fragmentation stays where it was.
// - Once a second thread has taken the device lock (the backend sets `classed`), lists per size
//   class, tcmalloc's thread cache: requests up to kMaxClassed (4 MiB) are rounded up to their class
//   (the slab classes up to 16 KiB, then 8 per doubling: at most 1/8 more), a request takes the
//   newest block of its class or of the next one up, and a miss refills a few blocks of its class at
//   once. A thread's blocks of random sizes then mostly come back to it without the lock.
//   Bounds: the backend's `thread_cache` bytes of classed blocks per thread and device, kEntries
//   blocks, and per class a count that shrinks with the class's size; past one, half of the fullest
//   list moves to that class's central list (tcmalloc's transfer cache: one per class and device,
//   an eighth of thread_cache and kCentral blocks at most, its own spin lock), and what does not fit there is handed back as victims, which the
//   caller releases under one device lock. A thread's miss looks in the central lists of its
//   class and the next before it takes the device lock, and takes half of what is there.
// A free from another thread parks in the freeing thread's cache (a block has no owner thread);
// a thread that frees more of a class than it allocates feeds the others through the central list.
//
// A parked block is still in use as far as the heap and the region are concerned: the region's
// reserved bytes include it, the program's live bytes do not. Before the region grows, every
// thread's exact entries go back to the heap (they have no bound of bytes); the classed lists and
// the central lists stay (their bounds are the price: at most threads x thread_cache plus
// central_bound() of device memory parked). Trim and out of memory take everything back; a
// thread's exit takes back what it parked (the central lists stay, for the other threads).
//
// Concurrency: each thread's slot has a lock of its own. Its thread takes it for every take and put
// (one uncontended exchange on a line no other thread writes; a busy slot is a miss); another thread
// takes it only to drain the slot or read it (trim, out of memory, growth, exit, pointer queries),
// holding the device lock. Order: device lock, then slot lock, then a central list's lock.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "backends/vmm_cache_lists.h"
#include "base/spin_lock.h"
#include "base/threads.h"
#include "base/types.h"

namespace allocshim::vmm {

class ThreadCache {
 public:
  // The vmm backend's `thread_cache` option: classed bytes parked per thread and device.
  static constexpr std::size_t kDefaultBytes = 32u << 20;
  static constexpr int kEntries = cache::kEntries;
  static constexpr int kExact = cache::kExact;
  static constexpr int kMaxVictims = 64;  // blocks one put hands back at most
  static constexpr int kCentral = cache::kCentral;

  // `bytes`: the per-thread bound (0: the backend never turns size classes on). A class's central
  // list holds bytes / 8, but at least two blocks of a class up to twice that size.
  explicit ThreadCache(std::size_t bytes = kDefaultBytes)
      : bytes_(bytes), central_bytes_(bytes / 8) {
    for (int cls = 0; cls < CacheClasses::kCount; ++cls)
      central_bound_ += static_cast<std::size_t>(central_cap(cls)) * CacheClasses::bytes(cls);
  }
  std::size_t bytes() const { return bytes_; }

  using Parked = cache::Parked;
  // Blocks handed back for the caller to release (under the device lock).
  struct Victims {
    std::array<Parked, kMaxVictims> blocks;  // [0, count) are set
    int count = 0;
    void add(const Parked& p) { blocks[static_cast<std::size_t>(count++)] = p; }
  };

  // This thread's cache index, or negative when the thread has none.
  static int thread() { return threads::id(); }

  // The most blocks of class `cls` a thread parks.
  int class_cap(int cls) const {
    const std::size_t n = bytes_ / 8 / CacheClasses::bytes(cls);
    return n < 2 ? 2 : n > 64 ? 64 : static_cast<int>(n);
  }

  // The most blocks of class `cls` its central list holds.
  int central_cap(int cls) const {
    const std::size_t b = CacheClasses::bytes(cls);
    const std::size_t n = central_bytes_ / b;
    if (n < 2) return b <= 2 * central_bytes_ ? 2 : static_cast<int>(n);
    return n > kCentral ? kCentral : static_cast<int>(n);
  }
  // The most bytes the central lists hold together.
  std::size_t central_bound() const { return central_bound_; }

  // A parked block of `bytes` for thread `t` (the calling thread). `classed` (bytes is a class's
  // size): of that class or the next one up; otherwise of exactly that size.
  bool take(int t, std::size_t bytes, bool classed, Parked* out) {
    Slot* s = slots_.get(t);
    if (__builtin_expect(s == nullptr || !s->try_lock(), 0)) return false;
    bool hit = false;
    if (classed && bytes <= CacheClasses::kMaxClassed) {
      const int cls = CacheClasses::of(bytes);
      const bool up = cls + 1 < CacheClasses::kCount;
      hit = s->pop(cls, out) || (up && s->pop(cls + 1, out)) || from_central(*s, cls, out) ||
            (up && from_central(*s, cls + 1, out));
    } else {
      for (Exact& e : s->exact) {
        if (e.bytes != bytes) continue;
        *out = e.block;
        e.bytes = 0;
        hit = true;
        break;
      }
    }
    s->unlock();
    return hit;
  }

  enum class Put { parked, refused };
  // Parks a block of `bytes` (its real size) in thread `t`'s cache (the calling thread's): in its
  // class's list if `classed` and it has a class's size, else among the exact entries. Blocks over a
  // bound are added to *victims. `refused`: not parked (the caller releases it).
  Put put(int t, std::size_t bytes, bool classed, Parked block, Victims* victims) {
    Slot* s = slots_.get(t);
    if (__builtin_expect(s == nullptr || !s->try_lock(), 0)) return Put::refused;
    Put r = Put::parked;
    if (classed && CacheClasses::is_class_size(bytes)) {
      const int cls = CacheClasses::of(bytes);
      if (s->spare == kNoEntry && s->fresh == kEntries) evict(*s, s->fullest_by_count(), victims);
      if (s->spare == kNoEntry &&
          s->fresh == kEntries) {  // *victims and the central list were full
        s->unlock();
        return Put::refused;
      }
      s->push(cls, block);
      if (s->count[static_cast<std::size_t>(cls)] > class_cap(cls)) evict(*s, cls, victims);
      while (s->bytes > bytes_ && victims->count < kMaxVictims)
        evict(*s, s->fullest_by_bytes(), victims);
    } else {
      Exact* slot = nullptr;
      for (Exact& e : s->exact) {
        if (e.bytes != 0) continue;
        slot = &e;
        break;
      }
      if (slot == nullptr && victims->count == kMaxVictims) {
        s->unlock();
        return Put::refused;
      }
      if (slot == nullptr) {
        slot = &s->exact[s->next_exact];
        s->next_exact = (s->next_exact + 1) % kExact;
        victims->add(slot->block);
      }
      *slot = Exact{bytes, block};
    }
    s->unlock();
    return r;
  }

  // The calling thread `t` takes back its blocks: every one (`classed`), or the exact ones only,
  // handing each to release(const Parked&). The caller holds the device lock.
  template <class F>
  void reclaim_own(int t, bool classed, F&& release) {
    if (Slot* s = slots_.find(t)) drain(*s, classed, release);
  }
  // Every thread's blocks and the central lists, or every thread's exact blocks: trim, out of
  // memory, growth.
  template <class F>
  void flush(bool classed, F&& release) {
    slots_.for_each([&](Slot& s) { drain(s, classed, release); });
    if (classed) drain_central(release);
  }

  // Blocks and classed bytes parked now (approximate while threads run): tests and introspection.
  std::size_t parked() const {
    std::size_t n = 0;
    slots_.for_each([&](Slot& s) {
      if (!s.lock()) return;
      n += static_cast<std::size_t>(s.fresh) - s.spares();
      for (const Exact& e : s.exact) n += e.bytes != 0;
      s.unlock();
    });
    for (const Central& c : central_)
      n += static_cast<std::size_t>(c.count.load(std::memory_order_relaxed));
    return n;
  }
  // Of them, blocks in the central lists (no thread's).
  std::size_t central_parked() const {
    std::size_t n = 0;
    for (const Central& c : central_)
      n += static_cast<std::size_t>(c.count.load(std::memory_order_relaxed));
    return n;
  }
  std::size_t parked_bytes() const {
    std::size_t n = 0;
    slots_.for_each([&](Slot& s) {
      if (!s.lock()) return;
      n += s.bytes;
      for (const Exact& e : s.exact) n += e.bytes;
      s.unlock();
    });
    for (int cls = 0; cls < CacheClasses::kCount; ++cls)
      n += static_cast<std::size_t>(
               central_[static_cast<std::size_t>(cls)].count.load(std::memory_order_relaxed)) *
           CacheClasses::bytes(cls);
    return n;
  }
  // Whether the block at `ptr` is parked (freed as far as the program knows): pointer queries.
  bool holds(DevPtr ptr) const {
    bool found = false;
    slots_.for_each([&](Slot& s) {
      if (!s.lock()) return;
      for (int cls = 0; cls < CacheClasses::kCount && !found; ++cls)
        for (std::uint16_t i = s.head[static_cast<std::size_t>(cls)]; i != kNoEntry;
             i = s.entries[i].next)
          found |= s.entries[i].block.ptr == ptr;
      for (const Exact& e : s.exact) found |= e.bytes != 0 && e.block.ptr == ptr;
      s.unlock();
    });
    for (Central& c : central_) {
      if (!c.busy.lock()) continue;
      for (int i = 0; i < c.count.load(std::memory_order_relaxed); ++i)
        found |= c.blocks[static_cast<std::size_t>(i)].ptr == ptr;
      c.busy.unlock();
    }
    return found;
  }

 private:
  static constexpr std::uint16_t kNoEntry = cache::kNoEntry;
  using Slot = cache::Slot;
  using Central = cache::Central;
  using Exact = cache::Exact;

  // Half of class `cls`'s blocks in slot `s` (at least one) leave it: to the class's central list
  // while it has room, the rest to *victims (as many as fit).
  void evict(Slot& s, int cls, Victims* victims) {
    int n = (s.count[static_cast<std::size_t>(cls)] + 1) / 2;
    Central& c = central_[static_cast<std::size_t>(cls)];
    const int cap = central_cap(cls);
    Parked p;
    if (c.busy.lock()) {
      for (; n > 0 && c.count.load(std::memory_order_relaxed) < cap && s.pop(cls, &p); --n)
        c.push(p);
      c.busy.unlock();
    }
    while (n-- > 0 && victims->count < kMaxVictims && s.pop(cls, &p)) victims->add(p);
  }
  // A block of class `cls` from its central list into *out, and up to half of the rest into slot
  // `s` (the caller's, locked): the next requests of the class hit locally.
  bool from_central(Slot& s, int cls, Parked* out) {
    Central& c = central_[static_cast<std::size_t>(cls)];
    if (c.count.load(std::memory_order_relaxed) == 0 || !c.busy.lock())
      return false;  // a peek: at worst a miss
    const bool got = c.count.load(std::memory_order_relaxed) > 0;
    if (got) {
      *out = c.pop();
      const std::size_t bytes = CacheClasses::bytes(cls);
      for (int more = c.count.load(std::memory_order_relaxed) / 2;
           more > 0 && (s.spare != kNoEntry || s.fresh < kEntries) &&
           s.count[static_cast<std::size_t>(cls)] < class_cap(cls) && s.bytes + bytes <= bytes_;
           --more)
        s.push(cls, c.pop());
    }
    c.busy.unlock();
    return got;
  }
  template <class F>
  void drain_central(F& release) {
    for (Central& c : central_) {
      if (!c.busy.lock()) continue;
      while (c.count.load(std::memory_order_relaxed) > 0) release(c.pop());
      c.busy.unlock();
    }
  }

  template <class F>
  static void drain(Slot& s, bool classed, F& release) {
    if (!s.lock()) return;
    Parked p;
    if (classed)
      for (int cls = 0; cls < CacheClasses::kCount; ++cls)
        while (s.pop(cls, &p)) release(p);
    for (Exact& e : s.exact) {
      if (e.bytes == 0) continue;
      e.bytes = 0;
      release(e.block);
    }
    s.unlock();
  }

  std::size_t bytes_;
  std::size_t central_bytes_;
  std::size_t central_bound_ = 0;
  threads::PerThread<Slot> slots_;
  mutable std::array<Central, CacheClasses::kCount> central_{};
};

}  // namespace allocshim::vmm