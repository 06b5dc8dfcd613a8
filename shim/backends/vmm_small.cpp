#include "backends/vmm_small.h"

#include <algorithm>

namespace allocshim::vmm {
namespace {
constexpr std::size_t kSlabTarget = 64u << 10;
constexpr std::size_t kMinSlots = 16;
}  // namespace

SmallClasses::~SmallClasses() = default;

int SmallClasses::class_of(std::size_t bytes) {
  if (bytes <= 4096) return static_cast<int>((bytes + 255) / 256) - 1;
  if (bytes <= 8192) return 16 + static_cast<int>((bytes - 4096 + 511) / 512) - 1;
  return 24 + static_cast<int>((bytes - 8192 + 1023) / 1024) - 1;
}

std::size_t SmallClasses::class_bytes(int cls) {
  const auto c = static_cast<std::size_t>(cls);
  if (c < 16) return (c + 1) * 256;
  if (c < 24) return 4096 + (c - 15) * 512;
  return 8192 + (c - 23) * 1024;
}

std::size_t SmallClasses::slab_bytes(int cls) {
  const std::size_t slot = class_bytes(cls);
  return std::max(kMinSlots, kSlabTarget / slot) * slot;  // whole slots, no tail waste
}

void SmallClasses::list(Slab* s) {
  Class& c = classes_[s->cls];
  s->prev = nullptr;
  s->next = c.partial;
  if (c.partial != nullptr) c.partial->prev = s;
  c.partial = s;
  s->listed = true;
}

void SmallClasses::unlist(Slab* s) {
  Class& c = classes_[s->cls];
  if (s->prev != nullptr)
    s->prev->next = s->next;
  else
    c.partial = s->next;
  if (s->next != nullptr) s->next->prev = s->prev;
  s->prev = s->next = nullptr;
  s->listed = false;
}

DevPtr SmallClasses::allocate(int cls, Slab** slab) {
  Class& c = classes_[static_cast<std::size_t>(cls)];
  Slab* s = c.partial;
  if (s == nullptr) return 0;
  if (s->used == 0) --c.empty;
  const std::uint16_t slot = s->free_slots.back();
  s->free_slots.pop_back();
  if (++s->used == s->capacity) unlist(s);
  *slab = s;
  return s->base + static_cast<DevPtr>(slot) * s->slot_bytes;
}

SmallClasses::Slab* SmallClasses::add_slab(int cls, Heap::Node* node) {
  Slab* s = nullptr;
  if (!unused_.empty()) {
    s = unused_.back();
    unused_.pop_back();
  } else {
    all_.push_back(std::make_unique<Slab>());
    s = all_.back().get();
  }
  s->base = node->addr;
  s->node = node;
  s->cls = static_cast<std::uint8_t>(cls);
  s->slot_bytes = static_cast<std::uint32_t>(class_bytes(cls));
  s->capacity = static_cast<std::uint16_t>(node->size / s->slot_bytes);
  s->used = 0;
  s->free_slots.clear();
  // Reversed, so slots are handed out from the slab's start.
  for (std::uint16_t i = s->capacity; i > 0; --i)
    s->free_slots.push_back(static_cast<std::uint16_t>(i - 1));
  node->owner = s;
  ++classes_[static_cast<std::size_t>(cls)].empty;
  list(s);
  ++slabs_;
  return s;
}

Heap::Node* SmallClasses::retire(Slab* s) {
  if (s->listed) unlist(s);
  Heap::Node* node = s->node;
  s->node = nullptr;
  s->base = 0;
  unused_.push_back(s);
  --slabs_;
  return node;
}

Heap::Node* SmallClasses::free(Slab* s, DevPtr ptr) {
  const auto slot = static_cast<std::uint16_t>((ptr - s->base) / s->slot_bytes);
  s->free_slots.push_back(slot);
  if (!s->listed) list(s);
  if (--s->used > 0) return nullptr;
  Class& c = classes_[s->cls];
  if (c.empty == 0) {
    ++c.empty;  // the class's spare
    return nullptr;
  }
  return retire(s);
}

void SmallClasses::take_empty(std::vector<Heap::Node*>& out) {
  for (Class& c : classes_) {
    for (Slab* s = c.partial; s != nullptr && c.empty > 0;) {
      Slab* next = s->next;
      if (s->used == 0) {
        --c.empty;
        out.push_back(retire(s));
      }
      s = next;
    }
  }
}

bool SmallClasses::slot_in_use(const Slab& slab, DevPtr ptr) {
  const auto slot = static_cast<std::uint16_t>((ptr - slab.base) / slab.slot_bytes);
  return std::find(slab.free_slots.begin(), slab.free_slots.end(), slot) == slab.free_slots.end();
}

}  // namespace allocshim::vmm
