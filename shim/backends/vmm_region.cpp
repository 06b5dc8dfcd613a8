#include "backends/vmm_region.h"

#include <algorithm>

#include "backends/vmm_heap.h"

namespace allocshim::vmm {

Region::Region(const Driver& driver, const RegionConfig& config) : driver_(driver), config_(config) {
  phys_.location = Location{Location::Type::device, config.device};
  phys_.posix_fd = config.posix_fd;
  accessors_ = std::uint64_t{1} << config.device;
}

Region::~Region() {
  for (Segment& g : segments_) {
    if (!g.live) continue;
    driver_.mem_unmap(g.base, g.bytes);
    driver_.mem_release(g.handle);
  }
  for (MemHandle h : handle_cache_) driver_.mem_release(h);
  for (Range& r : ranges_) driver_.mem_address_free(r.base, r.bytes);
}

const Region::Range* Region::range_of(DevPtr ptr) const {
  for (const Range& r : ranges_)
    if (ptr >= r.base && ptr - r.base < r.bytes) return &r;
  return nullptr;
}

Result Region::grow(std::size_t bytes, DevPtr* base, std::size_t* size) {
  const std::size_t need = align_up(bytes, config_.chunk);
  std::size_t want = std::max(align_up(config_.reserve, config_.chunk), need);
  DevPtr p = 0;
  Result r = driver_.mem_address_reserve(&p, want, config_.chunk, 0);
  if (r != res::ok && want > need) {
    want = need;  // the address space is crowded: take just what this request needs
    r = driver_.mem_address_reserve(&p, want, config_.chunk, 0);
  }
  if (r != res::ok) return r;
  Range range;
  range.base = p;
  range.bytes = want;
  range.slots.resize(want / config_.chunk);
  ranges_.push_back(std::move(range));
  va_ += want;
  *base = p;
  *size = want;
  return res::ok;
}

void Region::mark_free(std::uint32_t index) {
  Segment& g = segments_[index];
  g.free_pos = static_cast<std::uint32_t>(free_segments_.size());
  free_segments_.push_back(index);
  free_mapped_ += g.bytes;
}

void Region::mark_busy(std::uint32_t index) {
  Segment& g = segments_[index];
  const std::uint32_t last = free_segments_.back();
  free_segments_[g.free_pos] = last;
  segments_[last].free_pos = g.free_pos;
  free_segments_.pop_back();
  free_mapped_ -= g.bytes;
}

Result Region::map_segment(std::uint32_t ri, std::uint32_t first, std::uint32_t count,
                           MemHandle handle) {
  Range& range = ranges_[ri];
  const DevPtr base = range.base + static_cast<DevPtr>(first) * config_.chunk;
  const std::size_t bytes = static_cast<std::size_t>(count) * config_.chunk;
  Result r = driver_.mem_map(base, bytes, 0, handle);
  if (r != res::ok) return r;
  for (int d = 0; d < static_cast<int>(kMaxDevices); ++d) {
    if ((accessors_ >> d & 1) == 0) continue;
    r = driver_.mem_set_access(base, bytes, d, true);
    // Without access for its own device the memory is useless; a peer's failure only costs the peer.
    if (r != res::ok && d == config_.device) {
      driver_.mem_unmap(base, bytes);
      return r;
    }
  }
  std::uint32_t index;
  if (!dead_segments_.empty()) {
    index = dead_segments_.back();
    dead_segments_.pop_back();
  } else {
    index = static_cast<std::uint32_t>(segments_.size());
    segments_.emplace_back();
  }
  Segment& g = segments_[index];
  g = Segment{base, bytes, handle, ri, first, 0, 0, true};
  for (std::uint32_t i = first; i < first + count; ++i) range.slots[i].segment = index + 1;
  mapped_ += bytes;
  ++live_segments_;
  mark_free(index);  // nothing counted in it yet; acquire() marks it busy next
  return res::ok;
}

Result Region::map_run(std::uint32_t ri, std::uint32_t first, std::uint32_t count) {
  // Wholly free memory elsewhere is moved here before any is created: the region grows only when
  // nothing it holds is free, which keeps its footprint at the chunks its blocks really touch.
  if (handle_cache_.size() < count && !free_segments_.empty()) recycle_free(count);
  bool recycled = false;
  while (count > 0) {
    if (!handle_cache_.empty()) {
      // Physical memory recycled from elsewhere under pressure: no cuMemCreate for it.
      const MemHandle h = handle_cache_.back();
      handle_cache_.pop_back();
      cached_ -= config_.chunk;
      const Result r = map_segment(ri, first, 1, h);
      if (r != res::ok) {
        handle_cache_.push_back(h);
        cached_ += config_.chunk;
        return r;
      }
      ++first;
      --count;
      continue;
    }
    MemHandle h = 0;
    Result r = driver_.mem_create(&h, static_cast<std::size_t>(count) * config_.chunk, phys_);
    if (r == res::out_of_memory && !recycled) {
      recycled = true;
      if (recycle_free(~std::uint32_t{0})) continue;
    }
    if (r != res::ok) return r;
    ++creates_;
    r = map_segment(ri, first, count, h);
    if (r != res::ok) {
      driver_.mem_release(h);
      return r;
    }
    count = 0;
  }
  return res::ok;
}

std::uint32_t Region::segment_end(const Range& range, std::uint32_t i) const {
  const Segment& g = segments_[range.slots[i].segment - 1];
  return g.first + static_cast<std::uint32_t>(g.bytes / config_.chunk);
}

void Region::count(Range& range, DevPtr addr, std::size_t bytes, bool add) {
  const std::size_t chunk = config_.chunk;
  const auto first = static_cast<std::uint32_t>((addr - range.base) / chunk);
  const auto last = static_cast<std::uint32_t>((addr + bytes - 1 - range.base) / chunk);
  const DevPtr end = addr + bytes;
  auto busy = [&](std::uint32_t g, std::uint32_t n) {
    Segment& seg = segments_[g];
    if (add) {
      if (seg.busy == 0) mark_busy(g);
      seg.busy += n;
    } else if ((seg.busy -= n) == 0) {
      mark_free(g);
    }
  };
  // The first and last chunks may be shared with other blocks: their bytes are counted.
  auto edge = [&](std::uint32_t i) {
    const DevPtr cs = range.base + static_cast<DevPtr>(i) * chunk;
    const std::size_t overlap = std::min<DevPtr>(cs + chunk, end) - std::max<DevPtr>(cs, addr);
    Slot& s = range.slots[i];
    const bool was_used = s.used != 0;
    s.used = add ? s.used + overlap : s.used - overlap;
    if (was_used != (s.used != 0)) busy(s.segment - 1, 1);
  };
  edge(first);
  if (last > first) edge(last);
  // The chunks in between belong to this block alone: counted per segment, not per chunk, so a
  // hit on a 1 GiB block costs as much as one on a 2 MiB block.
  for (std::uint32_t i = first + 1; i < last;) {
    const std::uint32_t stop = std::min(last, segment_end(range, i));
    busy(range.slots[i].segment - 1, stop - i);
    i = stop;
  }
}

Result Region::acquire(DevPtr addr, std::size_t bytes, std::size_t* mapped) {
  *mapped = 0;
  Range* range = range_of(addr);
  if (range == nullptr || bytes == 0 || bytes > range->bytes - (addr - range->base))
    return res::invalid_value;
  const auto ri = static_cast<std::uint32_t>(range - ranges_.data());
  const std::size_t chunk = config_.chunk;
  const auto first = static_cast<std::uint32_t>((addr - range->base) / chunk);
  const auto last = static_cast<std::uint32_t>((addr + bytes - 1 - range->base) / chunk);
  avoid_range_ = ri;
  avoid_first_ = first;
  avoid_last_ = last;
  for (std::uint32_t i = first; i <= last;) {
    if (range->slots[i].segment != 0) {
      i = segment_end(*range, i);
      continue;
    }
    std::uint32_t j = i;
    while (j <= last && range->slots[j].segment == 0) ++j;
    const Result r = map_run(ri, i, j - i);
    if (r != res::ok) return r;
    *mapped += static_cast<std::size_t>(j - i) * chunk;
    i = j;
  }
  count(*range, addr, bytes, true);
  return res::ok;
}

bool Region::backed(DevPtr addr, std::size_t bytes) const {
  const Range* range = range_of(addr);
  if (range == nullptr || bytes == 0 || bytes > range->bytes - (addr - range->base)) return false;
  const auto first = static_cast<std::uint32_t>((addr - range->base) / config_.chunk);
  const auto last = static_cast<std::uint32_t>((addr + bytes - 1 - range->base) / config_.chunk);
  for (std::uint32_t i = first; i <= last; i = segment_end(*range, i))
    if (range->slots[i].segment == 0) return false;
  return true;
}

void Region::release(DevPtr addr, std::size_t bytes) {
  Range* range = range_of(addr);
  if (range == nullptr || bytes == 0) return;
  count(*range, addr, bytes, false);
}

void Region::unmap_segment(std::uint32_t index, bool keep_handle) {
  mark_busy(index);  // out of the free list
  Segment& g = segments_[index];
  driver_.mem_unmap(g.base, g.bytes);
  if (keep_handle) {
    handle_cache_.push_back(g.handle);
    cached_ += g.bytes;
  } else {
    driver_.mem_release(g.handle);
  }
  Range& range = ranges_[g.range];
  const auto count = static_cast<std::uint32_t>(g.bytes / config_.chunk);
  for (std::uint32_t i = g.first; i < g.first + count; ++i) range.slots[i].segment = 0;
  mapped_ -= g.bytes;
  g.live = false;
  dead_segments_.push_back(index);
  --live_segments_;
}

bool Region::recycle_free(std::uint32_t need) {
  bool any = false;
  std::size_t gathered = 0;  // bytes cached or given back for the run being mapped
  const std::size_t want = static_cast<std::size_t>(need) * config_.chunk;
  // From the back: unmap_segment moves the last entry into the freed position, already visited.
  for (std::size_t k = free_segments_.size(); k-- > 0 && gathered < want;) {
    if (k >= free_segments_.size()) continue;
    const std::uint32_t index = free_segments_[k];
    const Segment& g = segments_[index];
    const auto count = static_cast<std::uint32_t>(g.bytes / config_.chunk);
    if (g.range == avoid_range_ && g.first <= avoid_last_ && g.first + count > avoid_first_)
      continue;
    gathered += g.bytes;
    // A one-chunk handle is mapped again as it is; a larger one is given back, making room for the
    // cuMemCreate that follows.
    unmap_segment(index, g.bytes == config_.chunk);
    any = true;
  }
  return any;
}

std::size_t Region::trim(std::size_t keep) {
  std::size_t given = 0;
  while (free_bytes() > keep && !handle_cache_.empty()) {
    driver_.mem_release(handle_cache_.back());
    handle_cache_.pop_back();
    cached_ -= config_.chunk;
    given += config_.chunk;
  }
  while (free_bytes() > keep && !free_segments_.empty()) {
    const std::uint32_t index = free_segments_.back();
    given += segments_[index].bytes;
    unmap_segment(index, false);
  }
  return given;
}

Result Region::add_accessor(int device) {
  accessors_ |= std::uint64_t{1} << device;
  Result first_error = res::ok;
  for (const Segment& g : segments_) {
    if (!g.live) continue;
    const Result r = driver_.mem_set_access(g.base, g.bytes, device, true);
    if (r != res::ok && first_error == res::ok) first_error = r;
  }
  return first_error;
}

}  // namespace allocshim::vmm
