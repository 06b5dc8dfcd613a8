// The parts the vmm thread caches (vmm_cache.h) are made of: the size classes, a thread's slot
// (its lists per class and its exact entries) and a class's central list, each with the operations
// that keep its own lists consistent. Which block goes where is ThreadCache's.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "backends/vmm_small.h"
#include "base/types.h"

namespace allocshim::vmm {

// The cache's size classes: the slab classes up to 16 KiB, then kPerDoubling per doubling.
struct CacheClasses {
  static constexpr std::size_t kMaxClassed = 4u << 20;
  static constexpr int kPerDoubling = 8;
  static constexpr int kFirstLog = 14;  // log2(SmallClasses::kMaxSmall)
  static constexpr int kCount = SmallClasses::kClasses + (22 - kFirstLog) * kPerDoubling;

  // The class of a request of `bytes` (1..kMaxClassed).
  static int of(std::size_t bytes) {
    if (bytes <= SmallClasses::kMaxSmall) return SmallClasses::class_of(bytes);
    const int e = 63 - __builtin_clzll(bytes - 1);  // 2^e < bytes <= 2^(e+1)
    const std::size_t step = std::size_t{1} << (e - 3);
    const auto k = static_cast<int>((bytes - (std::size_t{1} << e) + step - 1) / step);  // 1..8
    return SmallClasses::kClasses + (e - kFirstLog) * kPerDoubling + k - 1;
  }
  static std::size_t bytes(int cls) {
    if (cls < SmallClasses::kClasses) return SmallClasses::class_bytes(cls);
    const int i = cls - SmallClasses::kClasses;
    const int e = kFirstLog + i / kPerDoubling;
    return (std::size_t{1} << e) +
           static_cast<std::size_t>(i % kPerDoubling + 1) * (std::size_t{1} << (e - 3));
  }
  // What a request of `bytes` (256-aligned) becomes: its class's size, or itself above kMaxClassed.
  static std::size_t round(std::size_t bytes) {
    return bytes <= kMaxClassed ? CacheClasses::bytes(of(bytes)) : bytes;
  }
  // Whether a block of `bytes` has exactly a class's size (may go in a class list).
  static bool is_class_size(std::size_t bytes) {
    return bytes <= kMaxClassed && CacheClasses::bytes(of(bytes)) == bytes;
  }
};

namespace cache {

inline constexpr int kEntries = 256;  // classed blocks parked per thread and device
inline constexpr int kExact = 4;      // blocks above kMaxClassed, exact sizes
inline constexpr int kCentral = 32;   // blocks per class passed between threads
inline constexpr std::uint16_t kNoEntry = 0xffff;

// No member initializers: a Victims on the stack of every free must cost nothing to make.
struct Parked {
  DevPtr ptr;
  std::uint64_t cookie;
};

// Held for a few instructions at a time. lock() waits, but not forever: in a child process after
// fork, a lock some other thread of the parent held at the fork stays held, and its slot or
// list is skipped (its blocks stay parked) rather than hanging the program.
struct SpinLock {
  std::atomic<bool> held{false};
  bool try_lock() { return !held.exchange(true, std::memory_order_acquire); }
  bool lock() {
    for (int spins = 0; spins < (1 << 20); ++spins) {
      if (!held.load(std::memory_order_relaxed) && try_lock()) return true;
      __builtin_ia32_pause();
    }
    return false;
  }
  void unlock() { held.store(false, std::memory_order_release); }
};
struct Entry {
  Parked block{};
  std::uint16_t next = kNoEntry;  // the class's list, or the spare list
};
struct Exact {
  std::size_t bytes = 0;  // 0: empty
  Parked block{};
};
struct alignas(64) Slot {
  Slot() {
    head.fill(kNoEntry);
    count.fill(0);
  }
  SpinLock busy;
  std::size_t bytes = 0;           // classed bytes parked
  std::uint16_t spare = kNoEntry;  // entries taken back, linked through `next`
  std::uint16_t fresh = 0;         // entries [fresh, kEntries) never used
  std::uint32_t next_exact = 0;
  std::array<std::uint16_t, CacheClasses::kCount> head;   // newest entry of each class
  std::array<std::uint16_t, CacheClasses::kCount> count;  // entries of each class
  std::array<Exact, kExact> exact{};
  std::array<Entry, kEntries> entries{};

  bool try_lock() { return busy.try_lock(); }
  bool lock() { return busy.lock(); }
  void unlock() { busy.unlock(); }

  bool pop(int cls, Parked* out) {
    const auto c = static_cast<std::size_t>(cls);
    const std::uint16_t i = head[c];
    if (i == kNoEntry) return false;
    head[c] = entries[i].next;
    --count[c];
    bytes -= CacheClasses::bytes(cls);
    *out = entries[i].block;
    entries[i].next = spare;
    spare = i;
    return true;
  }
  void push(int cls, Parked block) {  // a free entry exists
    const auto c = static_cast<std::size_t>(cls);
    std::uint16_t i = spare;
    if (i != kNoEntry)
      spare = entries[i].next;
    else
      i = fresh++;
    entries[i] = Entry{block, head[c]};
    head[c] = i;
    ++count[c];
    bytes += CacheClasses::bytes(cls);
  }
  int fullest_by_count() const {
    int best = 0;
    for (int c = 1; c < CacheClasses::kCount; ++c)
      if (count[static_cast<std::size_t>(c)] > count[static_cast<std::size_t>(best)]) best = c;
    return best;
  }
  int fullest_by_bytes() const {
    int best = 0;
    std::size_t most = 0;
    for (int c = 0; c < CacheClasses::kCount; ++c) {
      const std::size_t b = count[static_cast<std::size_t>(c)] * CacheClasses::bytes(c);
      if (b > most) most = b, best = c;
    }
    return best;
  }
  std::size_t spares() const {
    std::size_t n = 0;
    for (std::uint16_t i = spare; i != kNoEntry; i = entries[i].next) ++n;
    return n;
  }
};

// Blocks of one class passed between threads' caches (tcmalloc's transfer cache): a thread's
// overflow goes here before the heap, a thread's miss looks here before the device lock.
struct alignas(64) Central {
  SpinLock busy;
  // Written under `busy`; atomic so that a miss may peek at it without the lock.
  std::atomic<int> count{0};
  std::array<Parked, kCentral> blocks{};
  void push(const Parked& p) {
    const int n = count.load(std::memory_order_relaxed);
    blocks[static_cast<std::size_t>(n)] = p;
    count.store(n + 1, std::memory_order_relaxed);
  }
  Parked pop() {
    const int n = count.load(std::memory_order_relaxed) - 1;
    count.store(n, std::memory_order_relaxed);
    return blocks[static_cast<std::size_t>(n)];
  }
};

}  // namespace cache
}  // namespace allocshim::vmm
