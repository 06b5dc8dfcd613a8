// How fast the program runs while placement stays put: the migration policy's yardstick for a
// trial swap (placement/migration.h). The program's own submissions are its work: a loop that submits
// the same kernels each cycle submits them faster when what they read sits on the device. The
// rate is measured over a window that starts at the first epoch after the last placement change
// and counts once it spans kEpochs epochs and kNs nanoseconds, so that a cycle of a few epochs is
// seen whole.
#pragma once

#include <cstdint>

namespace allocshim {

class Throughput {
 public:
  static constexpr std::uint64_t kEpochs = 4;
  static constexpr std::uint64_t kNs = 250'000'000;

  // At an epoch's start: the time, the submissions so far, and the placement changes so far (a
  // change restarts the window here).
  void sample(std::uint64_t now_ns, std::uint64_t submissions, std::uint64_t changes) {
    if (!started_ || changes != changes_) {
      started_ = true;
      changes_ = changes;
      start_ns_ = last_ns_ = now_ns;
      start_submissions_ = last_submissions_ = submissions;
      epochs_ = 0;
      return;
    }
    ++epochs_;
    last_ns_ = now_ns;
    last_submissions_ = submissions;
  }
  // Submissions per second over the window, once it is long enough; false before.
  bool rate(double& out) const {
    const std::uint64_t ns = last_ns_ - start_ns_;
    if (!started_ || epochs_ < kEpochs || ns < kNs) return false;
    out =
        static_cast<double>(last_submissions_ - start_submissions_) * 1e9 / static_cast<double>(ns);
    return true;
  }
  // The placement changes the window was measured after.
  std::uint64_t changes() const { return changes_; }

 private:
  bool started_ = false;
  std::uint64_t changes_ = 0, epochs_ = 0;
  std::uint64_t start_ns_ = 0, last_ns_ = 0, start_submissions_ = 0, last_submissions_ = 0;
};

}  // namespace allocshim
