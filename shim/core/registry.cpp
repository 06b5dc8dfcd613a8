#include "core/registry.h"

#include <algorithm>
#include <mutex>
#include <new>

namespace allocshim {
namespace {
// A table starts with room for this many entries (32 bytes a slot) when its thread first inserts.
constexpr std::size_t kInitialCapacity = 64;
// Rebuild at 70% of slots used (live or tombstone): linear probing degrades quickly past that. A
// rebuild leaves at most half of that used, doubling as often as needed.
constexpr std::size_t kLoadNumerator = 7, kLoadDenominator = 10;

// Plain increment of a counter only one thread writes.
void bump(std::atomic<std::size_t>& c, std::size_t v = 1) {
  c.store(c.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
}
}  // namespace

Block Registry::Slot::read() const {
  Block b;
  b.size = size.load(std::memory_order_relaxed);
  const std::uint64_t p = packed.load(std::memory_order_relaxed);
  b.backend = static_cast<std::uint32_t>(p);
  b.device = static_cast<std::int16_t>(static_cast<std::uint16_t>(p >> 32));
  b.api = static_cast<Api>(static_cast<std::uint8_t>(p >> 48));
  b.free_sync = static_cast<FreeSync>(static_cast<std::uint8_t>(p >> 56));
  b.cookie = cookie.load(std::memory_order_relaxed);
  return b;
}

void Registry::Slot::write(const Block& b) {
  size.store(b.size, std::memory_order_relaxed);
  packed.store(std::uint64_t{b.backend} |
                   std::uint64_t{static_cast<std::uint16_t>(b.device)} << 32 |
                   std::uint64_t{static_cast<std::uint8_t>(b.api)} << 48 |
                   std::uint64_t{static_cast<std::uint8_t>(b.free_sync)} << 56,
               std::memory_order_relaxed);
  cookie.store(b.cookie, std::memory_order_relaxed);
}

Registry::~Registry() {
  each_table([](Table& t) { delete[] t.slots; });
}

std::size_t Registry::hash(DevPtr ptr) {
  // Device pointers are at least 256-byte aligned, and large ones 2 MiB-aligned (native cudaMalloc,
  // VMM chunks). Every bit of the result must depend on the high bits, since the slot is taken from
  // its low bits: a bare multiply sent every 2 MiB-aligned pointer to every 128th slot.
  std::uint64_t x = ptr >> 8;  // splitmix64's finalizer
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<std::size_t>(x ^ (x >> 31));
}

Registry::Table* Registry::own(bool* shared) {
  const int id = threads::id();
  if (__builtin_expect(id >= 0, 1))
    if (Table* t = tables_.get(id); __builtin_expect(t != nullptr, 1)) {
      *shared = false;
      return t;
    }
  *shared = true;
  return &shared_;
}

const Registry::Slot* Registry::lookup(const Table& t, DevPtr ptr) {
  if (t.capacity == 0) return nullptr;
  const std::size_t mask = t.capacity - 1;
  for (std::size_t i = hash(ptr) & mask;; i = (i + 1) & mask) {
    const DevPtr key = t.slots[i].key.load(std::memory_order_acquire);
    if (key == ptr) return &t.slots[i];
    if (key == kEmpty) return nullptr;
  }
}

bool Registry::rebuild(Table& t) {
  const std::size_t live = t.inserted.load(std::memory_order_relaxed) -
                           t.erased_own.load(std::memory_order_relaxed) -
                           t.erased_remote.load(std::memory_order_relaxed);
  std::size_t capacity = std::max(t.capacity, kInitialCapacity);
  while ((live + 1) * kLoadDenominator * 2 > capacity * kLoadNumerator) capacity *= 2;
  Slot* slots = new (std::nothrow) Slot[capacity];
  if (!slots) return false;
  const std::size_t mask = capacity - 1;
  std::size_t used = 0;
  for (std::size_t j = 0; j < t.capacity; ++j) {
    const DevPtr key = t.slots[j].key.load(std::memory_order_relaxed);
    if (key <= kTombstone) continue;
    std::size_t i = hash(key) & mask;
    while (slots[i].key.load(std::memory_order_relaxed) != kEmpty) i = (i + 1) & mask;
    slots[i].write(t.slots[j].read());
    slots[i].key.store(key, std::memory_order_relaxed);
    ++used;
  }
  delete[] t.slots;
  t.slots = slots;
  t.capacity = capacity;
  t.used.store(used, std::memory_order_relaxed);
  return true;
}

bool Registry::insert_into(Table& t, DevPtr ptr, const Block& block) {
  if ((t.used.load(std::memory_order_relaxed) + 1) * kLoadDenominator >
      t.capacity * kLoadNumerator) {
    // Other threads search this table under its lock: none may be inside while it moves.
    std::lock_guard lock(t.lock);
    if (!rebuild(t)) return false;
  }
  const std::size_t mask = t.capacity - 1;
  Slot* reuse = nullptr;
  std::size_t i = hash(ptr) & mask;
  for (;; i = (i + 1) & mask) {
    const DevPtr key = t.slots[i].key.load(std::memory_order_acquire);
    if (key == ptr) return false;
    if (key == kEmpty) break;
    if (key == kTombstone && !reuse) reuse = &t.slots[i];
  }
  Slot& slot = reuse ? *reuse : t.slots[i];
  if (!reuse) bump(t.used);
  slot.write(block);
  slot.key.store(ptr, std::memory_order_release);  // searches see the block whole from here on
  bump(t.inserted);
  return true;
}

bool Registry::erase_from(Table& t, DevPtr ptr, Block* out, bool remote) {
  auto* slot = const_cast<Slot*>(lookup(t, ptr));
  if (!slot) return false;
  const Block b = slot->read();
  DevPtr expected = ptr;
  // The owner and a search from another thread may both reach the entry (a double free racing
  // with itself): only one claims it.
  if (!slot->key.compare_exchange_strong(expected, kTombstone, std::memory_order_acq_rel))
    return false;
  if (out) *out = b;
  if (remote) {
    t.erased_remote.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  bump(t.erased_own);
  // The owner may drop tombstones that end a probe chain (the next slot is empty: no entry lies
  // beyond them), so a table of short-lived blocks rarely needs a rebuild. Only the owner: a
  // search from another thread could otherwise cut the chain of an entry the owner is adding.
  const std::size_t mask = t.capacity - 1;
  std::size_t i = static_cast<std::size_t>(slot - t.slots);
  if (t.slots[(i + 1) & mask].key.load(std::memory_order_relaxed) != kEmpty) return true;
  std::size_t dropped = 0;
  while (t.slots[i].key.load(std::memory_order_relaxed) == kTombstone && dropped < t.capacity) {
    t.slots[i].key.store(kEmpty, std::memory_order_relaxed);
    ++dropped;
    i = (i - 1) & mask;
  }
  t.used.store(t.used.load(std::memory_order_relaxed) - dropped, std::memory_order_relaxed);
  return true;
}

bool Registry::insert(DevPtr ptr, const Block& block) {
  if (ptr <= kTombstone) return false;
  bool shared = false;
  Table* t = own(&shared);
  if (__builtin_expect(!shared, 1)) return insert_into(*t, ptr, block);
  std::lock_guard lock(t->lock);
  return insert_into(*t, ptr, block);
}

bool Registry::erase(DevPtr ptr, Block* out) {
  if (ptr <= kTombstone) return false;
  bool shared = false;
  Table* mine = own(&shared);
  if (__builtin_expect(!shared, 1)) {
    if (erase_from(*mine, ptr, out, false)) return true;
  }
  // Allocated on another thread (or by a thread without an id), or not ours at all.
  bool found = false;
  each_table([&](Table& t) {
    if (found || (&t == mine && !shared)) return;
    std::lock_guard lock(t.lock);
    found = erase_from(t, ptr, out, true);
  });
  return found;
}

bool Registry::find(DevPtr ptr, Block* out) const {
  if (ptr <= kTombstone) return false;
  bool found = false;
  each_table([&](Table& t) {
    if (found) return;
    std::lock_guard lock(t.lock);
    if (const Slot* s = lookup(t, ptr)) {
      const Block b = s->read();
      // Still the same entry after reading it: not erased (and refilled) meanwhile.
      if (s->key.load(std::memory_order_acquire) == ptr) {
        if (out) *out = b;
        found = true;
      }
    }
  });
  return found;
}

std::size_t Registry::size() const {
  std::size_t n = 0;
  each_table([&](const Table& t) {
    n += t.inserted.load(std::memory_order_relaxed) - t.erased_own.load(std::memory_order_relaxed) -
         t.erased_remote.load(std::memory_order_relaxed);
  });
  return n;
}

std::size_t Registry::longest_probe() const {
  std::size_t longest = 0;
  each_table([&](Table& t) {
    std::lock_guard lock(t.lock);
    const std::size_t mask = t.capacity - 1;
    for (std::size_t i = 0; i < t.capacity; ++i) {
      const DevPtr key = t.slots[i].key.load(std::memory_order_relaxed);
      if (key > kTombstone) longest = std::max(longest, ((i - hash(key)) & mask) + 1);
    }
  });
  return longest;
}

void Registry::lock_all() {
  each_table([](Table& t) { t.lock.lock(); });
}

void Registry::unlock_all() {
  each_table([](Table& t) { t.lock.unlock(); });
}

}  // namespace allocshim
