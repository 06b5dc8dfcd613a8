// Per-thread caches of freed blocks, for the VMM backend's pool hits.
//
// A free that has nothing to wait for (free_sync `none`, or `device` once the context is
// synchronized) parks its block in the freeing thread's cache; that thread's next request of the
// same rounded size takes it back without the device lock, the heap or the chunk bitmaps: one
// compare-and-swap. Measured on the H100 host (tools/bench/hit_path.cpp): the device mutex alone
// was 25 ns per lock+unlock there, and the heap and chunk bookkeeping of a 1 GiB block 100 ns more
// than of a 256-byte one.
//
// A parked block is still in use as far as the heap and the region are concerned, so nothing here
// can make memory disappear: the backend takes every parked block back (flush) before it would
// grow (map a chunk or reserve address space), when it trims, and when the driver runs out of
// memory; and it parks nothing when a release threshold is set, so a program that frees
// everything gives its chunks back as before. Each thread parks at most kEntries blocks per device;
// when they are all full the oldest is swapped out and released the usual way. A request the
// thread's cache cannot serve first releases that thread's parked blocks (reclaim_own): the heap
// then decides where it goes with the same free blocks as without the cache, which keeps the
// fragmentation of a one-thread workload where it was (alloc_latency --mixed: 1.049 either way;
// parking without this gave 1.055).
//
// Caches are found by thread id (core/threads.h), so every thread with an id has one, and a cache
// passes to the next thread that takes the id. A thread that exits hands back what it parked
// (the backend's exit hook calls reclaim_own on that thread); blocks an old policy's instance
// parked wait for its next flush (growth, trim, out of memory). Concurrency: only a slot's own
// thread writes an entry, and only while it is empty; a flush (another thread, holding the device lock) claims
// a full entry by marking it busy before reading it, so an entry is read while its thread refills
// it never. take and put take no lock, by design; reclaim_own and flush run under the device lock.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/threads.h"
#include "policy/types.h"

namespace allocshim::vmm {

class ThreadCache {
 public:
  static constexpr int kEntries = 4;

  struct Parked {
    DevPtr ptr = 0;
    std::uint64_t cookie = 0;
  };

  // This thread's cache index, or negative when the thread has none.
  static int thread() { return threads::id(); }

  // Takes a block of `key` bytes parked by thread `t` (its own calling thread).
  bool take(int t, std::size_t key, Parked* out) {
    Slot* s = slots_.get(t);
    if (__builtin_expect(s == nullptr, 0)) return false;
    for (Entry& e : s->entries) {
      if (e.key.load(std::memory_order_relaxed) != key || e.state.load(std::memory_order_relaxed) != kFull)
        continue;
      std::uint32_t full = kFull;
      // A flush may claim the entry at the same moment: whoever swaps the state owns the block.
      if (e.state.compare_exchange_strong(full, kEmpty, std::memory_order_acquire)) {
        *out = Parked{e.ptr.load(std::memory_order_relaxed), e.cookie.load(std::memory_order_relaxed)};
        return true;
      }
    }
    return false;
  }

  enum class Put { parked, evicted, refused };
  // Parks a block of `key` bytes in thread `t`'s cache (its own calling thread). `evicted`: every
  // entry was full and the oldest block is in *victim now, for the caller to release.
  Put put(int t, std::size_t key, Parked block, Parked* victim) {
    Slot* sp = slots_.get(t);
    if (__builtin_expect(sp == nullptr, 0)) return Put::refused;
    Slot& s = *sp;
    for (Entry& e : s.entries) {
      if (e.state.load(std::memory_order_relaxed) != kEmpty) continue;
      fill(e, key, block);
      return Put::parked;
    }
    Entry& e = s.entries[s.next_victim];
    s.next_victim = (s.next_victim + 1) % kEntries;
    std::uint32_t full = kFull;
    if (!e.state.compare_exchange_strong(full, kBusy, std::memory_order_acquire)) return Put::refused;
    *victim = Parked{e.ptr.load(std::memory_order_relaxed), e.cookie.load(std::memory_order_relaxed)};
    fill(e, key, block);
    return Put::evicted;
  }

  // Takes every block thread `t` (the calling thread) parked and hands each to
  // release(const Parked&). The caller holds the device lock.
  template <class F>
  void reclaim_own(int t, F&& release) {
    Slot* s = slots_.find(t);
    if (s == nullptr) return;
    for (Entry& e : s->entries) {
      std::uint32_t full = kFull;
      if (e.state.load(std::memory_order_relaxed) != kFull ||
          !e.state.compare_exchange_strong(full, kEmpty, std::memory_order_acquire))
        continue;
      release(Parked{e.ptr.load(std::memory_order_relaxed), e.cookie.load(std::memory_order_relaxed)});
    }
  }

  // Takes every parked block of every thread and hands each to release(const Parked&). The caller
  // holds the device lock. Returns the number of blocks.
  template <class F>
  std::size_t flush(F&& release) {
    std::size_t n = 0;
    slots_.for_each([&](Slot& s) {
      for (Entry& e : s.entries) {
        std::uint32_t full = kFull;
        if (e.state.load(std::memory_order_relaxed) != kFull ||
            !e.state.compare_exchange_strong(full, kBusy, std::memory_order_acquire))
          continue;
        const Parked p{e.ptr.load(std::memory_order_relaxed), e.cookie.load(std::memory_order_relaxed)};
        e.state.store(kEmpty, std::memory_order_release);
        release(p);
        ++n;
      }
    });
    return n;
  }

  // Blocks parked now (approximate while threads run): tests and introspection.
  std::size_t parked() const {
    std::size_t n = 0;
    slots_.for_each([&](const Slot& s) {
      for (const Entry& e : s.entries) n += e.state.load(std::memory_order_relaxed) == kFull;
    });
    return n;
  }
  // Whether the block at `ptr` is parked (freed as far as the program knows): pointer queries.
  bool holds(DevPtr ptr) const {
    bool found = false;
    slots_.for_each([&](const Slot& s) {
      for (const Entry& e : s.entries)
        found |= e.state.load(std::memory_order_acquire) == kFull && e.ptr.load(std::memory_order_relaxed) == ptr;
    });
    return found;
  }

 private:
  enum : std::uint32_t { kEmpty, kFull, kBusy };
  // The fields are atomics only so that holds() may read an entry its thread is refilling (plain
  // moves on x86-64); take, put and flush order them through `state`.
  struct Entry {
    std::atomic<std::uint32_t> state{kEmpty};
    std::atomic<std::size_t> key{0};
    std::atomic<DevPtr> ptr{0};
    std::atomic<std::uint64_t> cookie{0};
  };
  struct alignas(64) Slot {
    std::array<Entry, kEntries> entries{};
    std::uint32_t next_victim = 0;
  };

  static void fill(Entry& e, std::size_t key, Parked block) {
    e.key.store(key, std::memory_order_relaxed);
    e.ptr.store(block.ptr, std::memory_order_relaxed);
    e.cookie.store(block.cookie, std::memory_order_relaxed);
    e.state.store(kFull, std::memory_order_release);
  }

  threads::PerThread<Slot> slots_;
};

}  // namespace allocshim::vmm
