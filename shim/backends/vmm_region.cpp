#include "backends/vmm_region.h"

#include <algorithm>

#include "backends/vmm_heap.h"
#include "base/log.h"

namespace allocshim::vmm {
namespace {

// Bit ranges [lo, hi] (inclusive) of a bitmap, a word at a time. Inlined: they are on the hit
// path, where a range is mostly one word.
[[gnu::always_inline]] inline std::uint64_t mask(std::uint32_t lo, std::uint32_t hi,
                                                 std::uint32_t w) {
  const std::uint32_t from = std::max(lo, w * 64) - w * 64;
  const std::uint32_t to = std::min(hi, w * 64 + 63) - w * 64;
  return (~std::uint64_t{0} >> (63 - to)) & (~std::uint64_t{0} << from);
}
[[gnu::always_inline]] inline void set_bits(std::vector<std::uint64_t>& v, std::uint32_t lo,
                                            std::uint32_t hi) {
  for (std::uint32_t w = lo / 64; w <= hi / 64; ++w) v[w] |= mask(lo, hi, w);
}
[[gnu::always_inline]] inline void clear_bits(std::vector<std::uint64_t>& v, std::uint32_t lo,
                                              std::uint32_t hi) {
  for (std::uint32_t w = lo / 64; w <= hi / 64; ++w) v[w] &= ~mask(lo, hi, w);
}
[[gnu::always_inline]] inline void set_bit(std::vector<std::uint64_t>& v, std::uint32_t i) {
  v[i / 64] |= std::uint64_t{1} << (i % 64);
}
[[gnu::always_inline]] inline void clear_bit(std::vector<std::uint64_t>& v, std::uint32_t i) {
  v[i / 64] &= ~(std::uint64_t{1} << (i % 64));
}
[[gnu::always_inline]] inline bool test_bit(const std::vector<std::uint64_t>& v, std::uint32_t i) {
  return (v[i / 64] >> (i % 64) & 1) != 0;
}
// The first clear bit in [lo, hi], or hi + 1.
[[gnu::always_inline]] inline std::uint32_t first_clear(const std::vector<std::uint64_t>& v,
                                                        std::uint32_t lo, std::uint32_t hi) {
  for (std::uint32_t w = lo / 64; w <= hi / 64; ++w) {
    const std::uint64_t zeros = ~v[w] & mask(lo, hi, w);
    if (zeros != 0) return w * 64 + static_cast<std::uint32_t>(__builtin_ctzll(zeros));
  }
  return hi + 1;
}

}  // namespace

Region::Region(const Driver& driver, const RegionConfig& config)
    : driver_(driver), config_(config) {
  phys_.location = Location{Location::Type::device, config.device};
  phys_.posix_fd = config.posix_fd;
  accessors_ = std::uint64_t{1} << config.device;
}

Region::~Region() {
  for (Range& r : ranges_)
    for (std::uint32_t i = 0; i < r.slots.size(); ++i) {
      if (!test_bit(r.mapped, i)) continue;
      driver_.mem_unmap(r.base + static_cast<DevPtr>(i) * config_.chunk, config_.chunk);
      driver_.mem_release(r.slots[i].handle);
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
  const std::size_t chunks = want / config_.chunk;
  range.slots.resize(chunks);
  range.mapped.assign((chunks + 63) / 64, 0);
  range.free.assign((chunks + 63) / 64, 0);
  ranges_.push_back(std::move(range));
  va_ += want;
  *base = p;
  *size = want;
  return res::ok;
}

Result Region::map_chunk(std::uint32_t ri, std::uint32_t slot, MemHandle handle) {
  Range& range = ranges_[ri];
  const Result r = driver_.mem_map(range.base + static_cast<DevPtr>(slot) * config_.chunk,
                                   config_.chunk, 0, handle);
  if (r != res::ok) return r;
  range.slots[slot] = Slot{handle, 0};
  set_bit(range.mapped, slot);
  set_bit(range.free, slot);  // nothing counted in it yet; acquire() counts it next
  mapped_ += config_.chunk;
  free_mapped_ += config_.chunk;
  return res::ok;
}

Result Region::map_run(std::uint32_t ri, std::uint32_t first, std::uint32_t count) {
  // Every chunk is its own handle and mapping, so that any wholly free chunk can later be moved
  // where growth needs it, also one in a large block's old place that smaller blocks now partly
  // use: with one mapping per run, a live block anywhere in it pinned the whole run (the
  // alloc_latency --mixed workload on the fake: peak reserved / peak live 1.27 with a mapping per
  // run, 1.06 with one per chunk). Wholly free memory elsewhere is moved here before any is
  // created: the region grows only when nothing it holds is free.
  const auto cached = static_cast<std::uint32_t>(handle_cache_.size());
  if (cached < count && free_mapped_ > 0) recycle_free(count - cached, true);
  const std::uint32_t start = first, end = first + count;
  bool recycled = false;
  Result r = res::ok;
  while (first < end) {
    MemHandle h = 0;
    if (!handle_cache_.empty()) {
      h = handle_cache_.back();
      handle_cache_.pop_back();
      cached_ -= config_.chunk;
    } else {
      r = driver_.mem_create(&h, config_.chunk, phys_);
      if (r == res::out_of_memory && !recycled) {
        recycled = true;
        if (recycle_free(~std::uint32_t{0}, true) > 0) continue;  // from the handles just cached
      }
      if (r != res::ok) break;
      ++creates_;
    }
    r = map_chunk(ri, first, h);
    if (r != res::ok) {
      handle_cache_.push_back(h);
      cached_ += config_.chunk;
      break;
    }
    ++first;
  }
  // Access is set once per device for the whole run (it may span mappings), not once per chunk.
  const Range& range = ranges_[ri];
  for (int d = 0; r == res::ok && d < static_cast<int>(kMaxDevices); ++d) {
    if ((accessors_ >> d & 1) == 0) continue;
    const Result a =
        driver_.mem_set_access(range.base + static_cast<DevPtr>(start) * config_.chunk,
                               static_cast<std::size_t>(count) * config_.chunk, d, true);
    // Without access for its own device the memory is useless; a peer's failure only costs the
    // peer (its kernels would fault on these chunks), so it is said, once, and the block is kept.
    if (a != res::ok && d == config_.device) r = a;
    if (a != res::ok && d != config_.device && !peer_failure_said_) {
      peer_failure_said_ = true;
      log::write(log::Level::warn,
                 "vmm: cuMemSetAccess for peer device %d on device %d memory failed "
                 "(error %d): that peer cannot reach these blocks",
                 d, config_.device, a);
    }
  }
  if (r != res::ok)  // nothing of the run is usable: its chunks go back to the cache, still held
    for (std::uint32_t i = start; i < first; ++i) unmap_chunk(ri, i, true);
  return r;
}

void Region::count(Range& range, DevPtr addr, std::size_t bytes, bool add) {
  const std::size_t chunk = config_.chunk;
  const auto first = static_cast<std::uint32_t>((addr - range.base) / chunk);
  const auto last = static_cast<std::uint32_t>((addr + bytes - 1 - range.base) / chunk);
  const DevPtr end = addr + bytes;
  // The first and last chunks may be shared with other blocks: their bytes are counted.
  auto edge = [&](std::uint32_t i) {
    const DevPtr cs = range.base + static_cast<DevPtr>(i) * chunk;
    const std::size_t overlap = std::min<DevPtr>(cs + chunk, end) - std::max<DevPtr>(cs, addr);
    Slot& s = range.slots[i];
    const bool was_used = s.used != 0;
    s.used = add ? s.used + overlap : s.used - overlap;
    if (was_used == (s.used != 0)) return;
    if (add) {
      clear_bit(range.free, i);
      free_mapped_ -= chunk;
    } else {
      set_bit(range.free, i);
      free_mapped_ += chunk;
    }
  };
  edge(first);
  if (last > first) edge(last);
  // The chunks in between belong to this block alone: wholly free exactly while it is not in use.
  if (last > first + 1) {
    const std::size_t n = static_cast<std::size_t>(last - first - 1) * chunk;
    if (add) {
      clear_bits(range.free, first + 1, last - 1);
      free_mapped_ -= n;
    } else {
      set_bits(range.free, first + 1, last - 1);
      free_mapped_ += n;
    }
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
  for (std::uint32_t i = first_clear(range->mapped, first, last); i <= last;) {
    std::uint32_t j = i;
    while (j <= last && !test_bit(range->mapped, j)) ++j;
    const Result r = map_run(ri, i, j - i);
    if (r != res::ok) return r;
    range = &ranges_[ri];
    *mapped += static_cast<std::size_t>(j - i) * chunk;
    i = j <= last ? first_clear(range->mapped, j, last) : j;
  }
  count(*range, addr, bytes, true);
  return res::ok;
}

bool Region::backed(DevPtr addr, std::size_t bytes) const {
  const Range* range = range_of(addr);
  if (range == nullptr || bytes == 0 || bytes > range->bytes - (addr - range->base)) return false;
  const auto first = static_cast<std::uint32_t>((addr - range->base) / config_.chunk);
  const auto last = static_cast<std::uint32_t>((addr + bytes - 1 - range->base) / config_.chunk);
  return first_clear(range->mapped, first, last) > last;
}

void Region::release(DevPtr addr, std::size_t bytes) {
  Range* range = range_of(addr);
  if (range == nullptr || bytes == 0) return;
  count(*range, addr, bytes, false);
}

void Region::unmap_chunk(std::uint32_t ri, std::uint32_t slot, bool keep_handle) {
  Range& range = ranges_[ri];
  driver_.mem_unmap(range.base + static_cast<DevPtr>(slot) * config_.chunk, config_.chunk);
  const MemHandle h = range.slots[slot].handle;
  if (keep_handle) {
    handle_cache_.push_back(h);
    cached_ += config_.chunk;
  } else {
    driver_.mem_release(h);
  }
  range.slots[slot] = Slot{};
  clear_bit(range.mapped, slot);
  clear_bit(range.free, slot);
  mapped_ -= config_.chunk;
  free_mapped_ -= config_.chunk;
}

std::uint32_t Region::recycle_free(std::uint32_t need, bool keep) {
  std::uint32_t gathered = 0;
  // Highest addresses first: the heap fills ranges from their low end.
  for (std::uint32_t ri = static_cast<std::uint32_t>(ranges_.size());
       ri-- > 0 && gathered < need;) {
    Range& range = ranges_[ri];
    for (auto w = static_cast<std::uint32_t>(range.free.size()); w-- > 0 && gathered < need;) {
      std::uint64_t bits = range.free[w];
      // Chunks of the acquire in progress are about to be counted in use: not these.
      if (ri == avoid_range_ && avoid_first_ <= w * 64 + 63 && avoid_last_ >= w * 64)
        bits &= ~mask(avoid_first_, avoid_last_, w);
      for (; bits != 0 && gathered < need; ++gathered) {
        const auto bit = static_cast<std::uint32_t>(63 - __builtin_clzll(bits));
        bits &= ~(std::uint64_t{1} << bit);
        unmap_chunk(ri, w * 64 + bit, keep);
      }
    }
  }
  return gathered;
}

std::size_t Region::trim(std::size_t keep) {
  std::size_t given = 0;
  while (free_bytes() > keep && !handle_cache_.empty()) {
    driver_.mem_release(handle_cache_.back());
    handle_cache_.pop_back();
    cached_ -= config_.chunk;
    given += config_.chunk;
  }
  if (free_bytes() > keep) {
    avoid_range_ = ~std::uint32_t{0};  // no acquire in progress
    const auto n =
        static_cast<std::uint32_t>((free_bytes() - keep + config_.chunk - 1) / config_.chunk);
    given += static_cast<std::size_t>(recycle_free(n, false)) * config_.chunk;
  }
  return given;
}

Result Region::add_accessor(int device) {
  accessors_ |= std::uint64_t{1} << device;
  Result first_error = res::ok;
  for (const Range& range : ranges_) {
    const auto n = static_cast<std::uint32_t>(range.slots.size());
    for (std::uint32_t i = 0; i < n;) {
      if (!test_bit(range.mapped, i)) {
        ++i;
        continue;
      }
      std::uint32_t j = i;
      while (j < n && test_bit(range.mapped, j)) ++j;
      const Result r =
          driver_.mem_set_access(range.base + static_cast<DevPtr>(i) * config_.chunk,
                                 static_cast<std::size_t>(j - i) * config_.chunk, device, true);
      if (r != res::ok && first_error == res::ok) first_error = r;
      i = j;
    }
  }
  return first_error;
}

}  // namespace allocshim::vmm
