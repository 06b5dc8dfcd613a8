#include "core/migration.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "core/clock.h"

namespace allocshim {

std::atomic<bool> g_submissions_watched{false};

namespace {

std::uint64_t last_use(const MovableAllocation& a) {
  return a.use ? a.use->last_epoch.load(std::memory_order_relaxed) : 0;
}
std::uint64_t uses(const MovableAllocation& a) {
  return a.use ? a.use->epochs.load(std::memory_order_relaxed) : 0;
}
// Least recently used, then least often, then oldest: the first to leave the device.
bool colder(const MovableAllocation& x, const MovableAllocation& y) {
  if (last_use(x) != last_use(y)) return last_use(x) < last_use(y);
  if (uses(x) != uses(y)) return uses(x) < uses(y);
  return x.seq < y.seq;
}

}  // namespace

void Migration::configure(Movable* target, bool rebalance) {
  target_.store(target, std::memory_order_release);
  rebalance_.store(target != nullptr && rebalance, std::memory_order_relaxed);
  uses_.set_regret_window(cold_epochs_.load(std::memory_order_relaxed));
  // Only ever turned on: a core that stops moving leaves submissions passing an open gate, which
  // costs the same as not watching them once no range is movable.
  if (target != nullptr) g_submissions_watched.store(true, std::memory_order_relaxed);
}

void Migration::on_safe_point() {
  const std::uint64_t now = clock::now_ns();
  std::uint64_t last = last_epoch_at_.load(std::memory_order_relaxed);
  if (now - last < epoch_ns_.load(std::memory_order_relaxed)) return;
  if (last_epoch_at_.compare_exchange_strong(last, now, std::memory_order_relaxed)) uses_.advance_epoch();
}

std::vector<MovableAllocation> Migration::list(int device) const {
  std::vector<MovableAllocation> v;
  if (Movable* t = target_.load(std::memory_order_acquire)) t->movable(device, v);
  return v;
}

std::vector<DevPtr> Migration::bases(const std::vector<MovableAllocation>& v) {
  std::vector<DevPtr> out;
  out.reserve(v.size());
  for (const MovableAllocation& a : v) out.push_back(a.base);
  return out;
}

std::size_t Migration::demote(int device, std::size_t want_bytes) {
  Movable* t = target_.load(std::memory_order_acquire);
  if (t == nullptr || want_bytes == 0 || t->device_bytes(device) == 0) return 0;
  GateClosed closed(gate_, close_timeout_ns_.load(std::memory_order_relaxed));
  if (!closed.ok()) {
    gate_timeouts_.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  // Listed with the gate closed: no submission changes the uses meanwhile.
  std::vector<MovableAllocation> v = list(device);
  std::erase_if(v, [](const MovableAllocation& a) { return a.device_bytes == 0; });
  std::sort(v.begin(), v.end(), colder);
  return t->demote(device, bases(v), want_bytes);
}

std::size_t Migration::promote(int device, std::size_t max_bytes) {
  Movable* t = target_.load(std::memory_order_acquire);
  if (t == nullptr || max_bytes == 0 || t->host_bytes(device) == 0) return 0;
  GateClosed closed(gate_, close_timeout_ns_.load(std::memory_order_relaxed));
  if (!closed.ok()) {
    gate_timeouts_.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  std::vector<MovableAllocation> v = list(device);
  std::erase_if(v, [](const MovableAllocation& a) { return a.host_bytes == 0; });
  std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return colder(y, x); });
  return t->promote(device, bases(v), max_bytes);
}

void Migration::note_regrets() {
  // Each regret since the last look doubles the threshold: the program's cycle is longer than it.
  const std::uint64_t r = uses_.regrets();
  std::uint64_t seen = regrets_seen_.load(std::memory_order_relaxed);
  if (r == seen || !regrets_seen_.compare_exchange_strong(seen, r, std::memory_order_relaxed)) return;
  std::uint64_t cold = cold_epochs_.load(std::memory_order_relaxed);
  for (std::uint64_t i = seen; i < r && cold < kMaxColdEpochs; ++i) cold *= 2;
  cold_epochs_.store(std::min(cold, kMaxColdEpochs), std::memory_order_relaxed);
  uses_.set_regret_window(cold_epochs_.load(std::memory_order_relaxed));
}

std::size_t Migration::rebalance(int device, std::size_t max_bytes, std::uint64_t room) {
  Movable* t = target_.load(std::memory_order_acquire);
  if (t == nullptr || !rebalance_.load(std::memory_order_relaxed) || max_bytes == 0 || t->host_bytes(device) == 0)
    return 0;
  note_regrets();
  const std::uint64_t now = uses_.epoch();
  const std::uint64_t cold = cold_epochs_.load(std::memory_order_relaxed);
  if (cold >= kMaxColdEpochs) return 0;  // the program's cycle is longer than any threshold
  // A cheap look first, without closing the gate: is anything on the host hot, and anything on the
  // device cold?
  std::vector<MovableAllocation> v = list(device);
  std::vector<MovableAllocation> hot, cool;
  for (const MovableAllocation& a : v) {
    if (a.host_bytes > 0 && last_use(a) + 1 >= now) hot.push_back(a);
    if (a.device_bytes > 0 && last_use(a) + cold <= now) cool.push_back(a);
  }
  if (hot.empty()) return 0;
  std::sort(hot.begin(), hot.end(), [](const auto& x, const auto& y) { return colder(y, x); });
  std::sort(cool.begin(), cool.end(), colder);
  std::size_t want = 0;
  for (const MovableAllocation& a : hot) want += a.host_bytes;
  want = std::min(want, max_bytes);
  std::size_t cool_bytes = 0;
  for (const MovableAllocation& a : cool) cool_bytes += a.device_bytes;
  if (room + cool_bytes == 0) return 0;
  GateClosed closed(gate_, close_timeout_ns_.load(std::memory_order_relaxed));
  if (!closed.ok()) {
    gate_timeouts_.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  // In steps, each demoting what the promotion after it needs: the host pieces a promotion frees
  // go to the host reserve, where the next step's demotion finds them instead of pinning anew.
  std::size_t moved = 0, demoted = 0;
  std::uint64_t free_room = room;
  while (moved < want) {
    const std::size_t step = std::min<std::size_t>(kRebalanceStep, want - moved);
    if (free_room < step && !cool.empty()) {
      const std::size_t d = t->demote(device, bases(cool), step - free_room);
      demoted += d;
      free_room += d;
    }
    const std::size_t p = t->promote(device, bases(hot), step);
    if (p == 0) break;
    moved += p;
    free_room = free_room > p ? free_room - p : 0;
  }
  if (demoted > 0) {
    // What this rebalance demoted is remembered: a use of it soon after counts as a regret.
    std::vector<MovableAllocation> after = list(device);
    for (const MovableAllocation& a : cool) {
      auto it = std::find_if(after.begin(), after.end(), [&](const auto& b) { return b.base == a.base; });
      if (a.use && it != after.end() && it->device_bytes < a.device_bytes)
        const_cast<UseRecord*>(a.use)->demoted_epoch.store(now, std::memory_order_relaxed);
    }
  }
  if (moved > 0) {
    rebalances_.fetch_add(1, std::memory_order_relaxed);
    rebalance_bytes_.fetch_add(moved, std::memory_order_relaxed);
  }
  return moved;
}

Migration::Counts Migration::counts() const {
  Counts c;
  c.epoch = uses_.epoch();
  c.cold_epochs = cold_epochs_.load(std::memory_order_relaxed);
  c.rebalances = rebalances_.load(std::memory_order_relaxed);
  c.rebalance_bytes = rebalance_bytes_.load(std::memory_order_relaxed);
  c.regrets = uses_.regrets();
  c.gate_timeouts = gate_timeouts_.load(std::memory_order_relaxed);
  c.gate = gate_.counts();
  c.uses = uses_.counts();
  return c;
}

std::string Migration::summary() const {
  if (!active() && gate_.counts().submissions == 0) return "";
  const Counts c = counts();
  char line[512];
  std::snprintf(line, sizeof line,
                "    submissions: %" PRIu64 " through the launch gate (%" PRIu64 " waited for a move, %" PRIu64
                " moves closed it, %" PRIu64 " gave up waiting); %" PRIu64 " launches scanned (%" PRIu64
                " of unknown layout); epoch %" PRIu64 ", %" PRIu64 " rebalances moved %" PRIu64
                " bytes, %" PRIu64 " regrets, cold after %" PRIu64 " epochs\n",
                c.gate.submissions, c.gate.waits, c.gate.closes, c.gate_timeouts + c.gate.close_timeouts,
                c.uses.launches, c.uses.unknown_layout, c.epoch, c.rebalances, c.rebalance_bytes, c.regrets,
                c.cold_epochs);
  return line;
}

}  // namespace allocshim
