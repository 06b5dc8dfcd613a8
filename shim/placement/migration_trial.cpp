// Trials: swaps judged by what they did to the program's rate (placement/migration.h, "Trials").
#include <algorithm>

#include "placement/migration.h"

namespace allocshim {

bool Migration::held(const MovableAllocation& a, bool on_host, std::uint64_t now) {
  return a.use != nullptr && a.use->held_until.load(std::memory_order_relaxed) > now &&
         a.use->held_on_host.load(std::memory_order_relaxed) == on_host;
}

void Migration::hold(const std::vector<MovableAllocation>& v, bool on_host, std::uint64_t until) {
  for (const MovableAllocation& a : v) {
    if (a.use == nullptr) continue;
    auto* u = const_cast<UseRecord*>(a.use);
    u->held_on_host.store(on_host, std::memory_order_relaxed);
    u->held_until.store(until, std::memory_order_relaxed);
  }
}

bool Migration::steady_rate(double& out) {
  std::lock_guard<std::mutex> lock(throughput_mutex_);
  return throughput_.rate(out) && throughput_.changes() == changes();
}

void Migration::begin_trial(int device, bool explore, double before, const Plan& p,
                            std::size_t promoted, std::size_t demoted) {
  trial_.active = true;
  trial_running_.store(true, std::memory_order_relaxed);
  trial_.explore = explore;
  trial_.device = device;
  trial_.before = before;
  trial_.changes = changes();
  trial_.publications = uses_.publications();
  trial_.epoch = uses_.epoch();
  trial_.promoted = p.promote;
  trial_.demoted = p.demote;
  trial_.promoted_bytes = promoted;
  trial_.demoted_bytes = demoted;
  trials_.fetch_add(1, std::memory_order_relaxed);
  trial_bytes_.fetch_add(promoted, std::memory_order_relaxed);
  if (explore) explored_.fetch_add(1, std::memory_order_relaxed);
}

bool Migration::abandon_trial_if_stale() {
  if (!trial_.active) return false;
  const std::uint64_t now = uses_.epoch();
  if (changes() == trial_.changes && now < trial_.epoch + kTrialMaxEpochs) return false;
  // Something else moved, or the program allocated or freed movable memory, so the rates before
  // and after no longer compare; or no verdict came. The swap stays, held a while as it is, so
  // that the counts do not reverse at once what a trial may find better.
  trial_.active = false;
  trial_running_.store(false, std::memory_order_relaxed);
  abandoned_.fetch_add(1, std::memory_order_relaxed);
  // Only while no movable allocation was freed since: the trial's records are then alive.
  UseTracker::PolicyRead read(uses_);
  if (uses_.publications() == trial_.publications) {
    hold(trial_.promoted, false, now + kRetryEpochs);
    hold(trial_.demoted, true, now + kRetryEpochs);
  }
  return true;
}

bool Migration::trial_step(int device, std::uint64_t room) {
  if (!trial_.active || abandon_trial_if_stale()) return false;
  if (trial_.device != device) return true;  // another device's trial is being measured
  double after = 0;
  {
    std::lock_guard<std::mutex> lock(throughput_mutex_);
    if (!throughput_.rate(after) || throughput_.changes() != trial_.changes)
      return true;  // still measuring
  }
  trial_.active = false;
  trial_running_.store(false, std::memory_order_relaxed);
  const std::uint64_t now = uses_.epoch();
  UseTracker::PolicyRead read(uses_);
  const double gain = static_cast<double>(kTrialGainPermille) / 1000.0;
  const bool keep = trial_.explore ? after >= trial_.before * (1.0 + gain)
                                   : after >= trial_.before * (1.0 - gain);
  if (keep) {
    kept_.fetch_add(1, std::memory_order_relaxed);
    if (trial_.explore) explore_failures_ = 0;
    hold(trial_.promoted, false, now + kHoldEpochs);
    hold(trial_.demoted, true, now + kHoldEpochs);
    return true;
  }
  // Undone: what the trial demoted comes back, what it promoted leaves again.
  Movable* t = target_.load(std::memory_order_acquire);
  if (t != nullptr) {
    Plan back;
    back.promote = trial_.demoted;
    back.demote = trial_.promoted;
    back.want = trial_.demoted_bytes;
    back.displace = trial_.promoted_bytes;
    closed_swap(t, device, back, room, now);
  }
  undone_.fetch_add(1, std::memory_order_relaxed);
  // What it demoted stays on the device for a while, against the counts' swaps too (what it
  // promoted may still come back in place of other data). What it promoted waits longer after
  // each failure before a trial promotes it again, and so does the next exploration after
  // failures in a row.
  hold(trial_.demoted, false, now + kRetryEpochs);
  for (const MovableAllocation& a : trial_.promoted) {
    if (a.use == nullptr) continue;
    auto* u = const_cast<UseRecord*>(a.use);
    const std::uint32_t failed = u->failed.fetch_add(1, std::memory_order_relaxed);
    u->explore_after.store(now + (kRetryEpochs << std::min<std::uint32_t>(failed, kMaxBackoff)),
                           std::memory_order_relaxed);
  }
  if (trial_.explore)
    explore_after_ =
        now + (kRetryEpochs << std::min<std::uint32_t>(explore_failures_++, kMaxBackoff));
  return true;
}

std::size_t Migration::explore(int device, std::uint64_t room) {
  Movable* t = target_.load(std::memory_order_acquire);
  double before = 0;
  const std::uint64_t now = uses_.epoch();
  if (t == nullptr || now < explore_after_ || !steady_rate(before)) return 0;
  UseTracker::PolicyRead read(uses_);
  const std::vector<MovableAllocation> v = list(device);
  // The candidate: host-resident, in use, with the most shares on the host (what its kernels
  // would stop reading over the link).
  const MovableAllocation* hot = nullptr;
  auto weight = [](const MovableAllocation& a) {
    return static_cast<unsigned __int128>(a.share_rate) * a.host_bytes;
  };
  for (const MovableAllocation& a : v)
    if (a.host_bytes > 0 && a.host_bytes <= kRebalancePerPoint && a.last_epoch + 1 >= now &&
        a.share_rate > 0 && a.use->explore_after.load(std::memory_order_relaxed) <= now &&
        (hot == nullptr || weight(a) > weight(*hot)))
      hot = &a;
  if (hot == nullptr || hot->host_bytes <= room) return 0;  // promotion into room needs no trial
  const std::size_t need = hot->host_bytes - room;
  // Room from the least shared device data.
  std::vector<MovableAllocation> cool;
  for (const MovableAllocation& a : v)
    if (a.device_bytes > 0 && a.base != hot->base && !held(a, false, now)) cool.push_back(a);
  std::sort(cool.begin(), cool.end(), [](const MovableAllocation& x, const MovableAllocation& y) {
    if (x.share_rate != y.share_rate) return x.share_rate < y.share_rate;
    return x.last_epoch < y.last_epoch;
  });
  Plan p;
  std::size_t got = 0;
  for (const MovableAllocation& c : cool) {
    if (got >= need) break;
    p.demote.push_back(c);
    got += c.device_bytes;
  }
  if (got < need) return 0;
  p.promote.push_back(*hot);
  p.want = hot->host_bytes;
  p.displace = need;
  std::size_t demoted = 0;
  const std::size_t moved = closed_swap(t, device, p, room, now, &demoted);
  if (moved > 0 && demoted > 0) begin_trial(device, true, before, p, moved, demoted);
  return moved;
}

}  // namespace allocshim
