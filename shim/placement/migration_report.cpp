// What migration reports: its counters for the stats file, the movable allocations of a device
// for views with their place over the learned step, and the exit summary's lines.
#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "base/clock.h"
#include "placement/migration.h"

namespace allocshim {

Migration::Counts Migration::counts() const {
  Counts c;
  c.epoch = uses_.epoch();
  c.factor = factor_.load(std::memory_order_relaxed);
  c.rebalances = rebalances_.load(std::memory_order_relaxed);
  c.rebalance_bytes = rebalance_bytes_.load(std::memory_order_relaxed);
  c.regrets = regrets_.load(std::memory_order_relaxed);
  c.gate_timeouts = gate_timeouts_.load(std::memory_order_relaxed);
  c.ahead = ahead_.load(std::memory_order_relaxed);
  c.ahead_bytes = ahead_bytes_.load(std::memory_order_relaxed);
  c.ahead_declined = ahead_declined_.load(std::memory_order_relaxed);
  c.trials = trials_.load(std::memory_order_relaxed);
  c.explored = explored_.load(std::memory_order_relaxed);
  c.kept = kept_.load(std::memory_order_relaxed);
  c.undone = undone_.load(std::memory_order_relaxed);
  c.abandoned = abandoned_.load(std::memory_order_relaxed);
  c.trial_bytes = trial_bytes_.load(std::memory_order_relaxed);
  c.gate = gate_.counts();
  c.uses = uses_.counts();
  c.host_cost = host_cost_.counts();
  return c;
}

std::vector<Migration::Listed> Migration::listing(int device) const {
  const LearnedStep step = learned_step();
  UseTracker::PolicyRead read(const_cast<UseTracker&>(uses_));
  std::vector<Listed> out;
  for (const MovableAllocation& a : list(device)) {
    Listed l;
    l.base = a.base;
    l.device_bytes = a.device_bytes;
    l.host_bytes = a.host_bytes;
    l.seq = a.seq;
    if (a.use) {
      l.rate = a.use->rate.load(std::memory_order_relaxed);
      l.uses = a.use->uses();
      l.epochs = a.use->epochs.load(std::memory_order_relaxed);
      l.last_epoch = a.use->last_epoch.load(std::memory_order_relaxed);
      l.share_rate = a.use->share_rate.load(std::memory_order_relaxed);  // unweighted, as rate
      l.cost = a.use->cost.load(std::memory_order_relaxed);
      // Records are compared by address: one freed and made again for a later allocation reads
      // as the old one's profile until the next recording, which is what it most likely is.
      if (const StepProfile* p = step.find(a.use)) {
        l.step_uses = p->uses;
        l.step_first = p->first;
        l.step_last = p->last;
        l.idle_from = p->idle_from;
        l.idle_len = p->idle_len;
        l.step_bins = p->bins;
      }
    }
    out.push_back(l);
  }
  return out;
}

std::string Migration::place_over_step(std::uint64_t bins, std::size_t device_bytes,
                                       std::size_t host_bytes) {
  std::string out(StepProfile::kBins, '.');
  const char used = host_bytes != 0 || device_bytes == 0 ? 'h' : '#';
  for (unsigned b = 0; b < StepProfile::kBins; ++b)
    if (bins >> b & 1) out[b] = used;
  return out;
}

namespace {

// The summary's line on the learned step ("" when no recording ended yet).
std::string step_line(const LearnedStep& s, std::uint64_t epoch) {
  if (epoch == 0) return "";
  char line[320];
  if (!s.repeats) {
    std::snprintf(line, sizeof line,
                  "    step: none repeats in the recording that ended in epoch %" PRIu64 "\n",
                  epoch);
    return line;
  }
  std::snprintf(line, sizeof line,
                "    step: %" PRIu32 " submissions, %" PRIu32
                " synchronizations by the program, %.1f ms as submitted; learned from %" PRIu32
                " steps (%.1f%% repeated) by epoch %" PRIu64 ", %zu allocations named\n",
                s.launches, s.safe_points, static_cast<double>(clock::to_ns(s.ticks)) / 1e6,
                s.steps, s.match / 10.0, epoch, s.profiles.size());
  return line;
}

}  // namespace

std::string Migration::summary() const {
  if (!active() && gate_.counts().submissions == 0) return "";
  const Counts c = counts();
  char line[896];
  std::snprintf(
      line, sizeof line,
      "    submissions: %" PRIu64 " through the launch gate (%" PRIu64
      " waited for a move, %" PRIu64 " moves closed it, %" PRIu64 " gave up waiting); %" PRIu64
      " launches scanned (%" PRIu64 " of unknown layout); epoch %" PRIu64 ", %" PRIu64
      " rebalances moved %" PRIu64 " bytes, %" PRIu64 " regrets, swap factor %" PRIu64 "; %" PRIu64
      " promotions ahead of a launch moved %" PRIu64 " bytes (%" PRIu64 " declined); %" PRIu64
      " trials (%" PRIu64 " explored): %" PRIu64 " kept, %" PRIu64 " undone, %" PRIu64
      " abandoned; %" PRIu64 " launches reading host memory timed (%" PRIu64 " measured)\n",
      c.gate.submissions, c.gate.waits, c.gate.closes, c.gate_timeouts + c.gate.close_timeouts,
      c.uses.launches, c.uses.unknown_layout, c.epoch, c.rebalances, c.rebalance_bytes, c.regrets,
      c.factor, c.ahead, c.ahead_bytes, c.ahead_declined, c.trials, c.explored, c.kept, c.undone,
      c.abandoned, c.host_cost.timed, c.host_cost.measured);
  std::uint64_t epoch = 0;
  const LearnedStep step = learned_step(&epoch);
  return line + step_line(step, epoch);
}

}  // namespace allocshim
