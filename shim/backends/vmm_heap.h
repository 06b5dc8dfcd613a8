// The VMM backend's address-space allocator: best fit with coalescing over the device's reserved
// virtual ranges. Pure bookkeeping on addresses: it never calls the driver and never touches device
// memory (a host cannot write block headers into it), so every block is described by a node kept on
// the host, and the node is the cookie the registry hands back at free (no lookup on the hot path).
//
// Free blocks sit in size bins: 1/256-byte-exact below 8 KiB, then 16 bins per power of two (a bin
// spans 1/16 of its size), with a bitmap of non-empty bins. An allocation takes the smallest fitting
// block of the request's own bin (scanning a bounded number), else the smallest of the next
// non-empty bin: best fit up to 1/16 of the size, in O(1) time independent of the heap's size.
// Address neighbours are doubly linked, so a free merges with free neighbours in O(1).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/types.h"

namespace allocshim::vmm {

// Every block is aligned to this and a multiple of it, like cudaMalloc's allocations.
inline constexpr std::size_t kAlign = 256;

inline std::size_t align_up(std::size_t bytes, std::size_t to) {
  return (bytes + to - 1) / to * to;
}

class Heap {
 public:
  struct Node {
    DevPtr addr = 0;
    std::size_t size = 0;
    Node* prev = nullptr;  // address neighbours within the same range
    Node* next = nullptr;
    Node* bin_prev = nullptr;  // the free list of its bin (free nodes only)
    Node* bin_next = nullptr;
    void* owner = nullptr;  // set by the user for allocated nodes (the VMM marks slabs with it)
    std::uint32_t range = 0;
    std::uint16_t bin = 0;
    bool free = false;
  };

  Heap();
  ~Heap();
  Heap(const Heap&) = delete;
  Heap& operator=(const Heap&) = delete;

  // Adds [base, base + bytes) as free space (a new VA reservation). Never merged with other ranges:
  // one mapping cannot span two reservations.
  void add_range(DevPtr base, std::size_t bytes);
  // A block of exactly `bytes` (a multiple of kAlign, > 0), or null if no free block fits.
  Node* allocate(std::size_t bytes);
  // Frees an allocated node; it merges with free neighbours (the node may be recycled).
  void free(Node* node);
  // The allocated or free node containing `ptr`, or null if `ptr` is in no range. O(blocks of the
  // range): for pointer queries, never the hot path.
  const Node* find(DevPtr ptr) const;

  std::size_t free_bytes() const { return free_bytes_; }
  std::size_t total_bytes() const { return total_bytes_; }
  std::size_t free_blocks() const { return free_blocks_; }
  // The largest free block (scans the highest non-empty bin): tests and diagnostics.
  std::size_t largest_free() const;
  // Calls f(node) for every node of every range in address order: tests.
  template <class F>
  void for_each(F&& f) const {
    for (const Node* head : ranges_)
      for (const Node* n = head; n != nullptr; n = n->next) f(*n);
  }

 private:
  static constexpr int kExactBins = 32;  // sizes 1..31 units of kAlign have a bin each
  static constexpr int kSubBins = 16;
  static constexpr int kBins = kExactBins + 60 * kSubBins;
  static constexpr int kWords = (kBins + 63) / 64;
  static constexpr int kScan = 32;  // nodes examined per bin looking for a better fit

  static int bin_of(std::size_t bytes);
  void link(Node* n);
  void unlink(Node* n);
  Node* best_in_bin(int bin, std::size_t bytes) const;
  int next_bin(int from) const;  // first non-empty bin >= from, or -1
  Node* new_node();
  void recycle(Node* n);

  std::array<Node*, kBins> bins_{};
  std::array<std::uint64_t, kWords> bitmap_{};
  std::vector<Node*> ranges_;  // first node of each range
  // Nodes come from slabs of kNodesPerSlab and return to a free list: no malloc per operation.
  static constexpr std::size_t kNodesPerSlab = 256;
  std::vector<std::unique_ptr<Node[]>> node_slabs_;
  Node* spare_ = nullptr;  // linked through `next`
  std::size_t free_bytes_ = 0, total_bytes_ = 0, free_blocks_ = 0;
};

}  // namespace allocshim::vmm
