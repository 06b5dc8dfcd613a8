#include "placement/use_tracker.h"

#include <algorithm>
#include <cstring>

namespace allocshim {
namespace {

// How long a writer waits for submissions still reading an old snapshot before it leaves the
// snapshot for a later writer to free: launches last microseconds, a synchronous copy may not.
constexpr std::uint64_t kQuiesceNs = 2'000'000;

// Retired snapshots and records are freed this many at a time: each freeing waits for the gate's
// submissions (a process-wide barrier), which an allocation should not pay every time.
constexpr std::size_t kReclaimBatch = 16;

// The largest parameter list scanned: the driver caps a kernel's parameters at 32 KiB.
constexpr std::size_t kMaxParamBytes = 32768;

}  // namespace

UseTracker::~UseTracker() {
  delete ranges_.load(std::memory_order_relaxed);
  for (const Ranges* r : retired_ranges_) delete r;
}

UseRecord* UseTracker::add(DevPtr base, std::size_t bytes, int device) {
  std::lock_guard lock(mutex_);
  auto record = std::make_unique<UseRecord>();
  record->device = device;
  const std::uint64_t e = epoch();
  record->last_epoch.store(e, std::memory_order_relaxed);
  record->epochs.store(1, std::memory_order_relaxed);
  record->bytes = bytes;
  UseRecord* out = record.get();
  auto& slot = live_[base];
  if (slot.second) retired_records_.push_back(std::move(slot.second));  // never: bases are unique
  slot = {bytes, std::move(record)};
  publish();
  return out;
}

void UseTracker::remove(DevPtr base) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(base);
  if (it == live_.end()) return;
  retired_records_.push_back(std::move(it->second.second));
  live_.erase(it);
  publish();
}

void UseTracker::publish() {
  auto next = std::make_unique<Ranges>();
  next->generation = ++generations_;
  publications_.fetch_add(1, std::memory_order_relaxed);
  next->entries.reserve(live_.size());
  for (const auto& [base, v] : live_)
    next->entries.push_back(Entry{base, base + v.first, v.second.get()});
  if (!next->entries.empty()) {
    next->lo = next->entries.front().base;
    next->span = next->entries.back().end - next->lo;
  }
  const Ranges* old = ranges_.exchange(next.release(), std::memory_order_seq_cst);
  if (old) retired_ranges_.push_back(old);
  reclaim();
}

void UseTracker::reclaim() {
  if (retired_ranges_.size() + retired_records_.size() < kReclaimBatch) return;
  // Submissions that entered before the exchange may still read the old snapshot and its records.
  if (!gate_.quiesce(kQuiesceNs)) return;  // a later publication frees them
  for (const Ranges* r : retired_ranges_) delete r;
  retired_ranges_.clear();
  // The policy lists records under the spill target's lock, which a removal also holds, and marks
  // itself a reader before: a record it may still hold is freed at a later publication.
  if (policy_readers_.load(std::memory_order_seq_cst) == 0) retired_records_.clear();
}

const UseTracker::Entry* UseTracker::find(const Ranges& r, DevPtr ptr) {
  // The last range starting at or below ptr, by a branch-free binary search: launch parameters
  // point anywhere, so the comparisons would mispredict half the time.
  const Entry* e = r.entries.data();
  std::size_t n = r.entries.size();
  if (n == 0) return nullptr;
  while (n > 1) {
    const std::size_t half = n / 2;
    e = e[half].base <= ptr ? e + half : e;
    n -= half;
  }
  return e->base <= ptr && ptr < e->end ? e : nullptr;
}

const UseTracker::Layout* UseTracker::layout(FunctionCache* c, Function f,
                                             CachedFunction*& cached) {
  cached = nullptr;
  if (__builtin_expect(c == nullptr, 0)) return layout_slow(f);
  const std::uint64_t gen = generation_.load(std::memory_order_acquire);
  if (__builtin_expect(c->generation != gen, 0)) {
    for (auto& set : c->ways)
      for (CachedFunction& w : set) w.key = nullptr;
    c->generation = gen;
  }
  const std::uint64_t h = reinterpret_cast<std::uintptr_t>(f) * 0x9E3779B97F4A7C15ull;
  CachedFunction* set = c->ways[h >> 59];  // the top 5 bits: one of kSets
  static_assert(FunctionCache::kSets == 32 && FunctionCache::kWaysPerSet == 2);
  if (__builtin_expect(set[0].key == f, 1)) return (cached = &set[0])->layout;
  if (set[1].key == f) return (cached = &set[1])->layout;
  c->misses.store(c->misses.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  const Layout* l = layout_slow(f);
  // The newest in front, the older one kept behind it (with its hints).
  set[1] = set[0];
  set[0] = CachedFunction{};
  set[0].key = f;
  set[0].layout = l;
  return (cached = &set[0])->layout;
}

const UseTracker::Layout* UseTracker::layout_slow(Function f) {
  std::lock_guard lock(layout_mutex_);
  auto& slot = layouts_[f];
  if (slot) return slot.get();
  auto l = std::make_unique<Layout>();
  // Parameters are asked one index at a time until the driver says there is none; a function the
  // driver cannot describe (an old driver, an unknown handle kind) is remembered as unknown.
  for (auto query : {driver_.func_get_param_info, driver_.kernel_get_param_info}) {
    if (query == nullptr) continue;
    l->words.clear();
    l->params = 0;
    std::size_t offset = 0, size = 0;
    Result r = res::ok;
    for (std::size_t i = 0; (r = query(f, i, &offset, &size)) == res::ok; ++i) {
      if (offset + size > kMaxParamBytes) break;
      l->params = static_cast<std::uint32_t>(i + 1);
      // Every aligned word of the parameter, so a pointer inside a struct passed by value counts.
      for (std::size_t w = 0; w + sizeof(DevPtr) <= size; w += sizeof(DevPtr))
        l->words.push_back(Word{static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(w),
                                static_cast<std::uint32_t>(offset + w)});
    }
    // The loop ends on the first index past the last parameter (invalid value); a function with
    // no parameter answers that at index 0, which is a known, empty layout. Any other error at
    // index 0 means this query does not know the handle.
    if (l->params > 0 || r == res::invalid_value) {
      l->known = true;
      break;
    }
  }
  slot = std::move(l);
  return slot.get();
}

void UseTracker::forget_functions() {
  std::lock_guard lock(layout_mutex_);
  for (auto& [f, l] : layouts_) stale_layouts_.push_back(std::move(l));
  layouts_.clear();
  generation_.fetch_add(1, std::memory_order_release);
}

UseTracker::Counts UseTracker::counts() const {
  Counts c;
  caches_.for_each([&](const FunctionCache& f) {
    c.launches += f.launches.load(std::memory_order_relaxed);
    c.unknown_layout += f.unknown.load(std::memory_order_relaxed);
    c.layout_misses += f.misses.load(std::memory_order_relaxed);
  });
  std::lock_guard lock(layout_mutex_);
  c.functions = layouts_.size();
  return c;
}

}  // namespace allocshim
