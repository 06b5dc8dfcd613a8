#include "placement/migration.h"

#include <algorithm>

#include "base/clock.h"

namespace allocshim {

std::atomic<bool> g_submissions_watched{false};

namespace {

std::uint64_t last_use(const MovableAllocation& a) { return a.last_epoch; }
// Swaps (rebalance, promotion ahead) compare settled rates: in a cycle longer than an epoch,
// what was used a moment ago would otherwise always look denser than what comes next.
std::uint64_t rate(const MovableAllocation& a) { return a.rate; }
// Demotion compares the rate an epoch ending now would give (update_rates): what was just used
// is not the first to leave.
std::uint64_t rate_now(const UseRecord* u) {
  if (u == nullptr) return 0;
  // Counts are statistics (a rare lost one): never read a step back as a wrap.
  const std::uint64_t total = u->uses(), counted = u->counted.load(std::memory_order_relaxed);
  const std::uint64_t pending = total > counted ? total - counted : 0;
  return (u->rate.load(std::memory_order_relaxed) * 3 + pending * 16) / 4;
}
std::uint64_t bytes(const MovableAllocation& a) {
  return std::max<std::uint64_t>(a.device_bytes + a.host_bytes, 1);
}
// rate_now(x)/bytes(x) < rate_now(y)/bytes(y), without division.
bool less_dense(const MovableAllocation& x, const MovableAllocation& y) {
  return static_cast<unsigned __int128>(x.rate_now) * bytes(y) <
         static_cast<unsigned __int128>(y.rate_now) * bytes(x);
}
// The least dense, then least recently used, then oldest: the first to leave the device.
bool colder(const MovableAllocation& x, const MovableAllocation& y) {
  if (less_dense(x, y)) return true;
  if (less_dense(y, x)) return false;
  if (last_use(x) != last_use(y)) return last_use(x) < last_use(y);
  return x.seq < y.seq;
}
}  // namespace

Migration::Migration(const Driver& driver, MoveLedger& ledger)
    : uses_(driver, gate_), host_cost_(driver), clock_(&clock::now_ns), ledger_(ledger) {}

void Migration::configure(Movable* target, policy::Budget::Migrate mode) {
  target_.store(target, std::memory_order_release);
  rebalance_.store(target != nullptr && mode == policy::Budget::Migrate::auto_,
                   std::memory_order_relaxed);
  // Only ever turned on: a core that stops moving leaves submissions passing an open gate, which
  // costs the same as not watching them once no range is movable.
  if (target != nullptr) g_submissions_watched.store(true, std::memory_order_relaxed);
}

void Migration::on_safe_point(int device) {
  uses_.settle();
  if (active()) learn_at_safe_point();
  const std::uint64_t now = now_ns();
  std::uint64_t last = last_epoch_at_.load(std::memory_order_relaxed);
  if (now - last < epoch_ns_.load(std::memory_order_relaxed)) return;
  if (!last_epoch_at_.compare_exchange_strong(last, now, std::memory_order_relaxed)) return;
  uses_.advance_epoch();
  update_rates(device);
  const std::uint64_t submissions = gate_.counts().submissions;
  std::lock_guard<std::mutex> lock(throughput_mutex_);
  throughput_.sample(now, submissions, changes());
}

void Migration::update_rates(int device) {
  UseTracker::PolicyRead read(uses_);
  const std::vector<MovableAllocation> v = list(device);
  // What timed launches say of the host-resident allocations they read, for those still here.
  host_cost_.harvest(device, uses_.epoch(), [&](DevPtr base, std::uint32_t cost) {
    auto it = std::find_if(v.begin(), v.end(),
                           [&](const MovableAllocation& a) { return a.base == base; });
    if (it == v.end() || it->use == nullptr) return;
    auto* u = const_cast<UseRecord*>(it->use);
    const std::uint32_t blended = HostCost::blend(u->cost.load(std::memory_order_relaxed), cost);
    u->cost.store(blended, std::memory_order_relaxed);
    if (blended >= HostCost::kCostly && u->held_on_host.load(std::memory_order_relaxed))
      u->held_until.store(0, std::memory_order_relaxed);
  });
  // rate = 3/4 rate + 1/4 (uses this epoch), in sixteenths: an allocation keeps most of its rate
  // over an epoch without a use, so a cycle of a few epochs reads as steady.
  for (const MovableAllocation& a : v) {
    if (a.use == nullptr) continue;
    auto* u = const_cast<UseRecord*>(a.use);
    const std::uint64_t total = u->uses();
    const std::uint64_t counted = u->counted.load(std::memory_order_relaxed);
    const std::uint64_t delta = total > counted ? total - counted : 0;
    u->counted.store(total, std::memory_order_relaxed);
    u->rate.store((u->rate.load(std::memory_order_relaxed) * 3 + delta * 16) / 4,
                  std::memory_order_relaxed);
    const std::uint64_t shares = u->shares(),
                        shared = u->shares_counted.load(std::memory_order_relaxed);
    const std::uint64_t new_shares = shares > shared ? shares - shared : 0;
    u->shares_counted.store(shares, std::memory_order_relaxed);
    u->share_rate.store((u->share_rate.load(std::memory_order_relaxed) * 3 + new_shares) / 4,
                        std::memory_order_relaxed);
  }
}

std::vector<MovableAllocation> Migration::list(int device) const {
  std::vector<MovableAllocation> v;
  if (Movable* t = target_.load(std::memory_order_acquire)) t->movable(device, v);
  const std::shared_ptr<const LearnedStep> step = step_in_force();
  const std::uint64_t now = uses_.epoch();
  for (MovableAllocation& a : v) {
    // Uses weigh what one costs on the host: data a timed kernel read many times over the link
    // counts more than data read once (placement/host_cost.h).
    const std::uint64_t measured = a.use ? a.use->cost.load(std::memory_order_relaxed) : 0;
    const std::uint64_t cost = measured != 0 ? measured : HostCost::kPrior;
    auto weigh = [cost](std::uint64_t x) { return x * cost / HostCost::kPrior; };
    a.rate = weigh(a.use ? a.use->rate.load(std::memory_order_relaxed) : 0);
    a.rate_now = weigh(rate_now(a.use));
    a.last_epoch = a.use ? a.use->last_epoch.load(std::memory_order_relaxed) : 0;
    a.share_rate = weigh(a.use ? a.use->share_rate.load(std::memory_order_relaxed) : 0);
    // In a program that repeats a step, what the step names is used once a step whatever part
    // of it this epoch is: its rate is its uses per step spread over the step's epochs, the
    // same in every phase, so that decisions made at different points of a step agree.
    // One not named for two steps' epochs shows the program left the step (a training loop
    // turned to evaluation): it keeps its epoch rate, and the step is learned again.
    const StepProfile* p = step ? step->find(a.use) : nullptr;
    if (p != nullptr && a.last_epoch + step->epochs16 / 8 + 2 < now) {
      step_stale_.store(true, std::memory_order_relaxed);
      p = nullptr;
    }
    if (p != nullptr) {
      const std::uint64_t per_epoch =
          std::max<std::uint64_t>(std::uint64_t{p->uses} * 256 / step->epochs16, 1);
      a.rate = a.rate_now = weigh(per_epoch);
      a.last_epoch = now;
    }
  }
  return v;
}

std::vector<DevPtr> Migration::bases(const std::vector<MovableAllocation>& v) {
  std::vector<DevPtr> out;
  out.reserve(v.size());
  for (const MovableAllocation& a : v) out.push_back(a.base);
  return out;
}

template <class Keep, class Order, class Move>
std::size_t Migration::move_closed(int device, Keep keep, Order order, Move move) {
  UseTracker::PolicyRead read(uses_);
  GateClosed closed(gate_, close_timeout_ns_.load(std::memory_order_relaxed));
  if (!closed.ok()) {
    gate_timeouts_.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  // Listed with the gate closed: no submission changes the uses meanwhile.
  std::vector<MovableAllocation> v = list(device);
  std::erase_if(v, [&](const MovableAllocation& a) { return !keep(a); });
  if (v.empty()) return 0;  // nothing to move: no synchronization either
  std::sort(v.begin(), v.end(), order);
  const std::size_t moved = move(bases(v));
  if (moved > 0) changes_.fetch_add(1, std::memory_order_relaxed);
  return moved;
}

std::size_t Migration::demote(int device, std::size_t want_bytes, std::size_t newcomer) {
  Movable* t = target_.load(std::memory_order_acquire);
  if (t == nullptr || want_bytes == 0 || t->device_bytes(device) == 0) return 0;
  return move_closed(
      device,
      [&](const MovableAllocation& a) {
        return a.device_bytes > 0 &&
               (newcomer == 0 || static_cast<unsigned __int128>(a.rate_now) * newcomer <
                                     static_cast<unsigned __int128>(kOneUseRate) * bytes(a));
      },
      colder,
      [&](const std::vector<DevPtr>& order) { return to_host(*t, device, order, want_bytes); });
}

std::size_t Migration::promote(int device, std::size_t max_bytes) {
  Movable* t = target_.load(std::memory_order_acquire);
  if (t == nullptr || max_bytes == 0 || t->host_bytes(device) == 0) return 0;
  return move_closed(
      device, [](const MovableAllocation& a) { return a.host_bytes > 0; },
      [](const MovableAllocation& x, const MovableAllocation& y) { return colder(y, x); },
      [&](const std::vector<DevPtr>& order) { return to_device(*t, device, order, max_bytes); });
}

Migration::Plan Migration::plan(const std::vector<MovableAllocation>& hot,
                                const std::vector<MovableAllocation>& cool, std::size_t max_bytes,
                                std::uint64_t room, std::uint64_t factor) {
  Plan p;
  std::size_t ci = 0;
  std::uint64_t free_room = room;
  for (const MovableAllocation& h : hot) {
    if (p.want + h.host_bytes > max_bytes) break;
    const std::size_t need = h.host_bytes > free_room ? h.host_bytes - free_room : 0;
    std::size_t got = 0, cj = ci;
    for (; got < need && cj < cool.size(); ++cj) {
      const MovableAllocation& c = cool[cj];
      if (static_cast<unsigned __int128>(rate(c)) * factor * bytes(h) >=
          static_cast<unsigned __int128>(rate(h)) * bytes(c))
        break;  // c is too dense to give way to h
      got += c.device_bytes;
    }
    if (got < need) break;
    for (; ci < cj; ++ci) p.demote.push_back(cool[ci]);
    p.displace += need;
    free_room = free_room + got > h.host_bytes ? free_room + got - h.host_bytes : 0;
    p.promote.push_back(h);
    p.want += h.host_bytes;
  }
  return p;
}

void Migration::note_regrets(const Plan& p, std::uint64_t now, std::uint64_t factor) {
  for (const MovableAllocation& h : p.promote) {
    const std::uint64_t d = h.use ? h.use->demoted_epoch.load(std::memory_order_relaxed) : 0;
    // Bringing back what a timed kernel found costly on the host corrects a guess; it is not
    // the counts changing their mind.
    if (h.use != nullptr && h.use->cost.load(std::memory_order_relaxed) >= HostCost::kCostly)
      continue;
    if (d != 0 && now - d < kRegretEpochs) {
      regrets_.fetch_add(1, std::memory_order_relaxed);
      factor = std::min(factor * 2, kMaxFactor);
      factor_.store(factor, std::memory_order_relaxed);
    }
  }
}

std::size_t Migration::swap(Movable* t, int device, const Plan& p, std::uint64_t room,
                            std::uint64_t now, std::size_t* demoted_out) {
  // In steps, each demoting what the promotion after it needs: the host pieces a promotion frees
  // go to the host reserve, where the next step's demotion finds them instead of pinning anew.
  const std::vector<DevPtr> promote = bases(p.promote), demote = bases(p.demote);
  std::size_t moved = 0, demoted = 0;
  std::uint64_t free_room = room;
  while (moved < p.want) {
    const std::size_t step = std::min<std::size_t>(kRebalanceStep, p.want - moved);
    if (free_room < step && demoted < p.displace) {
      const std::size_t d =
          to_host(*t, device, demote, std::min(step - free_room, p.displace - demoted));
      demoted += d;
      free_room += d;
    }
    const std::size_t got = to_device(*t, device, promote, step);
    if (got == 0) break;
    moved += got;
    free_room = free_room > got ? free_room - got : 0;
  }
  for (const MovableAllocation& a : p.demote)
    if (a.use) const_cast<UseRecord*>(a.use)->demoted_epoch.store(now, std::memory_order_relaxed);
  if (moved + demoted > 0) changes_.fetch_add(1, std::memory_order_relaxed);
  if (demoted_out != nullptr) *demoted_out = demoted;
  return moved;
}

std::size_t Migration::rebalance(int device, std::size_t max_bytes, std::uint64_t room) {
  Movable* t = target_.load(std::memory_order_acquire);
  if (t == nullptr || !rebalance_.load(std::memory_order_relaxed) || max_bytes == 0 ||
      t->host_bytes(device) == 0)
    return 0;
  const std::uint64_t factor = factor_.load(std::memory_order_relaxed);
  if (factor >= kMaxFactor) return 0;  // the program's uses swap places faster than moves pay
  const std::uint64_t now = uses_.epoch();
  UseTracker::PolicyRead read(uses_);
  // A look first, without closing the gate: host-resident data in use, densest first, and device-
  // resident data, least dense first.
  std::vector<MovableAllocation> v = list(device);
  std::vector<MovableAllocation> hot, cool;
  for (const MovableAllocation& a : v) {
    if (a.host_bytes > 0 && last_use(a) + 1 >= now && rate(a) > 0 && !held(a, true, now))
      hot.push_back(a);
    if (a.device_bytes > 0 && !held(a, false, now)) cool.push_back(a);
  }
  if (hot.empty()) return 0;
  std::sort(hot.begin(), hot.end(), [](const auto& x, const auto& y) { return colder(y, x); });
  std::sort(cool.begin(), cool.end(), colder);
  const Plan p = plan(hot, cool, max_bytes, room, factor);
  if (p.promote.empty()) return 0;
  return carry_out(t, device, p, room, now, factor, rebalances_, rebalance_bytes_);
}

std::size_t Migration::promote_ahead(int device, const std::vector<DevPtr>& wanted,
                                     const std::vector<DevPtr>& named, std::size_t max_bytes,
                                     std::uint64_t room) {
  Movable* t = target_.load(std::memory_order_acquire);
  if (t == nullptr || !rebalance_.load(std::memory_order_relaxed) || wanted.empty()) return 0;
  // The decisions are one thread's at a time, and a running trial's measurement is not disturbed.
  if (deciding_.exchange(true, std::memory_order_acquire)) return 0;
  abandon_trial_if_stale();
  const std::size_t moved =
      trial_.active ? 0 : promote_ahead_decided(t, device, wanted, named, max_bytes, room);
  deciding_.store(false, std::memory_order_release);
  return moved;
}

std::size_t Migration::promote_ahead_decided(Movable* t, int device,
                                             const std::vector<DevPtr>& wanted,
                                             const std::vector<DevPtr>& named,
                                             std::size_t max_bytes, std::uint64_t room) {
  const std::uint64_t factor = factor_.load(std::memory_order_relaxed);
  if (factor >= kMaxFactor) return 0;
  const std::uint64_t now = uses_.epoch();
  UseTracker::PolicyRead read(uses_);
  auto in = [](const std::vector<DevPtr>& set, DevPtr base) {
    return std::find(set.begin(), set.end(), base) != set.end();
  };
  std::vector<MovableAllocation> hot, cool;
  for (const MovableAllocation& a : list(device)) {
    if (a.host_bytes > 0 && in(wanted, a.base)) {
      if (!held(a, true, now)) hot.push_back(a);
    } else if (a.device_bytes > 0 && !in(named, a.base) && !held(a, false, now)) {
      cool.push_back(a);
    }
  }
  std::sort(hot.begin(), hot.end(), [](const auto& x, const auto& y) { return colder(y, x); });
  std::sort(cool.begin(), cool.end(), colder);
  const Plan p = plan(hot, cool, max_bytes, room, factor);
  if (p.promote.empty()) {
    ahead_declined_.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  return carry_out(t, device, p, room, now, factor, ahead_, ahead_bytes_);
}

std::size_t Migration::closed_swap(Movable* t, int device, const Plan& p, std::uint64_t room,
                                   std::uint64_t now, std::size_t* demoted) {
  GateClosed closed(gate_, close_timeout_ns_.load(std::memory_order_relaxed));
  if (!closed.ok()) {
    gate_timeouts_.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  return swap(t, device, p, room, now, demoted);
}

std::size_t Migration::carry_out(Movable* t, int device, const Plan& p, std::uint64_t room,
                                 std::uint64_t now, std::uint64_t factor,
                                 std::atomic<std::uint64_t>& swaps,
                                 std::atomic<std::uint64_t>& bytes) {
  // Measured, when the program ran steadily before it: a swap the counts ask for is a trial too.
  double before = 0;
  const bool steady = steady_rate(before);
  note_regrets(p, now, factor);
  std::size_t demoted = 0;
  const std::size_t moved = closed_swap(t, device, p, room, now, &demoted);
  if (moved == 0) return 0;
  swaps.fetch_add(1, std::memory_order_relaxed);
  bytes.fetch_add(moved, std::memory_order_relaxed);
  if (steady && demoted > 0) begin_trial(device, false, before, p, moved, demoted);
  return moved;
}

bool Migration::rebalance_due(int device) const {
  // Rebalancing looks at the uses of a whole epoch: once per epoch is enough.
  return rebalance_.load(std::memory_order_relaxed) && device >= 0 &&
         static_cast<std::size_t>(device) < kMaxDevices &&
         rebalanced_epoch_[static_cast<std::size_t>(device)].load(std::memory_order_relaxed) !=
             uses_.epoch();
}

bool Migration::wants_safe_point(int device, std::uint64_t room) const {
  const Movable* t = target_.load(std::memory_order_acquire);
  return t != nullptr && t->host_bytes(device) != 0 && (room >= kMinRoom || rebalance_due(device));
}

std::size_t Migration::at_safe_point(int device, std::uint64_t bound,
                                     const std::function<std::uint64_t()>& room, bool swaps) {
  Movable* t = target_.load(std::memory_order_acquire);
  if (t == nullptr || t->host_bytes(device) == 0) return 0;
  std::size_t moved = 0;
  // While a trial is measured, room its swap left stays free: a promotion would void it.
  if (!trial_running_.load(std::memory_order_relaxed) && room() >= kMinRoom)
    moved = promote(device, bound);
  if (swaps && moved < bound && rebalance_due(device) &&
      !deciding_.exchange(true, std::memory_order_acquire)) {
    rebalanced_epoch_[static_cast<std::size_t>(device)].store(uses_.epoch(),
                                                              std::memory_order_relaxed);
    // A running trial's verdict first; then what the counts ask for; then, if nothing, a trial.
    if (!trial_step(device, room()) &&
        rebalance(device, std::max<std::uint64_t>(bound - moved, kRebalancePerPoint), room()) == 0)
      explore(device, room());
    deciding_.store(false, std::memory_order_release);
  }
  return moved;
}

}  // namespace allocshim
