// Small-size classes of the VMM backend: requests up to kMaxSmall are rounded up to one of 32
// classes and served from slabs, runs of equal slots carved from the heap. Two reasons: the hot path
// for small sizes becomes a pop from a slot stack, and small blocks no longer leave small holes all
// over the best-fit heap (they stay clustered in their slabs).
//
// Classes: 256-byte steps up to 4 KiB, then 8 classes per doubling up to 16 KiB (rounding waste at
// most 12.5%, much less on average). A slab is max(64 KiB, 16 slots) so that the slabs a workload
// leaves partly used stay small next to what it allocates. One empty slab per class is kept as a
// spare, so a loop allocating and freeing one block does not carve and return a slab each time;
// further slabs that become empty go back to the heap at once.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/vmm_heap.h"

namespace allocshim::vmm {

class SmallClasses {
 public:
  static constexpr std::size_t kMaxSmall = 16u << 10;
  static constexpr int kClasses = 32;

  struct Slab {
    DevPtr base = 0;
    Heap::Node* node = nullptr;  // the heap block the slab occupies
    std::uint32_t slot_bytes = 0;
    std::uint16_t capacity = 0;
    std::uint16_t used = 0;
    std::uint8_t cls = 0;
    bool listed = false;  // in its class's list of slabs with a free slot
    Slab* prev = nullptr;
    Slab* next = nullptr;
    std::vector<std::uint16_t> free_slots;  // a stack: the slot freed last is reused first
  };

  SmallClasses() = default;
  ~SmallClasses();
  SmallClasses(const SmallClasses&) = delete;
  SmallClasses& operator=(const SmallClasses&) = delete;

  static int class_of(std::size_t bytes);  // bytes in 1..kMaxSmall
  static std::size_t class_bytes(int cls);
  static std::size_t slab_bytes(int cls);

  // A slot of class `cls`, or 0 when no slab of the class has one (then carve a slab and add_slab).
  DevPtr allocate(int cls, Slab** slab);
  // Makes a slab of class `cls` from `node` (node->size == slab_bytes(cls)), marking node->owner.
  Slab* add_slab(int cls, Heap::Node* node);
  // Frees the slot at `ptr`. Returns the heap node of a slab that became empty beyond the class's
  // spare, which the caller gives back to the heap; null otherwise.
  Heap::Node* free(Slab* slab, DevPtr ptr);
  // Empty slabs (the spares), removed and their heap nodes appended to `out`: trim.
  void take_empty(std::vector<Heap::Node*>& out);
  // True when `ptr` is in a slot of `slab` that is allocated (pointer queries; O(slots)).
  static bool slot_in_use(const Slab& slab, DevPtr ptr);

  std::size_t slabs() const { return slabs_; }

 private:
  void list(Slab* s);
  void unlist(Slab* s);
  Heap::Node* retire(Slab* s);

  struct Class {
    Slab* partial = nullptr;  // slabs with a free slot
    int empty = 0;            // of them, wholly empty
  };
  std::array<Class, kClasses> classes_{};
  std::vector<std::unique_ptr<Slab>> all_;  // owns every Slab object, live or spare
  std::vector<Slab*> unused_;               // Slab objects free for reuse
  std::size_t slabs_ = 0;
};

// Cookies: a small block's is its Slab* with the low bit set; a large block's is its Heap::Node*.
inline std::uint64_t small_cookie(SmallClasses::Slab* s) {
  return reinterpret_cast<std::uint64_t>(s) | 1u;
}
inline bool is_small_cookie(std::uint64_t cookie) { return (cookie & 1u) != 0; }
inline SmallClasses::Slab* slab_of(std::uint64_t cookie) {
  return reinterpret_cast<SmallClasses::Slab*>(cookie & ~std::uint64_t{1});
}
inline Heap::Node* node_of(std::uint64_t cookie) { return reinterpret_cast<Heap::Node*>(cookie); }

}  // namespace allocshim::vmm
