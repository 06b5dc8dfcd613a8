// What a kernel launch names (placement/use_tracker.h): its parameter words checked against the
// snapshot of movable ranges, a thread's repeats of one launch counted apart until they are
// settled, and the list a launch that asks the policy leaves for it. use_tracker.cpp keeps the
// movable ranges, their snapshots and the functions' parameter layouts.
#include <algorithm>
#include <cstring>

#include "placement/use_tracker.h"

namespace allocshim {
namespace {

// The packed parameter buffer and its size that a launch's `extra` array gives
// (CU_LAUNCH_PARAM_BUFFER_POINTER/SIZE); false when it gives no buffer.
bool packed_buffer(void** extra, const unsigned char*& buffer, std::size_t& buffer_size) {
  if (extra == nullptr) return false;
  for (std::size_t k = 0;
       k < 16 && reinterpret_cast<std::uintptr_t>(extra[k]) != UseTracker::kParamEnd; k += 2) {
    const auto key = reinterpret_cast<std::uintptr_t>(extra[k]);
    if (key == UseTracker::kParamBufferPointer)
      buffer = static_cast<const unsigned char*>(extra[k + 1]);
    else if (key == UseTracker::kParamBufferSize && extra[k + 1] != nullptr)
      std::memcpy(&buffer_size, extra[k + 1], sizeof buffer_size);
  }
  return buffer != nullptr;
}

}  // namespace

std::uint64_t UseTracker::words_hash(const Word* words, std::size_t n, void** params) {
  std::uint64_t h = n;
  for (std::size_t k = 0; k < n; ++k) {
    DevPtr v = 0;
    if (const auto* p = static_cast<const unsigned char*>(params[words[k].param]))
      std::memcpy(&v, p + words[k].at, sizeof v);
    h = ((h << 5 | h >> 59) ^ v) * 0x9E3779B97F4A7C15ull;
  }
  return h;
}

void UseTracker::flush_repeat(FunctionCache& c, int id, const Ranges& r) {
  FunctionCache::Repeat& rep = c.repeat;
  const bool same = rep.generation == r.generation;
  for (unsigned i = 0; i < rep.records_n; ++i) {
    // A later snapshot still holds the record if its allocation was not freed.
    const Entry* e = same ? nullptr : find(r, rep.bases[i]);
    if (same || (e != nullptr && e->record == rep.records[i]))
      rep.records[i]->count(id, rep.pending, rep.share);
  }
  rep.pending = 0;
}

void UseTracker::settle() {
  const int id = threads::id();
  FunctionCache* c = id >= 0 ? caches_.find(id) : nullptr;
  if (c == nullptr || c->repeat.pending == 0) return;
  // The records are live if they are in the current snapshot, and stay so while the read is open.
  PolicyRead read(*this);
  if (const Ranges* r = ranges_.load(std::memory_order_seq_cst)) flush_repeat(*c, id, *r);
  c->repeat.pending = 0;
  c->repeat.f = nullptr;
}

// What one launch's parameter words name, found with the snapshot `r` in epoch `e` by thread `id`.
struct UseTracker::Scan {
  // The function's hints, if they point into this snapshot; otherwise they start empty.
  Scan(const Ranges& r, CachedFunction* cached, std::uint64_t e, int id) : r(r), e(e), id(id) {
    if (cached) {
      hints = cached->hints;
      if (__builtin_expect(cached->hint_generation != r.generation, 0)) {
        std::fill(std::begin(cached->hints), std::end(cached->hints), nullptr);
        cached->hint_generation = r.generation;
      }
    }
  }

  const Ranges& r;
  const std::uint64_t e;
  const int id;
  const Entry** hints = nullptr;
  bool ahead = false, host = false, time = false;
  // The records named, counted once the scan knows how many distinct ones there are (a
  // multi-tensor kernel names one allocation through many of its tensors); past kHits the rest
  // count the least share.
  static constexpr std::size_t kHits = 128;
  UseRecord* hits[kHits];
  std::size_t nhits = 0;
  // The distinct records named, for the repeat memo (kRepeatRecords + 1: too many to remember).
  UseRecord* named[FunctionCache::kRepeatRecords];
  DevPtr named_bases[FunctionCache::kRepeatRecords];
  unsigned named_n = 0;

  // Checks every word `load(w, v)` gives; instantiated once per parameter form, so the loop has no
  // branch on the form. Always inlined, as every helper of a launch's scan: it runs per launch.
  template <class Load>
  [[gnu::always_inline]] void check(const Word* words, std::size_t n, Load load) {
    const DevPtr lo = r.lo;
    const std::uint64_t span = r.span;
    const Entry* last = nullptr;
    for (std::size_t k = 0; k < n; ++k) {
      DevPtr v;
      if (!load(words[k], v) || v - lo >= span) continue;
      // Consecutive words often point into one allocation (counted once), and a kernel launched
      // in a loop points each word where it did last time.
      if (last != nullptr && v - last->base < last->end - last->base) continue;
      const Entry* hit = hints && k < CachedFunction::kHints ? hints[k] : nullptr;
      if (__builtin_expect(hit == nullptr || v - hit->base >= hit->end - hit->base, 0)) {
        hit = find(r, v);
        if (hit == nullptr) continue;
        if (hints && k < CachedFunction::kHints) hints[k] = hit;
      }
      last = hit;
      note(*hit);
    }
  }

  // A word pointed into `hit`.
  [[gnu::always_inline]] void note(const Entry& hit) {
    UseRecord& u = *hit.record;
    if (__builtin_expect(nhits < kHits, 1))
      hits[nhits++] = &u;
    else
      u.touch(e, id, 1);
    if (named_n <= FunctionCache::kRepeatRecords &&
        std::find(named, named + named_n, &u) == named + named_n) {
      if (named_n < FunctionCache::kRepeatRecords) {
        named[named_n] = &u;
        named_bases[named_n] = hit.base;
      }
      ++named_n;
    }
    // Host-resident: the first launch of the epoch that names it asks the policy, and one whose
    // timing is due is timed (an exchange each, once per epoch or kRetimeEpochs).
    if (__builtin_expect(u.on_host(), 0)) {
      host = true;
      if (u.ahead_epoch.load(std::memory_order_relaxed) != e &&
          u.ahead_epoch.exchange(e, std::memory_order_relaxed) != e)
        ahead = true;
      if (u.time_due.load(std::memory_order_relaxed) <= e &&
          u.time_due.exchange(e + UseRecord::kRetimeEpochs, std::memory_order_relaxed) <= e)
        time = true;
    }
  }

  // Counts the launch in every distinct record it named, each the same share, which it returns.
  [[gnu::always_inline]] std::uint64_t touch_hits() {
    if (nhits > 1) {
      std::sort(hits, hits + nhits);
      nhits = static_cast<std::size_t>(std::unique(hits, hits + nhits) - hits);
    }
    const std::uint64_t share =
        nhits > 0 ? std::max<std::uint64_t>(UseRecord::kWhole / nhits, 1) : 0;
    for (std::size_t i = 0; i < nhits; ++i) hits[i]->touch(e, id, share);
    return share;
  }
};

[[gnu::always_inline]] inline bool UseTracker::repeats(FunctionCache& c, int id, const Ranges& r,
                                                       Function f, void** params, std::uint64_t e) {
  FunctionCache::Repeat& rep = c.repeat;
  if (rep.f == f && params != nullptr && rep.epoch == e && rep.generation == r.generation &&
      rep.moves == gate_.moves() && rep.functions == generation_.load(std::memory_order_relaxed) &&
      words_hash(rep.words, rep.n, params) == rep.hash) {
    c.launches.store(c.launches.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    // Inside the gate with the snapshot the records came from: they are live.
    if (++rep.pending == FunctionCache::kRepeatFlush) flush_repeat(c, id, r);
    return true;
  }
  if (rep.pending != 0) flush_repeat(c, id, r);
  rep.f = nullptr;
  return false;
}

[[gnu::always_inline]] inline void UseTracker::remember(FunctionCache& c, Function f,
                                                        const Layout& l, void** params,
                                                        const Ranges& r, const Scan& scan,
                                                        std::uint64_t share) {
  const Word* const words = l.words.data();
  const std::size_t n = l.words.size();
  FunctionCache::Repeat& rep = c.repeat;
  rep.f = f;
  rep.words = words;
  rep.n = static_cast<std::uint32_t>(n);
  rep.hash = words_hash(words, n, params);
  rep.epoch = scan.e;
  rep.generation = r.generation;
  rep.moves = gate_.moves();
  rep.functions = generation_.load(std::memory_order_relaxed);
  rep.records_n = scan.named_n;
  rep.share = share;
  std::copy(scan.named, scan.named + scan.named_n, rep.records);
  std::copy(scan.named_bases, scan.named_bases + scan.named_n, rep.bases);
}

unsigned UseTracker::mark_launch(Function f, void** params, void** extra) {
  const Ranges* r = ranges_.load(std::memory_order_seq_cst);
  if (r == nullptr || r->entries.empty()) return 0;  // nothing movable: no layout needed
  const int id = threads::id();
  FunctionCache* c = id >= 0 ? caches_.get(id) : nullptr;
  const std::uint64_t e = epoch();
  const bool taped = tape_.armed();
  if (c != nullptr && repeats(*c, id, *r, f, params, e)) {
    if (__builtin_expect(taped, 0)) tape_.submission(f, c->repeat.records, c->repeat.records_n);
    return 0;
  }
  CachedFunction* cached = nullptr;
  const Layout* l = layout(c, f, cached);
  if (c)
    c->launches.store(c->launches.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  const unsigned char* buffer = nullptr;
  std::size_t buffer_size = 0;
  if (!l->known || (params == nullptr && !packed_buffer(extra, buffer, buffer_size))) {
    if (!l->known && c)
      c->unknown.store(c->unknown.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    // Its place in the sequence counts for learning the step, though it names nothing seen.
    if (__builtin_expect(taped, 0)) tape_.submission(f, nullptr, 0);
    return 0;
  }
  Scan scan(*r, cached, e, id);
  if (params) {
    scan.check(l->words.data(), l->words.size(), [params](const Word& w, DevPtr& v) {
      const auto* p = static_cast<const unsigned char*>(params[w.param]);
      if (__builtin_expect(p == nullptr, 0)) return false;
      std::memcpy(&v, p + w.at, sizeof v);
      return true;
    });
  } else {
    scan.check(l->words.data(), l->words.size(), [buffer, buffer_size](const Word& w, DevPtr& v) {
      if (w.packed + sizeof(DevPtr) > buffer_size) return false;
      std::memcpy(&v, buffer + w.packed, sizeof v);
      return true;
    });
  }
  const std::uint64_t share = scan.touch_hits();
  if (__builtin_expect(taped, 0)) tape_.submission(f, scan.hits, static_cast<unsigned>(scan.nhits));
  if (__builtin_expect(scan.host, 0) && cached != nullptr && cached->timed_epoch != e)
    scan.time = true;
  if (scan.time && cached != nullptr) cached->timed_epoch = e;
  if (__builtin_expect(!scan.ahead && !scan.time, 1)) {
    if (c != nullptr && params != nullptr && scan.named_n <= FunctionCache::kRepeatRecords)
      remember(*c, f, *l, params, *r, scan, share);
    return 0;
  }
  if (c == nullptr) return 0;
  name_all(*c, *r, *l, params, buffer, buffer_size);
  return (scan.ahead ? kAskAhead : 0) | (scan.time ? kTime : 0);
}

void UseTracker::name_all(FunctionCache& c, const Ranges& r, const Layout& l, void** params,
                          const unsigned char* buffer, std::size_t buffer_size) {
  // Rare: once more, to say what this launch names (nothing of it may make room for the rest).
  c.named_n = 0;
  for (const Word& w : l.words) {
    const unsigned char* p = nullptr;
    if (params)
      p = params[w.param] ? static_cast<const unsigned char*>(params[w.param]) + w.at : nullptr;
    else if (w.packed + sizeof(DevPtr) <= buffer_size)
      p = buffer + w.packed;
    if (p == nullptr) continue;
    DevPtr v;
    std::memcpy(&v, p, sizeof v);
    const Entry* en = v - r.lo < r.span ? find(r, v) : nullptr;
    if (en == nullptr) continue;
    bool seen = false;
    for (unsigned i = 0; i < c.named_n; ++i) seen = seen || c.named[i] == en->base;
    if (seen) continue;
    if (c.named_n == FunctionCache::kNamed) break;
    c.named[c.named_n] = en->base;
    c.host_bytes[c.named_n] = en->record->host_bytes.load(std::memory_order_relaxed);
    c.device[c.named_n] = en->record->device;
    ++c.named_n;
  }
  c.ahead = true;
}

bool UseTracker::take_named(Named& out) {
  out.named.clear();
  out.host.clear();
  const int id = threads::id();
  FunctionCache* c = id >= 0 ? caches_.get(id) : nullptr;
  if (c == nullptr || !c->ahead) return false;
  c->ahead = false;
  for (unsigned i = 0; i < c->named_n; ++i) {
    out.named.push_back(c->named[i]);
    if (c->host_bytes[i] == 0) continue;
    if (out.host.empty()) out.device = c->device[i];
    if (c->device[i] == out.device)
      out.host.push_back(HostCost::Named{c->named[i], c->host_bytes[i]});
  }
  return !out.host.empty();
}

}  // namespace allocshim
