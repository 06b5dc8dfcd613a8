// The VMM backend's physical side, per device: reserved virtual ranges, divided into chunks (the
// allocation granularity or a multiple), backed on demand by physical memory.
//
// The heap (vmm_heap.h) decides addresses; this layer makes an address range usable. acquire()
// maps every chunk of the range not mapped yet, then counts the range's bytes against each chunk it
// touches; release() counts them off. A run of consecutive unmapped chunks is backed by one
// cuMemCreate + cuMemMap + cuMemSetAccess (a *segment*): a 1 GiB request costs three driver calls,
// not 1,536. A segment whose chunks all count zero is wholly free: it stays mapped (that is the
// cache a pool hit is served from) until trim() unmaps it and gives it back to the driver, which the
// backend does past its release threshold and when memory is short. A chunk in use is never
// unmapped.
//
// When cuMemCreate is refused, free segments elsewhere are unmapped and their physical handles
// mapped where they are needed (one-chunk ones as they are; larger ones are released first): memory
// moves inside the process without a window in which another process could take it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/driver.h"
#include "core/types.h"

namespace allocshim::vmm {

struct RegionConfig {
  int device = 0;
  std::size_t chunk = 2u << 20;   // a multiple of the allocation granularity
  std::size_t reserve = 0;        // VA reserved per range (rounded to chunks)
  bool posix_fd = false;          // physical memory exportable for IPC
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
  // Grants `device` access to every mapped segment, and to every segment mapped later.
  Result add_accessor(int device);

  bool contains(DevPtr ptr) const { return range_of(ptr) != nullptr; }
  // Whether every chunk of [addr, addr + bytes) is mapped already (acquire would be a hit).
  bool backed(DevPtr addr, std::size_t bytes) const;
  std::size_t chunk() const { return config_.chunk; }
  // Device memory held: mapped segments plus unmapped handles kept for reuse.
  std::size_t reserved_bytes() const { return mapped_ + cached_; }
  // Of it, wholly free (releasable) memory.
  std::size_t free_bytes() const { return free_mapped_ + cached_; }
  std::size_t mapped_bytes() const { return mapped_; }
  std::size_t va_bytes() const { return va_; }
  std::size_t segments() const { return live_segments_; }
  std::uint64_t creates() const { return creates_; }  // cuMemCreate calls that succeeded

 private:
  struct Slot {
    std::uint32_t segment = 0;  // index + 1 into segments_; 0: unmapped
    // Bytes of acquired ranges in this chunk, counted only where a range begins or ends: a chunk
    // inside a range is the range's alone and counts in its segment's `busy` directly.
    std::uint64_t used = 0;
  };
  struct Segment {
    DevPtr base = 0;
    std::size_t bytes = 0;
    MemHandle handle = 0;
    std::uint32_t range = 0;
    std::uint32_t first = 0;      // first slot
    std::uint32_t busy = 0;       // chunks in use
    std::uint32_t free_pos = 0;   // index in free_segments_ while busy == 0
    bool live = false;
  };
  struct Range {
    DevPtr base = 0;
    std::size_t bytes = 0;
    std::vector<Slot> slots;
  };

  const Range* range_of(DevPtr ptr) const;
  Range* range_of(DevPtr ptr) { return const_cast<Range*>(std::as_const(*this).range_of(ptr)); }
  // The first slot past the segment that maps slot `i` (mapped) of `range`.
  std::uint32_t segment_end(const Range& range, std::uint32_t i) const;
  // Counts [addr, addr + bytes), all mapped, in use (add) or no longer (!add).
  void count(Range& range, DevPtr addr, std::size_t bytes, bool add);
  // Maps slots [first, first + count) of range `ri`, all unmapped.
  Result map_run(std::uint32_t ri, std::uint32_t first, std::uint32_t count);
  Result map_segment(std::uint32_t ri, std::uint32_t first, std::uint32_t count, MemHandle handle);
  // Unmaps wholly free segments, except those inside the acquire in progress (avoid_*: they are
  // about to be counted in use), until about `need` chunks were gathered, keeping one-chunk handles
  // for reuse and releasing the others. Returns whether any memory was freed.
  bool recycle_free(std::uint32_t need);
  void unmap_segment(std::uint32_t index, bool keep_handle);
  void mark_free(std::uint32_t index);
  void mark_busy(std::uint32_t index);

  const Driver& driver_;
  RegionConfig config_;
  PhysSpec phys_;
  std::vector<Range> ranges_;
  std::vector<Segment> segments_;
  std::vector<std::uint32_t> dead_segments_;  // indices of segments_ free for reuse
  std::vector<std::uint32_t> free_segments_;  // wholly free segments
  std::vector<MemHandle> handle_cache_;       // unmapped one-chunk handles
  std::uint64_t accessors_ = 0;               // devices granted access (bit per device)
  std::uint32_t avoid_range_ = 0, avoid_first_ = 0, avoid_last_ = 0;  // the acquire in progress
  std::size_t mapped_ = 0, free_mapped_ = 0, cached_ = 0, va_ = 0, live_segments_ = 0;
  std::uint64_t creates_ = 0;
};

}  // namespace allocshim::vmm
