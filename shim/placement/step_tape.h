// The access sequence of a program's steps, recorded while armed (placement/step.h learns the step
// from it): every submission that passes the launch gate takes the next number of a count all
// threads share, keeps a key of what it launched and named (the function and the allocations, in
// any order) and appends the allocations it names; each safe point notes where it fell in that
// count. Not armed, a submission pays one relaxed load of a line no submission writes.
//
// The tape is statistics for a policy, as use counts are: entries carry the recording they belong
// to, so a submission that read `armed` just before a recording ended and appends after the next
// began is dropped, except in the rare case where it and a new entry take one slot at once, which
// may leave one wrong entry.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace allocshim {

struct UseRecord;

class StepTape {
 public:
  // A recording holds at most kLaunches submissions and kUses allocations named by them.
  static constexpr std::uint32_t kLaunches = 1u << 16;
  static constexpr std::uint32_t kUses = 1u << 18;
  static constexpr std::uint32_t kSafePoints = 1u << 12;
  // What a copy or memset submission records as its function: it names its allocations alone.
  static inline const void* const kCopy = &kLaunches;

  StepTape() = default;
  StepTape(const StepTape&) = delete;
  StepTape& operator=(const StepTape&) = delete;

  // Starts a new recording (the buffers are made on the first); false when they could not be.
  bool arm();
  void disarm() { armed_.store(false, std::memory_order_release); }
  bool armed() const { return armed_.load(std::memory_order_relaxed); }
  // No more room: the recording is as long as it gets.
  bool full() const {
    return next_launch_.load(std::memory_order_relaxed) >= kLaunches ||
           next_use_.load(std::memory_order_relaxed) >= kUses;
  }

  // Submission side, armed only: `function` named the `n` allocations `records`.
  void submission(const void* function, UseRecord* const* records, unsigned n);
  // What a submission's key is made of: equal for the same function naming the same allocations.
  static std::uint64_t key(const void* function, UseRecord* const* records, unsigned n);
  // A safe point (any thread): where it fell in the recording.
  void safe_point();

  // What was recorded so far, copied out (armed or not).
  struct Use {
    std::uint32_t at;         // the submission's number
    const UseRecord* record;  // compared, never read: it may have been freed since
  };
  struct Recording {
    std::vector<std::uint64_t> keys;         // by submission number (0: dropped)
    std::vector<std::uint64_t> ticks;        // when each was submitted (clock::ticks)
    std::vector<Use> uses;                   // in no particular order
    std::vector<std::uint32_t> safe_points;  // submissions before each, ascending
  };
  Recording copy() const;

 private:
  // Atomic fields, relaxed: a late writer of an old recording may write one while it is read.
  struct LaunchEntry {
    std::atomic<std::uint32_t> recording{0};  // written last: the entry is whole when it matches
    std::atomic<std::uint64_t> key{0};
    std::atomic<std::uint64_t> ticks{0};
  };
  struct UseEntry {
    std::atomic<std::uint32_t> recording{0};
    std::atomic<std::uint32_t> at{0};
    std::atomic<const UseRecord*> record{nullptr};
  };

  // Read by every submission, written only when a recording starts or ends.
  alignas(64) std::atomic<bool> armed_{false};
  std::atomic<std::uint32_t> recording_{0};
  // Set once, before the first recording is armed; a submission that finds them null records nothing.
  std::atomic<LaunchEntry*> launches_{nullptr};
  std::atomic<UseEntry*> uses_{nullptr};
  // Written by every submission while armed.
  alignas(64) std::atomic<std::uint32_t> next_launch_{0};
  std::atomic<std::uint32_t> next_use_{0};
  alignas(64) mutable std::mutex mutex_;  // safe_points_, arming
  std::vector<std::uint32_t> safe_points_;
  std::unique_ptr<LaunchEntry[]> launch_store_;
  std::unique_ptr<UseEntry[]> use_store_;
};

}  // namespace allocshim
