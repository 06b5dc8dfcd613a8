#include "backends/vmm_heap.h"

namespace allocshim::vmm {

Heap::Heap() = default;
Heap::~Heap() = default;  // nodes live in node_slabs_

int Heap::bin_of(std::size_t bytes) {
  const std::uint64_t units = bytes / kAlign;
  if (units < kExactBins) return static_cast<int>(units);
  const int fl = 63 - __builtin_clzll(units);  // >= 5
  const int sl = static_cast<int>((units >> (fl - 4)) & (kSubBins - 1));
  return kExactBins + (fl - 5) * kSubBins + sl;
}

Heap::Node* Heap::new_node() {
  if (spare_ == nullptr) {
    node_slabs_.push_back(std::make_unique<Node[]>(kNodesPerSlab));
    Node* slab = node_slabs_.back().get();
    for (std::size_t i = 0; i < kNodesPerSlab; ++i) {
      slab[i].next = spare_;
      spare_ = &slab[i];
    }
  }
  Node* n = spare_;
  spare_ = n->next;
  *n = Node{};
  return n;
}

void Heap::recycle(Node* n) {
  n->next = spare_;
  spare_ = n;
}

void Heap::link(Node* n) {
  const int b = bin_of(n->size);
  n->bin = static_cast<std::uint16_t>(b);
  n->free = true;
  n->bin_prev = nullptr;
  // LIFO within a bin: the block freed last is the one most likely still warm in every cache.
  n->bin_next = bins_[static_cast<std::size_t>(b)];
  if (n->bin_next != nullptr) n->bin_next->bin_prev = n;
  bins_[static_cast<std::size_t>(b)] = n;
  bitmap_[static_cast<std::size_t>(b / 64)] |= std::uint64_t{1} << (b % 64);
  free_bytes_ += n->size;
  ++free_blocks_;
}

void Heap::unlink(Node* n) {
  const auto b = static_cast<std::size_t>(n->bin);
  if (n->bin_prev != nullptr) {
    n->bin_prev->bin_next = n->bin_next;
  } else {
    bins_[b] = n->bin_next;
    if (bins_[b] == nullptr) bitmap_[b / 64] &= ~(std::uint64_t{1} << (b % 64));
  }
  if (n->bin_next != nullptr) n->bin_next->bin_prev = n->bin_prev;
  n->bin_prev = n->bin_next = nullptr;
  n->free = false;
  free_bytes_ -= n->size;
  --free_blocks_;
}

int Heap::next_bin(int from) const {
  if (from >= kBins) return -1;
  int w = from / 64;
  std::uint64_t bits = bitmap_[static_cast<std::size_t>(w)] & (~std::uint64_t{0} << (from % 64));
  while (bits == 0) {
    if (++w == kWords) return -1;
    bits = bitmap_[static_cast<std::size_t>(w)];
  }
  return w * 64 + __builtin_ctzll(bits);
}

Heap::Node* Heap::best_in_bin(int bin, std::size_t bytes) const {
  Node* best = nullptr;
  int seen = 0;
  for (Node* n = bins_[static_cast<std::size_t>(bin)]; n != nullptr && seen < kScan;
       n = n->bin_next, ++seen) {
    if (n->size < bytes) continue;
    if (n->size == bytes) return n;
    // Smallest first, then lowest address: address-ordered best fit fragments least.
    if (best == nullptr || n->size < best->size || (n->size == best->size && n->addr < best->addr))
      best = n;
  }
  return best;
}

void Heap::add_range(DevPtr base, std::size_t bytes) {
  Node* n = new_node();
  n->addr = base;
  n->size = bytes;
  n->range = static_cast<std::uint32_t>(ranges_.size());
  ranges_.push_back(n);
  total_bytes_ += bytes;
  link(n);
}

Heap::Node* Heap::allocate(std::size_t bytes) {
  const int b = bin_of(bytes);
  Node* n = bins_[static_cast<std::size_t>(b)] != nullptr ? best_in_bin(b, bytes) : nullptr;
  if (n == nullptr) {
    // Every block of a higher bin fits; the first non-empty one holds the smallest.
    const int nb = next_bin(b + 1);
    if (nb < 0) return nullptr;
    n = best_in_bin(nb, bytes);
  }
  unlink(n);
  if (n->size > bytes) {
    // The block keeps the low end: growth into a range's untouched tail stays contiguous.
    Node* rest = new_node();
    rest->addr = n->addr + bytes;
    rest->size = n->size - bytes;
    rest->range = n->range;
    rest->prev = n;
    rest->next = n->next;
    if (n->next != nullptr) n->next->prev = rest;
    n->next = rest;
    n->size = bytes;
    link(rest);
  }
  n->owner = nullptr;
  return n;
}

void Heap::free(Node* n) {
  n->owner = nullptr;
  if (n->prev != nullptr && n->prev->free) {
    Node* p = n->prev;
    unlink(p);
    p->size += n->size;
    p->next = n->next;
    if (n->next != nullptr) n->next->prev = p;
    recycle(n);
    n = p;
  }
  if (n->next != nullptr && n->next->free) {
    Node* x = n->next;
    unlink(x);
    n->size += x->size;
    n->next = x->next;
    if (x->next != nullptr) x->next->prev = n;
    recycle(x);
  }
  // A merge keeps the lower node, so a range's first node is never recycled: ranges_ stays valid.
  link(n);
}

const Heap::Node* Heap::find(DevPtr ptr) const {
  for (const Node* head : ranges_) {
    const Node* n = head;
    if (ptr < n->addr) continue;
    for (; n != nullptr; n = n->next)
      if (ptr < n->addr + n->size) return ptr >= n->addr ? n : nullptr;
  }
  return nullptr;
}

std::size_t Heap::largest_free() const {
  for (int b = kBins - 1; b >= 0; --b) {
    std::size_t best = 0;
    for (const Node* n = bins_[static_cast<std::size_t>(b)]; n != nullptr; n = n->bin_next)
      if (n->size > best) best = n->size;
    if (best > 0) return best;
  }
  return 0;
}

}  // namespace allocshim::vmm
