// Learning the step a program repeats (placement/step.h) from recordings of its submissions, made
// at the program's safe points.
#include <algorithm>

#include "placement/migration.h"

namespace allocshim {

void Migration::learn_at_safe_point() {
  StepTape& tape = uses_.tape();
  tape.safe_point();
  std::unique_lock lock(learn_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  const std::uint64_t epoch = uses_.epoch();
  if (!tape.armed()) {
    if (epoch < learn_at_ && !step_stale_.exchange(false, std::memory_order_relaxed)) return;
    learn_at_ = epoch + kRelearnEpochs;
    learn_looked_ = epoch;
    learn_armed_ = epoch;
    if (tape.arm()) tape.safe_point();
    return;
  }
  // Reading the recording costs a pass over it: once an epoch, and when it is full.
  if (!tape.full() && epoch == learn_looked_) return;
  learn_looked_ = epoch;
  const StepTape::Recording r = tape.copy();
  LearnedStep s = learn_step(r);
  // One step more than a period needs to be believed: the last whole one is the one profiled.
  if (!tape.full() && !(s.repeats && s.steps > LearnedStep::kMinSteps)) return;
  tape.disarm();
  // How many epochs a step lasts, from the recording's: rates per epoch and uses per step then
  // compare.
  if (s.repeats && !r.keys.empty())
    s.epochs16 =
        std::max<std::uint64_t>((epoch - learn_armed_) * 16 * s.launches / r.keys.size(), 1);
  finish_learning(s, epoch);
}

void Migration::finish_learning(const LearnedStep& s, std::uint64_t epoch) {
  auto learned = std::make_shared<const LearnedStep>(s);
  std::lock_guard lock(learned_mutex_);
  learned_ = std::move(learned);
  learned_epoch_ = epoch;
}

LearnedStep Migration::learned_step(std::uint64_t* epoch) const {
  std::lock_guard lock(learned_mutex_);
  if (epoch) *epoch = learned_epoch_;
  return learned_ ? *learned_ : LearnedStep{};
}

std::shared_ptr<const LearnedStep> Migration::step_in_force() const {
  std::lock_guard lock(learned_mutex_);
  return learned_ && learned_->repeats && learned_->epochs16 != 0 ? learned_ : nullptr;
}

}  // namespace allocshim
