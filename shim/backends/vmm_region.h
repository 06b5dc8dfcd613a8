// The VMM backend's physical side, per device: reserved virtual ranges, divided into chunks (the
// allocation granularity or a multiple), backed on demand by physical memory.
//
// The heap (vmm_heap.h) decides addresses; this layer makes an address range usable. acquire()
// maps every chunk of the range not mapped yet, then counts the range's bytes against each chunk it
// touches; release() counts them off. Every chunk is its own physical handle and mapping (a run of
// new chunks shares one cuMemSetAccess per device), so any chunk no block touches can be unmapped
// and mapped again where growth needs it, even inside the old place of a large block that smaller
// blocks now partly use. A wholly free chunk stays mapped (the cache a pool hit is served from)
// until growth elsewhere takes it or trim() gives it back to the driver, which the backend does past
// its release threshold and when memory is short. A chunk in use is never unmapped. Which chunks
// are mapped, and which of them wholly free, are bitmaps per range: a hit on a 1 GiB block touches
// a few words, not 512 chunks.
//
// Before any cuMemCreate, wholly free chunks elsewhere are unmapped and their handles mapped where
// they are needed: memory moves inside the process without a window in which another process could
// take it, and the region grows only when nothing it holds is free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "base/driver.h"
#include "base/types.h"

namespace allocshim::vmm {

struct RegionConfig {
  int device = 0;
  std::size_t chunk = 2u << 20;  // a multiple of the allocation granularity
  std::size_t reserve = 0;       // VA reserved per range (rounded to chunks)
  bool posix_fd = false;         // physical memory exportable for IPC
};

class Region {
 public:
  Region(const Driver& driver, const RegionConfig& config);
  // Unmaps and releases everything and frees the VA ranges (errors ignored: may run at exit).
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  // Reserves a new VA range of at least `bytes` (the configured size unless more is needed).
  Result grow(std::size_t bytes, DevPtr* base, std::size_t* size);
  // Makes [addr, addr + bytes) (inside one range) usable and counts it in use. *mapped: bytes newly
  // mapped for it (0 when it was served from memory already held: a hit). On error nothing is
  // counted (chunks mapped on the way stay, wholly free).
  Result acquire(DevPtr addr, std::size_t bytes, std::size_t* mapped);
  // Counts [addr, addr + bytes) as no longer in use.
  void release(DevPtr addr, std::size_t bytes);
  // Gives wholly free memory back to the driver until at most `keep` bytes of it are held; returns
  // the bytes given back.
  std::size_t trim(std::size_t keep);
  // Grants `device` access to every mapped chunk, and to every chunk mapped later.
  Result add_accessor(int device);

  bool contains(DevPtr ptr) const { return range_of(ptr) != nullptr; }
  // Whether every chunk of [addr, addr + bytes) is mapped already (acquire would be a hit).
  bool backed(DevPtr addr, std::size_t bytes) const;
  std::size_t chunk() const { return config_.chunk; }
  // Device memory held: mapped chunks plus unmapped handles kept for reuse.
  std::size_t reserved_bytes() const { return mapped_ + cached_; }
  // Of it, wholly free (releasable) memory.
  std::size_t free_bytes() const { return free_mapped_ + cached_; }
  std::size_t mapped_bytes() const { return mapped_; }
  std::size_t va_bytes() const { return va_; }
  std::size_t segments() const { return mapped_ / config_.chunk; }  // mappings: one per chunk
  std::uint64_t creates() const { return creates_; }  // cuMemCreate calls that succeeded

 private:
  struct Slot {
    MemHandle handle = 0;  // valid while the chunk is mapped
    // Bytes of acquired ranges in this chunk, counted only where a range begins or ends: a chunk
    // inside a range is the range's alone and is simply not free.
    std::uint64_t used = 0;
  };
  // Per range, one bit per chunk: mapped, and mapped but wholly free. A hit on a 1 GiB block
  // touches 8 words of each, not 512 chunks.
  struct Range {
    DevPtr base = 0;
    std::size_t bytes = 0;
    std::vector<Slot> slots;
    std::vector<std::uint64_t> mapped, free;
  };

  const Range* range_of(DevPtr ptr) const;
  Range* range_of(DevPtr ptr) { return const_cast<Range*>(std::as_const(*this).range_of(ptr)); }
  // Counts [addr, addr + bytes), all mapped, in use (add) or no longer (!add).
  void count(Range& range, DevPtr addr, std::size_t bytes, bool add);
  // Maps slots [first, first + count) of range `ri`, all unmapped, one handle per chunk.
  Result map_run(std::uint32_t ri, std::uint32_t first, std::uint32_t count);
  Result map_chunk(std::uint32_t ri, std::uint32_t slot, MemHandle handle);
  // Unmaps wholly free chunks, except those inside the acquire in progress (avoid_*: they are
  // about to be counted in use), until `need` chunks were gathered (kept for reuse when `keep`,
  // else given back). Returns the chunks unmapped.
  std::uint32_t recycle_free(std::uint32_t need, bool keep);
  void unmap_chunk(std::uint32_t ri, std::uint32_t slot, bool keep_handle);

  const Driver& driver_;
  RegionConfig config_;
  PhysSpec phys_;
  std::vector<Range> ranges_;
  std::vector<MemHandle> handle_cache_;  // unmapped one-chunk handles
  std::uint64_t accessors_ = 0;          // devices granted access (bit per device)
  bool peer_failure_said_ = false;       // a peer grant failed and the log said so
  std::uint32_t avoid_range_ = 0, avoid_first_ = 0, avoid_last_ = 0;  // the acquire in progress
  std::size_t mapped_ = 0, free_mapped_ = 0, cached_ = 0, va_ = 0;
  std::uint64_t creates_ = 0;
};

}  // namespace allocshim::vmm
