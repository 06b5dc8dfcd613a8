// The registry of live allocations: device pointer -> Block.
//
// Every hooked allocation inserts and every free erases, so this sits on the hot path. Each thread
// (by its id, base/threads.h) inserts into a table of its own, an open-addressing table that only
// that thread writes entries into, without a lock: an allocation and its free on one thread touch
// no cache line another thread writes. A free first looks in its own thread's table (no lock); a
// pointer another thread allocated is then searched in every table, each under its lock, and its
// entry claimed with a compare-and-swap (the owner claims its own the same way, so the two cannot
// both take one entry). The lock keeps the owner from growing its table under such a search.
// Erased entries become tombstones, reused by later inserts and dropped when the owner rebuilds
// its table. A table passes with its thread id to the next thread, entries included. Threads
// without an id share one table, always under its lock.
//
// The cost moves to frees from other threads (a probe per table) and to lookups of pointers the
// shim does not own; frees on the allocating thread are the common case in the programs measured.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/backend.h"
#include "base/spin_lock.h"
#include "base/threads.h"
#include "base/types.h"

namespace allocshim {

class Registry {
 public:
  Registry() = default;
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // False if `ptr` is already registered (a driver bug or a double registration: the old entry stays).
  // A duplicate is caught within the inserting thread's table; another thread's live entry for the
  // same pointer would mean the driver handed it out twice.
  bool insert(DevPtr ptr, const Block& block);
  // Removes `ptr`; false if it is not registered (a pointer the shim does not own).
  bool erase(DevPtr ptr, Block* out);
  bool find(DevPtr ptr, Block* out) const;
  std::size_t size() const;

  // Introspection for tests: the longest probe sequence (slots visited to find an entry) over
  // every table.
  std::size_t longest_probe() const;

  // Calls f(ptr, block) for every live entry, table by table (each locked while visited).
  template <class F>
  void for_each(F&& f) const {
    each_table([&](Table& t) {
      t.lock.lock();
      for (std::size_t i = 0; i < t.capacity; ++i) {
        const DevPtr key = t.slots[i].key.load(std::memory_order_acquire);
        if (key > kTombstone) f(key, t.slots[i].read());
      }
      t.lock.unlock();
    });
  }

  // fork support: hold every table's lock across fork so the child never inherits a held lock.
  void lock_all();
  void unlock_all();

 private:
  static constexpr DevPtr kEmpty = 0, kTombstone = 1;  // the driver never returns either
  // The block in three words, each an atomic so that a search from another thread may read an
  // entry its owner is refilling (plain moves on x86-64); the key orders them.
  struct Slot {
    std::atomic<DevPtr> key{kEmpty};
    std::atomic<std::uint64_t> size{0}, packed{0}, cookie{0};
    Block read() const;
    void write(const Block& b);
  };
  struct alignas(64) Table {
    SpinLock lock;  // searches from other threads, and the owner's rebuilds
    Slot* slots = nullptr;
    std::size_t capacity = 0;  // power of two
    // Written by the owner only (plain stores), and by others under the lock (erased_remote).
    std::atomic<std::size_t> used{0};  // live entries and tombstones
    std::atomic<std::size_t> inserted{0}, erased_own{0}, erased_remote{0};
  };

  static std::size_t hash(DevPtr ptr);
  // The table this thread owns, or the shared one (then `shared` is set: take its lock).
  Table* own(bool* shared);
  static bool insert_into(Table& t, DevPtr ptr, const Block& block);
  // Finds and claims `ptr` in `t`; `remote`: the caller is not the owner (and holds the lock).
  static bool erase_from(Table& t, DevPtr ptr, Block* out, bool remote);
  static const Slot* lookup(const Table& t, DevPtr ptr);
  static bool rebuild(Table& t);
  template <class F>
  void each_table(F&& f) const {
    tables_.for_each(f);
    f(shared_);
  }

  threads::PerThread<Table> tables_;
  mutable Table shared_;  // threads without an id
};

}  // namespace allocshim
