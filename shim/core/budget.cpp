#include "core/budget.h"

#include <algorithm>
#include <cstdio>

#include "base/human.h"
#include "base/peak.h"

namespace allocshim {
namespace {

bool has_budget(const policy::Budget& b) {
  return b.device != policy::kUnlimited || b.percent >= 0 || !b.per_device.empty() ||
         !b.per_device_percent.empty();
}

// Whether a request served by a backend of `kind` through `api` is admitted against the budget.
// Managed requests never are: they must stay host-accessible, so they are never spilled to the
// host backend (the driver places managed pages). The native backend's live bytes, which the
// budget reads, still include native managed memory: conservative, and documented.
bool counted(BackendKind kind, Api api) {
  if (api == Api::managed) return false;
  switch (kind) {
    case BackendKind::native: return true;
    case BackendKind::async_pool:
    case BackendKind::vmm: return true;
    case BackendKind::managed:
    case BackendKind::host: return false;
  }
  return false;
}

bool pooling(BackendKind kind) {
  return kind == BackendKind::async_pool || kind == BackendKind::vmm;
}

}  // namespace

void Budget::configure(const policy::Budget& budget, Backend* spill) {
  std::lock_guard lock(mutex_);
  ++configured_;
  config_ = budget;
  // Limits are resolved again on first use: a reload may change them, and a percentage needs the
  // device's total memory, which is asked only for devices the program uses.
  for (Device& d : devices_) d.limit.store(kUnresolved, std::memory_order_relaxed);
  spill_.store(spill, std::memory_order_release);
  spill_kind_.store(spill ? budget.spill : Spill::none, std::memory_order_relaxed);
  const bool movable = has_budget(budget) && spill && budget.spill == Spill::host;
  const Migrate mode = movable ? budget.migrate : Migrate::off;
  migrate_.store(mode, std::memory_order_relaxed);
  node_.configure(has_budget(budget) ? budget.share : policy::Budget::Share::process,
                  budget.share_wait_ms);
  migration_.configure(mode != Migrate::off ? spill->movable() : nullptr, mode);
  active_.store(has_budget(budget), std::memory_order_release);
}

std::uint64_t Budget::host_reserve() const {
  const Movable* m = movable();
  return m != nullptr ? m->host_reserve() : 0;
}

Movable* Budget::movable() const {
  Backend* s = spill_.load(std::memory_order_acquire);
  return s != nullptr && migrate() != Migrate::off ? s->movable() : nullptr;
}

std::uint64_t Budget::limit(int device) {
  const std::uint64_t v = at(device).limit.load(std::memory_order_relaxed);
  return __builtin_expect(v != kUnresolved, 1) ? v : resolve(device);
}

std::uint64_t Budget::resolve(int device) {
  std::unique_lock lock(mutex_);
  Device& d = at(device);
  for (;;) {
    std::uint64_t v = d.limit.load(std::memory_order_relaxed);
    if (v != kUnresolved) return v;
    std::size_t total = 0;
    if (driver_.device_total_mem(&total, device) != res::ok) total = 0;
    v = has_budget(config_) ? policy::budget_for(config_, device, total) : policy::kUnlimited;
    if (v != policy::kUnlimited && node_.active()) {
      // Joining may wait for another process's region lock: other devices' limits and a reload
      // must not wait behind it.
      const std::uint64_t configured = configured_;
      lock.unlock();
      v = node_.attach(device, v);
      lock.lock();
      if (configured != configured_) continue;  // reloaded meanwhile: resolved again
    }
    d.limit.store(v, std::memory_order_relaxed);
    return v;
  }
}

Budget::Budget(const Driver& driver, BudgetSources sources) : driver_(driver), sources_(sources) {
  // What allocshim top shows of this process: its device and host bytes and what it moved.
  node_.set_usage_source([this](int device) {
    const Device& d = at(device);
    node::Usage u{};
    u.device = backed(device);
    if (const Backend* s = spill_.load(std::memory_order_acquire)) {
      const std::uint64_t live = s->stats().device(device).live_bytes();
      const std::uint64_t on_device = d.spill_device.load(std::memory_order_relaxed);
      u.host = live > on_device ? live - on_device : 0;
    }
    u.to_device = d.promoted_bytes.load(std::memory_order_relaxed);
    u.to_host = d.demoted_bytes.load(std::memory_order_relaxed);
    return u;
  });
}

std::uint64_t Budget::backed(int device) const {
  const Device& d = at(device);
  std::uint64_t sum = d.pending.load(std::memory_order_relaxed) +
                      d.spill_device.load(std::memory_order_relaxed) +
                      sources_.created->device(device).live_bytes();
  const std::size_t n = sources_.count->load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    const Backend& b = *sources_.backends[i];
    const DeviceStats& s = b.stats().device(device);
    if (b.kind() == BackendKind::native)
      sum += s.live_bytes();
    else if (pooling(b.kind()))
      sum += std::max(s.reserved_bytes(), s.live_bytes());
  }
  return sum;
}

std::uint64_t Budget::cached(int device) const {
  std::uint64_t sum = 0;
  const std::size_t n = sources_.count->load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    const Backend& b = *sources_.backends[i];
    if (!pooling(b.kind())) continue;
    const DeviceStats& s = b.stats().device(device);
    const std::uint64_t reserved = s.reserved_bytes(), live = s.live_bytes();
    if (reserved > live) sum += reserved - live;
  }
  return sum;
}

std::uint64_t Budget::headroom(int device) {
  const std::uint64_t lim = std::min(limit(device), node_.room(device));
  if (lim == policy::kUnlimited) return policy::kUnlimited;
  const std::uint64_t b = backed(device);
  return lim > b ? lim - b : 0;
}

bool Budget::trim_caches(int device) {
  if (cached(device) == 0) return false;
  const std::size_t n = sources_.count->load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    Backend& b = *sources_.backends[i];
    const DeviceStats& s = b.stats().device(device);
    if (pooling(b.kind()) && s.reserved_bytes() > s.live_bytes()) b.trim(device);
  }
  return true;
}

bool Budget::fit(int device, std::uint64_t lim, std::uint64_t extra, bool wait) {
  const std::uint64_t now = backed(device) + extra;
  if (now > lim) return false;
  if (__builtin_expect(!node_.covers(device, now), 0) && node_.grow(device, now, wait) < now)
    return false;
  raise_peak(at(device).peak_backed, now);
  return true;
}

bool Budget::admit(int device, std::size_t bytes, BackendKind kind, Api api, Ticket* ticket) {
  ticket->bytes = 0;
  if (!counted(kind, api)) return true;
  const std::uint64_t lim = limit(device);
  if (lim == policy::kUnlimited) return true;
  if (bytes > lim) return false;  // can never fit (and rounding it could wrap)
  // A pool may have to map one chunk more than the request's size rounded up: a block that starts
  // inside a chunk spans one chunk more than its size needs.
  const std::uint64_t est =
      (bytes + kBudgetUnit - 1) / kBudgetUnit * kBudgetUnit + (pooling(kind) ? kBudgetUnit : 0);
  Device& d = at(device);
  for (int attempt = 0;; ++attempt) {
    // Counted as pending before looking: of two threads racing for the last room, at least one
    // sees the other's request.
    d.pending.fetch_add(est, std::memory_order_relaxed);
    if (__builtin_expect(fit(device, lim, 0, attempt > 0), 1)) {
      ticket->device = device;
      ticket->bytes = est;
      return true;
    }
    d.pending.fetch_sub(est, std::memory_order_relaxed);
    // Under a shared budget the second look waits for other processes to give room back.
    if (attempt > 0 || (!trim_caches(device) && !node_.active())) return false;
  }
}

bool Budget::migratable(int device, std::size_t bytes, BackendKind kind, Api api) {
  // cudaMalloc-style requests only: stream-ordered ones keep their pool and stream (a spilled
  // range's free would have to wait for the stream), managed ones must stay host-accessible.
  // Requests under one chunk stay in the pools: a range of their own would cost a whole chunk.
  return migrate() == Migrate::auto_ && bytes >= kBudgetUnit &&
         (api == Api::alloc || api == Api::pitch) && counted(kind, api) &&
         limit(device) != policy::kUnlimited;
}

bool Budget::admit_create(int device, std::size_t bytes) {
  const std::uint64_t lim = limit(device);
  if (lim == policy::kUnlimited) return true;
  if (bytes > lim) return false;
  return fit(device, lim, bytes) ||
         ((trim_caches(device) || node_.active()) && fit(device, lim, bytes, true));
}

void Budget::report(int device, std::size_t* free, std::size_t* total) {
  const std::uint64_t lim = limit(device);
  if (lim == policy::kUnlimited) return;
  const std::uint64_t b = backed(device), c = cached(device);
  const std::uint64_t used = b > c ? b - c : 0;
  const std::uint64_t mine = std::min(lim, node_.room(device));  // less other processes' leases
  const std::uint64_t room = mine > used ? mine - used : 0;
  if (total) *total = std::min<std::uint64_t>(*total, lim);
  if (free) {
    *free = std::min<std::uint64_t>(*free, room);
    if (total) *free = std::min(*free, *total);
  }
}

std::size_t Budget::claim(int device, std::size_t want, std::size_t unit, Claim why) {
  if (asleep()) return 0;
  const std::uint64_t lim = limit(device);
  if (lim == policy::kUnlimited || want == 0) return want;
  Device& d = at(device);
  d.spill_device.fetch_add(want, std::memory_order_relaxed);
  std::uint64_t now = backed(device);
  // Blocks the program freed into a pool are room for the device part of a spilled range: a
  // request larger than the whole budget never went through admit's trim, so trim here, before
  // anything goes to the host that could have been device memory.
  if (now > lim && trim_caches(device)) now = backed(device);
  std::uint64_t cap = lim;
  // A phase taking the room over claims all the room it still needs as it comes free, not piece
  // by piece as the moves go, so that nobody takes it meanwhile (the giver itself, idle and past
  // its hold, would move its own memory back into it).
  std::uint64_t need = now;
  if (why == Claim::promotion && d.turn.handing_over())
    if (const Movable* m = movable()) need = std::max(now, now - want + m->host_bytes(device));
  if (!node_.covers(device, need)) {
    const bool holding = node_.holding(device);
    if (why == Claim::promotion && holding)
      cap = std::min(lim, node_.lease(device));
    else {
      // Promotion asks nobody here: busy safe points ask for what it promotes (ask_for_room).
      const bool ask = !holding && why != Claim::quiet && why != Claim::promotion;
      cap = std::min(lim, node_.grow(device, need, ask && why == Claim::waiting, ask));
    }
  }
  std::size_t back = 0;
  if (now > cap) {
    // Give back what overshoots, in whole units.
    const std::uint64_t excess = now - cap;
    back = std::min<std::size_t>(want, static_cast<std::size_t>((excess + unit - 1) / unit * unit));
    d.spill_device.fetch_sub(back, std::memory_order_relaxed);
  }
  fit(device, lim, 0);  // notes the peak of what is kept
  // Room an allocation waited for came from other processes, which will ask for it back at their
  // turn: as in a take-over, the host pieces for giving it are pinned meanwhile.
  if (why == Claim::waiting && back < want && migrate() == Migrate::auto_)
    expect_demotion(device, std::max(d.turn.expected(), lim));
  return want - back;
}

Budget::DeviceReport Budget::device_report(int device) const {
  const Device& d = at(device);
  const std::uint64_t lim = d.limit.load(std::memory_order_relaxed);
  return DeviceReport{lim == kUnresolved ? policy::kUnlimited : lim,
                      d.peak_backed.load(std::memory_order_relaxed),
                      d.spilled_allocs.load(std::memory_order_relaxed),
                      d.spilled_bytes.load(std::memory_order_relaxed),
                      d.refused.load(std::memory_order_relaxed),
                      d.promoted_bytes.load(std::memory_order_relaxed),
                      d.promotions.load(std::memory_order_relaxed),
                      d.demoted_bytes.load(std::memory_order_relaxed),
                      d.demotions.load(std::memory_order_relaxed),
                      d.migrate_ns.load(std::memory_order_relaxed),
                      d.move_failures.load(std::memory_order_relaxed),
                      d.shim_syncs.load(std::memory_order_relaxed),
                      d.skipped_busy.load(std::memory_order_relaxed),
                      d.reserve_bytes.load(std::memory_order_relaxed),
                      d.reserve_peak.load(std::memory_order_relaxed),
                      d.reserve_hits.load(std::memory_order_relaxed),
                      d.reserve_misses.load(std::memory_order_relaxed),
                      d.ahead_bytes.load(std::memory_order_relaxed),
                      d.ahead_peak.load(std::memory_order_relaxed),
                      d.ahead_pinned.load(std::memory_order_relaxed),
                      d.ahead_used.load(std::memory_order_relaxed),
                      d.ahead_returned.load(std::memory_order_relaxed)};
}

void Budget::on_ahead(int device, std::uint64_t bytes, std::uint64_t pinned, std::uint64_t used,
                      std::uint64_t returned) {
  Device& d = at(device);
  d.ahead_bytes.store(bytes, std::memory_order_relaxed);
  raise_peak(d.ahead_peak, bytes);
  d.ahead_pinned.fetch_add(pinned, std::memory_order_relaxed);
  d.ahead_used.fetch_add(used, std::memory_order_relaxed);
  d.ahead_returned.fetch_add(returned, std::memory_order_relaxed);
}

void Budget::on_reserve_bytes(int device, std::uint64_t bytes) {
  Device& d = at(device);
  d.reserve_bytes.store(bytes, std::memory_order_relaxed);
  raise_peak(d.reserve_peak, bytes);
}

void Budget::on_reserve_use(int device, std::uint64_t bytes, std::uint64_t hits,
                            std::uint64_t misses) {
  Device& d = at(device);
  d.reserve_bytes.store(bytes, std::memory_order_relaxed);
  d.reserve_hits.fetch_add(hits, std::memory_order_relaxed);
  d.reserve_misses.fetch_add(misses, std::memory_order_relaxed);
}

std::string Budget::summary() const {
  std::string out;
  for (int dev = 0; dev < static_cast<int>(kMaxDevices); ++dev) {
    const DeviceReport r = device_report(dev);
    if (r.limit == policy::kUnlimited && r.spilled_allocs == 0 && r.refused == 0) continue;
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.1f ms", static_cast<double>(r.migrate_ns) / 1e6);
    out += "  budget device " + std::to_string(dev) + ": limit " +
           (r.limit == policy::kUnlimited ? std::string("none") : human_bytes(r.limit)) +
           ", peak backed " + human_bytes(r.peak_backed) + "; spilled " +
           std::to_string(r.spilled_allocs) + " allocations, " + human_bytes(r.spilled_bytes) +
           " to host; moved host->device " + human_bytes(r.promoted_bytes) + " (" +
           std::to_string(r.promotions) + "), device->host " + human_bytes(r.demoted_bytes) + " (" +
           std::to_string(r.demotions) + ") in " + ms + "; refused " + std::to_string(r.refused) +
           "\n";
    if (r.move_failures || r.shim_syncs || r.skipped_busy)
      out += "    migration: " + std::to_string(r.move_failures) + " failed moves, " +
             std::to_string(r.shim_syncs) + " synchronizations by the shim, " +
             std::to_string(r.skipped_busy) + " safe points skipped (streams busy)\n";
    if (r.reserve_peak || r.reserve_hits)
      out += "    host reserve: " + human_bytes(r.reserve_bytes) + " now, peak " +
             human_bytes(r.reserve_peak) + "; " + std::to_string(r.reserve_hits) +
             " host pieces reused, " + std::to_string(r.reserve_misses) + " pinned anew\n";
    if (r.ahead_pinned)
      out += "    pinned ahead: " + std::to_string(r.ahead_pinned) + " host pieces (peak " +
             human_bytes(r.ahead_peak) + "), " + std::to_string(r.ahead_used) +
             " taken by demotions, " + std::to_string(r.ahead_returned) + " given back, " +
             human_bytes(r.ahead_bytes) + " held now\n";
  }
  return out + migration_.summary() + node_.summary();
}

}  // namespace allocshim
