#include "core/use_tracker.h"

#include <algorithm>
#include <cstring>

namespace allocshim {
namespace {

// How long a writer waits for submissions still reading an old snapshot before it leaves the
// snapshot for a later writer to free: launches last microseconds, a synchronous copy may not.
constexpr std::uint64_t kQuiesceNs = 2'000'000;

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
  next->entries.reserve(live_.size());
  for (const auto& [base, v] : live_) next->entries.push_back(Entry{base, base + v.first, v.second.get()});
  if (!next->entries.empty()) {
    next->lo = next->entries.front().base;
    next->span = next->entries.back().end - next->lo;
  }
  const Ranges* old = ranges_.exchange(next.release(), std::memory_order_seq_cst);
  if (old) retired_ranges_.push_back(old);
  reclaim();
}

void UseTracker::reclaim() {
  if (retired_ranges_.empty() && retired_records_.empty()) return;
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

const UseTracker::Layout* UseTracker::layout(FunctionCache* c, Function f) {
  if (__builtin_expect(c == nullptr, 0)) return layout_slow(f);
  const std::uint64_t gen = generation_.load(std::memory_order_acquire);
  if (__builtin_expect(c->generation != gen, 0)) {
    std::fill(std::begin(c->keys), std::end(c->keys), nullptr);
    c->generation = gen;
  }
  const std::size_t way = (reinterpret_cast<std::uintptr_t>(f) >> 4) % FunctionCache::kWays;
  if (__builtin_expect(c->keys[way] == f, 1)) return c->layouts[way];
  const Layout* l = layout_slow(f);
  c->keys[way] = f;
  c->layouts[way] = l;
  return l;
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
    l->params.clear();
    std::size_t offset = 0, size = 0;
    Result r = res::ok;
    for (std::size_t i = 0; (r = query(f, i, &offset, &size)) == res::ok; ++i) {
      if (offset + size > kMaxParamBytes) break;
      l->params.emplace_back(static_cast<std::uint32_t>(offset), static_cast<std::uint32_t>(size));
    }
    // The loop ends on the first index past the last parameter (invalid value); a function with
    // no parameter answers that at index 0, which is a known, empty layout. Any other error at
    // index 0 means this query does not know the handle.
    if (!l->params.empty() || r == res::invalid_value) {
      l->known = true;
      break;
    }
  }
  slot = std::move(l);
  return slot.get();
}

bool UseTracker::mark_launch(Function f, void** params, void** extra) {
  const Ranges* r = ranges_.load(std::memory_order_seq_cst);
  if (r == nullptr || r->entries.empty()) return false;  // nothing movable: no layout needed
  const int id = threads::id();
  FunctionCache* c = id >= 0 ? caches_.get(id) : nullptr;
  const Layout* l = layout(c, f);
  if (c) c->launches.store(c->launches.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (!l->known) {
    if (c) c->unknown.store(c->unknown.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return false;
  }
  const unsigned char* buffer = nullptr;
  std::size_t buffer_size = 0;
  if (params == nullptr && extra != nullptr) {
    for (std::size_t k = 0; k < 16 && reinterpret_cast<std::uintptr_t>(extra[k]) != kParamEnd; k += 2) {
      const auto key = reinterpret_cast<std::uintptr_t>(extra[k]);
      if (key == kParamBufferPointer) buffer = static_cast<const unsigned char*>(extra[k + 1]);
      else if (key == kParamBufferSize && extra[k + 1] != nullptr)
        std::memcpy(&buffer_size, extra[k + 1], sizeof buffer_size);
    }
    if (buffer == nullptr) return false;
  } else if (params == nullptr) {
    return false;
  }
  // Calls `fn` with every word of the parameters that lies in a movable range, and its entry.
  auto scan = [&](auto fn) {
    const Entry* last = nullptr;
    for (std::size_t i = 0; i < l->params.size(); ++i) {
      const auto [offset, size] = l->params[i];
      const unsigned char* p = params ? static_cast<const unsigned char*>(params[i]) : buffer + offset;
      if (p == nullptr || (!params && offset + size > buffer_size)) continue;
      for (std::uint32_t w = 0; w + sizeof(DevPtr) <= size; w += sizeof(DevPtr)) {
        DevPtr v;
        std::memcpy(&v, p + w, sizeof v);
        if (v - r->lo >= r->span) continue;
        // Consecutive parameters often point into one allocation: its range is checked first.
        if (last != nullptr && v - last->base < last->end - last->base) continue;
        last = c ? find_recent(*c, *r, v) : find(*r, v);
        if (last) fn(*last);
      }
    }
  };
  const std::uint64_t e = epoch();
  if (c && c->recent_generation != r->generation) {
    c->recent_generation = r->generation;
    std::fill(std::begin(c->recent), std::end(c->recent), nullptr);
  }
  bool ahead = false;
  scan([&](const Entry& en) {
    UseRecord& u = *en.record;
    u.touch(e, id);
    // Host-resident: the first launch of the epoch that names it asks the policy (one exchange).
    if (__builtin_expect(u.on_host.load(std::memory_order_relaxed), 0) &&
        u.ahead_epoch.load(std::memory_order_relaxed) != e && u.ahead_epoch.exchange(e, std::memory_order_relaxed) != e)
      ahead = true;
  });
  if (!ahead || c == nullptr) return false;
  // Rare: once more, to say what this launch names (nothing of it may make room for the rest).
  c->named_n = 0;
  scan([&](const Entry& en) {
    if (c->named_n == FunctionCache::kNamed) return;
    c->named[c->named_n] = en.base;
    c->on_host[c->named_n] = en.record->on_host.load(std::memory_order_relaxed);
    c->device[c->named_n] = en.record->device;
    ++c->named_n;
  });
  c->ahead = true;
  return true;
}

bool UseTracker::take_ahead(Ahead& out) {
  out.wanted.clear();
  out.named.clear();
  const int id = threads::id();
  FunctionCache* c = id >= 0 ? caches_.get(id) : nullptr;
  if (c == nullptr || !c->ahead) return false;
  c->ahead = false;
  for (unsigned i = 0; i < c->named_n; ++i) {
    out.named.push_back(c->named[i]);
    if (!c->on_host[i]) continue;
    if (out.wanted.empty()) out.device = c->device[i];
    if (c->device[i] == out.device) out.wanted.push_back(c->named[i]);
  }
  return !out.wanted.empty();
}

const UseTracker::Entry* UseTracker::find_recent(FunctionCache& c, const Ranges& r, DevPtr ptr) {
  // A thread's launches keep pointing into the same few allocations (a model's weights).
  for (const Entry* e : c.recent)
    if (e != nullptr && ptr - e->base < e->end - e->base) return e;
  const Entry* e = find(r, ptr);
  if (e) c.recent[c.recent_next++ % FunctionCache::kRecent] = e;
  return e;
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
  });
  std::lock_guard lock(layout_mutex_);
  c.functions = layouts_.size();
  return c;
}

}  // namespace allocshim
