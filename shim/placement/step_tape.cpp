// Recording a step's access sequence (placement/step_tape.h).
#include "placement/step_tape.h"

#include <new>

#include "base/clock.h"

namespace allocshim {

bool StepTape::arm() {
  std::lock_guard lock(mutex_);
  if (!launch_store_) {
    launch_store_.reset(new (std::nothrow) LaunchEntry[kLaunches]);
    use_store_.reset(new (std::nothrow) UseEntry[kUses]);
    if (!launch_store_ || !use_store_) {
      launch_store_.reset();
      use_store_.reset();
      return false;
    }
    launches_.store(launch_store_.get(), std::memory_order_release);
    uses_.store(use_store_.get(), std::memory_order_release);
  }
  // A new number first, so that entries of the last recording still being written do not count.
  recording_.fetch_add(1, std::memory_order_relaxed);
  next_launch_.store(0, std::memory_order_relaxed);
  next_use_.store(0, std::memory_order_relaxed);
  safe_points_.clear();
  armed_.store(true, std::memory_order_release);
  return true;
}

std::uint64_t StepTape::key(const void* function, UseRecord* const* records, unsigned n) {
  // A sum of mixed words, so that the order a scan lists the allocations in does not matter.
  auto mix = [](std::uint64_t v) {
    v ^= v >> 33;
    v *= 0xff51afd7ed558ccdull;
    v ^= v >> 33;
    return v;
  };
  std::uint64_t k = mix(reinterpret_cast<std::uintptr_t>(function));
  for (unsigned i = 0; i < n; ++i) k += mix(reinterpret_cast<std::uintptr_t>(records[i]) + 1);
  return k != 0 ? k : 1;
}

void StepTape::submission(const void* function, UseRecord* const* records, unsigned n) {
  LaunchEntry* const launches = launches_.load(std::memory_order_acquire);
  UseEntry* const uses = uses_.load(std::memory_order_acquire);
  if (launches == nullptr || uses == nullptr) return;
  const std::uint32_t recording = recording_.load(std::memory_order_relaxed);
  const std::uint32_t at = next_launch_.fetch_add(1, std::memory_order_relaxed);
  if (at >= kLaunches) return;
  LaunchEntry& l = launches[at];
  l.key.store(key(function, records, n), std::memory_order_relaxed);
  l.ticks.store(clock::ticks(), std::memory_order_relaxed);
  l.recording.store(recording, std::memory_order_release);
  if (n == 0) return;
  const std::uint32_t first = next_use_.fetch_add(n, std::memory_order_relaxed);
  for (unsigned i = 0; i < n && first + i < kUses; ++i) {
    UseEntry& u = uses[first + i];
    u.at.store(at, std::memory_order_relaxed);
    u.record.store(records[i], std::memory_order_relaxed);
    u.recording.store(recording, std::memory_order_release);
  }
}

void StepTape::safe_point() {
  if (!armed()) return;
  const std::uint32_t at = next_launch_.load(std::memory_order_relaxed);
  std::lock_guard lock(mutex_);
  if (safe_points_.size() < kSafePoints && (safe_points_.empty() || safe_points_.back() < at))
    safe_points_.push_back(at < kLaunches ? at : kLaunches);
}

StepTape::Recording StepTape::copy() const {
  std::lock_guard lock(mutex_);
  Recording r;
  const LaunchEntry* const launches = launches_.load(std::memory_order_acquire);
  const UseEntry* const uses = uses_.load(std::memory_order_acquire);
  if (launches == nullptr || uses == nullptr) return r;
  const std::uint32_t recording = recording_.load(std::memory_order_relaxed);
  std::uint32_t n = next_launch_.load(std::memory_order_acquire);
  if (n > kLaunches) n = kLaunches;
  r.keys.resize(n, 0);
  r.ticks.resize(n, 0);
  for (std::uint32_t i = 0; i < n; ++i) {
    const LaunchEntry& l = launches[i];
    if (l.recording.load(std::memory_order_acquire) != recording) continue;
    r.keys[i] = l.key.load(std::memory_order_relaxed);
    r.ticks[i] = l.ticks.load(std::memory_order_relaxed);
  }
  std::uint32_t m = next_use_.load(std::memory_order_acquire);
  if (m > kUses) m = kUses;
  r.uses.reserve(m);
  for (std::uint32_t i = 0; i < m; ++i) {
    const UseEntry& u = uses[i];
    if (u.recording.load(std::memory_order_acquire) != recording) continue;
    const std::uint32_t at = u.at.load(std::memory_order_relaxed);
    if (at < n) r.uses.push_back(Use{at, u.record.load(std::memory_order_relaxed)});
  }
  r.safe_points = safe_points_;
  return r;
}

}  // namespace allocshim
