// Learning the step from a recording (placement/step.h).
#include "placement/step.h"

#include <algorithm>

namespace allocshim {
namespace {

// Distances tried as periods: between the program's synchronizations (a few of the first with
// every later one), and every distance at which the first three keys recur.
constexpr std::size_t kFirstSafePoints = 8;
constexpr std::size_t kMaxCandidates = 256;

std::vector<std::uint32_t> safe_point_distances(const std::vector<std::uint32_t>& s) {
  std::vector<std::uint32_t> out;
  for (std::size_t i = 0; i < s.size() && i < kFirstSafePoints; ++i)
    for (std::size_t j = i + 1; j < s.size() && out.size() < kMaxCandidates; ++j)
      if (s[j] > s[i]) out.push_back(s[j] - s[i]);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<std::uint32_t> recurrences(const std::vector<std::uint64_t>& f, std::uint32_t start) {
  std::vector<std::uint32_t> out;
  const std::size_t n = f.size();
  if (n < start + 3 || f[start] == 0) return out;
  for (std::size_t t = start + 1; t + 3 <= n && out.size() < kMaxCandidates; ++t)
    if (f[t] == f[start] && f[t + 1] == f[start + 1] && f[t + 2] == f[start + 2])
      out.push_back(static_cast<std::uint32_t>(t - start));
  return out;
}

// The permille of submissions from `start` whose key is that of the one `p` later; stops
// early, returning 0, once too many differ for it to be a step.
std::uint32_t match_permille(const std::vector<std::uint64_t>& f, std::uint32_t start,
                             std::uint32_t p) {
  const std::size_t n = f.size();
  if (p == 0 || n < start + std::size_t{LearnedStep::kMinSteps} * p) return 0;
  const std::size_t compared = n - p - start;
  const std::size_t allowed = compared * (1000 - LearnedStep::kMatchPermille) / 1000;
  std::size_t differ = 0;
  for (std::size_t t = start; t + p < n; ++t)
    if (f[t] == 0 || f[t] != f[t + p])
      if (++differ > allowed) return 0;
  return static_cast<std::uint32_t>((compared - differ) * 1000 / compared);
}

}  // namespace

std::uint32_t find_period(const std::vector<std::uint64_t>& keys,
                          const std::vector<std::uint32_t>& safe_points, std::uint32_t& match) {
  match = 0;
  const std::uint32_t start = safe_points.empty() ? 0 : safe_points.front();
  // A program that synchronizes every other step repeats at half the distance between its
  // synchronizations: the shortest of either list wins.
  std::vector<std::uint32_t> candidates = safe_point_distances(safe_points);
  const std::vector<std::uint32_t> more = recurrences(keys, start);
  candidates.insert(candidates.end(), more.begin(), more.end());
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  for (std::uint32_t p : candidates) {
    const std::uint32_t m = match_permille(keys, start, p);
    if (m >= LearnedStep::kMatchPermille) {
      match = m;
      return p;
    }
  }
  return 0;
}

const StepProfile* LearnedStep::find(const UseRecord* record) const {
  auto it = std::lower_bound(profiles.begin(), profiles.end(), record,
                             [](const StepProfile& p, const UseRecord* r) { return p.record < r; });
  return it != profiles.end() && it->record == record ? &*it : nullptr;
}

namespace {

// The profile of one allocation from the positions (ascending, distinct) that named it in a step
// of `period` submissions.
StepProfile profile(const UseRecord* record, const std::vector<std::uint32_t>& at,
                    std::uint32_t period) {
  StepProfile p;
  p.record = record;
  p.uses = static_cast<std::uint32_t>(at.size());
  p.first = at.front();
  p.last = at.back();
  // The stretch from the last use round to the first of the next step, then each between.
  std::uint32_t from = p.last, gap = p.first + period - p.last;
  for (std::size_t i = 1; i < at.size(); ++i)
    if (at[i] - at[i - 1] > gap) {
      from = at[i - 1];
      gap = at[i] - at[i - 1];
    }
  p.idle_from = (from + 1) % period;
  p.idle_len = gap - 1;
  for (std::uint32_t a : at)
    p.bins |= std::uint64_t{1} << (std::uint64_t{a} * StepProfile::kBins / period);
  return p;
}

}  // namespace

LearnedStep learn_step(const StepTape::Recording& r) {
  LearnedStep s;
  const std::uint32_t period = find_period(r.keys, r.safe_points, s.match);
  if (period == 0) return s;
  const std::uint32_t start = r.safe_points.empty() ? 0 : r.safe_points.front();
  s.repeats = true;
  s.launches = period;
  s.steps = static_cast<std::uint32_t>((r.keys.size() - start) / period);
  // The last whole step: the one the policy acts on next is most like it.
  const std::uint32_t begin = start + (s.steps - 1) * period, end = begin + period;
  // Timed over the step before it, whose end is known: the time from one step's first
  // submission to the next's includes the program's waits at its synchronizations.
  if (r.ticks[begin] > r.ticks[begin - period]) s.ticks = r.ticks[begin] - r.ticks[begin - period];
  for (std::uint32_t sp : r.safe_points) s.safe_points += sp >= begin && sp < end;
  std::vector<StepTape::Use> in;
  for (const StepTape::Use& u : r.uses)
    if (u.at >= begin && u.at < end) in.push_back(u);
  std::sort(in.begin(), in.end(), [](const StepTape::Use& a, const StepTape::Use& b) {
    return a.record != b.record ? a.record < b.record : a.at < b.at;
  });
  std::vector<std::uint32_t> at;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (at.empty() || at.back() != in[i].at - begin) at.push_back(in[i].at - begin);
    if (i + 1 == in.size() || in[i + 1].record != in[i].record) {
      s.profiles.push_back(profile(in[i].record, at, period));
      at.clear();
    }
  }
  return s;
}

}  // namespace allocshim
