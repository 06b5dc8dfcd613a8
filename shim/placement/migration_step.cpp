// Learning the step a program repeats (placement/step.h) from recordings of its submissions, made
// at the program's safe points.
#include "placement/migration.h"

namespace allocshim {

void Migration::learn_at_safe_point() {
  StepTape& tape = uses_.tape();
  tape.safe_point();
  std::unique_lock lock(learn_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  const std::uint64_t epoch = uses_.epoch();
  if (!tape.armed()) {
    if (epoch < learn_at_) return;
    learn_at_ = epoch + kRelearnEpochs;
    learn_looked_ = epoch;
    if (tape.arm()) tape.safe_point();
    return;
  }
  // Reading the recording costs a pass over it: once an epoch, and when it is full.
  if (!tape.full() && epoch == learn_looked_) return;
  learn_looked_ = epoch;
  const LearnedStep s = learn_step(tape.copy());
  // One step more than a period needs to be believed: the last whole one is the one profiled.
  if (tape.full() || (s.repeats && s.steps > LearnedStep::kMinSteps)) {
    tape.disarm();
    finish_learning(s, epoch);
  }
}

void Migration::finish_learning(const LearnedStep& s, std::uint64_t epoch) {
  std::lock_guard lock(learned_mutex_);
  learned_ = s;
  learned_epoch_ = epoch;
}

LearnedStep Migration::learned_step(std::uint64_t* epoch) const {
  std::lock_guard lock(learned_mutex_);
  if (epoch) *epoch = learned_epoch_;
  return learned_;
}

}  // namespace allocshim
