// The step a program repeats, learned from a recording of its submissions (placement/step_tape.h;
// docs/design/oversubscription.md, "The learned step"). Training and inference loops submit the
// same sequence of kernels over the same allocations every step: the period is the shortest
// distance at which the sequence of submission keys (function and allocations named) repeats
// itself, tried at the distances between the program's own synchronizations (a loop that prints
// its loss synchronizes once a step) and at those where the recording's first keys recur. Keys
// that name allocations keep a model's identical layers, which launch the same kernels over
// other weights, from passing for steps. For the last whole step of the recording, each
// allocation's profile says how often it was named, where in the step it was first and last
// named, and its longest stretch without a use: what it may spend elsewhere. A recording with no
// period that repeats says so, and the policy keeps to use counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "placement/step_tape.h"

namespace allocshim {

struct StepProfile {
  const UseRecord* record = nullptr;  // compared, never read
  std::uint32_t uses = 0;             // submissions naming it in one step
  // Positions in the step, as submissions from its start: the first and last that name it, and
  // its longest stretch naming it nowhere (cyclic: it may run over the step's end into the next).
  std::uint32_t first = 0, last = 0, idle_from = 0, idle_len = 0;
  // Bit b is set when a submission in the b-th of kBins equal parts of the step names it.
  std::uint64_t bins = 0;
  static constexpr unsigned kBins = 64;
};

struct LearnedStep {
  bool repeats = false;
  std::uint32_t launches = 0;         // submissions in one step (the period)
  std::uint32_t safe_points = 0;      // the program's synchronizations in one step
  std::uint32_t steps = 0;            // whole steps in the recording
  std::uint32_t match = 0;            // thousandths of submissions that were repeated a step later
  std::uint64_t ticks = 0;            // one step, from its first submission to the next step's
  std::uint64_t epochs16 = 0;         // epochs a step lasts, x16 (the policy's: 0 until it says)
  std::vector<StepProfile> profiles;  // by record, ascending
  // The profile of `record` (null: not named in the step).
  const StepProfile* find(const UseRecord* record) const;

  // A period is a step when the recording holds it kMinSteps times and kMatchPermille of its
  // submissions have the key of the submission one period later: a loop's steps differ
  // in a few launches (a learning-rate update, a logging step), a sequence that does not repeat
  // matches by chance only.
  static constexpr std::uint32_t kMinSteps = 2;
  static constexpr std::uint32_t kMatchPermille = 900;
};

// What a recording says (`repeats` false: no step found).
LearnedStep learn_step(const StepTape::Recording& r);
// The shortest period of `keys` that is a step (0: none), of the distances between
// `safe_points` and those at which the first keys recur; `match` is its permille.
std::uint32_t find_period(const std::vector<std::uint64_t>& keys,
                          const std::vector<std::uint32_t>& safe_points, std::uint32_t& match);

}  // namespace allocshim
