// The registry of live allocations: device pointer -> Block.
//
// Every hooked allocation inserts and every free erases, so this sits on the hot path. It is a
// fixed number of shards, each an open-addressing table behind a spin lock: an insert or erase
// touches one cache line of one shard and allocates only when a shard grows (amortized, rare).
#pragma once

#include <sched.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/backend.h"
#include "policy/types.h"

namespace allocshim {

class SpinLock {
 public:
  void lock() {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      // Spin briefly (a holder keeps the lock for tens of nanoseconds), then yield: with more
      // threads than cores the holder may be descheduled, and spinning would only delay it.
      for (int spins = 0; flag_.load(std::memory_order_relaxed); ++spins) {
        if (spins < 128) pause();
        else sched_yield();
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

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // False if `ptr` is already registered (a driver bug or a double registration: the old entry stays).
  bool insert(DevPtr ptr, const Block& block);
  // Removes `ptr`; false if it is not registered (a pointer the shim does not own).
  bool erase(DevPtr ptr, Block* out);
  bool find(DevPtr ptr, Block* out) const;
  std::size_t size() const;

  // Introspection for tests: the shard a pointer goes to, and the longest probe sequence (slots
  // visited to find an entry) over every shard.
  static std::size_t shard_of(DevPtr ptr);
  std::size_t longest_probe() const;

  // Calls f(ptr, block) for every live entry, shard by shard (each shard locked while visited).
  template <class F>
  void for_each(F&& f) const {
    for (const Shard& s : shards_) {
      s.lock.lock();
      for (std::size_t i = 0; i < s.capacity; ++i)
        if (s.slots[i].key != 0) f(s.slots[i].key, s.slots[i].block);
      s.lock.unlock();
    }
  }

  // fork support: hold every shard across fork so the child never inherits a held lock.
  void lock_all();
  void unlock_all();

 private:
  struct Slot {
    DevPtr key;  // 0: empty (the driver never returns address 0)
    Block block;
  };
  struct alignas(64) Shard {
    mutable SpinLock lock;
    Slot* slots = nullptr;
    std::size_t capacity = 0;  // power of two
    std::size_t count = 0;
  };
  static constexpr std::size_t kShards = 64;

  static std::size_t hash(DevPtr ptr);
  static bool grow(Shard& s);
  static Slot* lookup(const Shard& s, DevPtr ptr);

  Shard shards_[kShards];
};

}  // namespace allocshim
