#include "core/registry.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace allocshim {
namespace {
// Each shard starts with room for this many live allocations (32 bytes a slot, 128 KiB in all).
constexpr std::size_t kInitialCapacity = 64;
// Grow at 70% occupancy: linear probing degrades quickly past that.
constexpr std::size_t kLoadNumerator = 7, kLoadDenominator = 10;
}  // namespace

Registry::Registry() {
  for (Shard& s : shards_) {
    s.slots = static_cast<Slot*>(std::calloc(kInitialCapacity, sizeof(Slot)));
    s.capacity = s.slots ? kInitialCapacity : 0;
  }
}

Registry::~Registry() {
  for (Shard& s : shards_) std::free(s.slots);
}

std::size_t Registry::hash(DevPtr ptr) {
  // Device pointers are at least 256-byte aligned, and large ones 2 MiB-aligned (native cudaMalloc,
  // VMM chunks). Every bit of the result must depend on the high bits, since the shard and the
  // slot are taken from its low bits: a bare multiply (Fibonacci hashing without taking the top
  // bits) sent every 2 MiB-aligned pointer to shard 0 and to every 128th slot.
  std::uint64_t x = ptr >> 8;  // splitmix64's finalizer
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<std::size_t>(x ^ (x >> 31));
}

std::size_t Registry::shard_of(DevPtr ptr) { return hash(ptr) % kShards; }

std::size_t Registry::longest_probe() const {
  std::size_t longest = 0;
  for (const Shard& s : shards_) {
    std::lock_guard lock(s.lock);
    const std::size_t mask = s.capacity - 1;
    for (std::size_t i = 0; i < s.capacity; ++i)
      if (s.slots[i].key != 0)
        longest = std::max(longest, ((i - (hash(s.slots[i].key) >> 6)) & mask) + 1);
  }
  return longest;
}

Registry::Slot* Registry::lookup(const Shard& s, DevPtr ptr) {
  if (s.capacity == 0) return nullptr;
  const std::size_t mask = s.capacity - 1;
  for (std::size_t i = (hash(ptr) >> 6) & mask;; i = (i + 1) & mask) {
    Slot& slot = s.slots[i];
    if (slot.key == ptr) return &slot;
    if (slot.key == 0) return nullptr;
  }
}

bool Registry::grow(Shard& s) {
  const std::size_t capacity = s.capacity ? s.capacity * 2 : kInitialCapacity;
  Slot* slots = static_cast<Slot*>(std::calloc(capacity, sizeof(Slot)));
  if (!slots) return false;
  const std::size_t mask = capacity - 1;
  for (std::size_t j = 0; j < s.capacity; ++j) {
    if (s.slots[j].key == 0) continue;
    std::size_t i = (hash(s.slots[j].key) >> 6) & mask;
    while (slots[i].key != 0) i = (i + 1) & mask;
    slots[i] = s.slots[j];
  }
  std::free(s.slots);
  s.slots = slots;
  s.capacity = capacity;
  return true;
}

bool Registry::insert(DevPtr ptr, const Block& block) {
  if (ptr == 0) return false;
  Shard& s = shards_[hash(ptr) % kShards];
  std::lock_guard lock(s.lock);
  if ((s.count + 1) * kLoadDenominator > s.capacity * kLoadNumerator && !grow(s)) return false;
  const std::size_t mask = s.capacity - 1;
  std::size_t i = (hash(ptr) >> 6) & mask;
  for (; s.slots[i].key != 0; i = (i + 1) & mask)
    if (s.slots[i].key == ptr) return false;
  s.slots[i] = Slot{ptr, block};
  ++s.count;
  return true;
}

bool Registry::erase(DevPtr ptr, Block* out) {
  if (ptr == 0) return false;
  Shard& s = shards_[hash(ptr) % kShards];
  std::lock_guard lock(s.lock);
  Slot* slot = lookup(s, ptr);
  if (!slot) return false;
  if (out) *out = slot->block;
  // Backward-shift deletion keeps probe chains intact without tombstones.
  const std::size_t mask = s.capacity - 1;
  std::size_t hole = static_cast<std::size_t>(slot - s.slots);
  for (std::size_t i = (hole + 1) & mask; s.slots[i].key != 0; i = (i + 1) & mask) {
    const std::size_t home = (hash(s.slots[i].key) >> 6) & mask;
    // Move the entry into the hole if its home position is not in (hole, i].
    const bool between = hole <= i ? (home > hole && home <= i) : (home > hole || home <= i);
    if (!between) {
      s.slots[hole] = s.slots[i];
      hole = i;
    }
  }
  s.slots[hole].key = 0;
  --s.count;
  return true;
}

bool Registry::find(DevPtr ptr, Block* out) const {
  const Shard& s = shards_[hash(ptr) % kShards];
  std::lock_guard lock(s.lock);
  const Slot* slot = lookup(s, ptr);
  if (!slot) return false;
  if (out) *out = slot->block;
  return true;
}

std::size_t Registry::size() const {
  std::size_t n = 0;
  for (const Shard& s : shards_) {
    std::lock_guard lock(s.lock);
    n += s.count;
  }
  return n;
}

void Registry::lock_all() {
  for (Shard& s : shards_) s.lock.lock();
}

void Registry::unlock_all() {
  for (Shard& s : shards_) s.lock.unlock();
}

}  // namespace allocshim
