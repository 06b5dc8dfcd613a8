#include "base/streams.h"

#include <algorithm>

#include "base/driver.h"

namespace allocshim {

void StreamTracker::add(Stream stream, unsigned flags, int device) {
  std::lock_guard lock(mutex_);
  entries_.push_back({stream, flags, device});
  ++generation_;
}

void StreamTracker::remove(Stream stream) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const Entry& e) { return e.stream == stream; });
  if (it == entries_.end()) return;
  *it = entries_.back();
  entries_.pop_back();
  ++generation_;
}

int StreamTracker::device_of(Stream stream) const {
  std::lock_guard lock(mutex_);
  for (const Entry& e : entries_)
    if (e.stream == stream) return e.device;
  return -1;
}

void StreamTracker::remove_device(int device) {
  std::lock_guard lock(mutex_);
  std::erase_if(entries_, [&](const Entry& e) { return e.device == device; });
  ++generation_;
}

std::uint64_t StreamTracker::non_blocking(int device, std::vector<Stream>& out) const {
  out.clear();
  std::lock_guard lock(mutex_);
  for (const Entry& e : entries_)
    if ((e.flags & kStreamNonBlocking) != 0 && e.device == device) out.push_back(e.stream);
  return generation_;
}

void StreamTracker::all(int device, std::vector<Stream>& out) const {
  out.clear();
  std::lock_guard lock(mutex_);
  for (const Entry& e : entries_)
    if (e.device == device) out.push_back(e.stream);
}

std::uint64_t StreamTracker::generation() const {
  std::lock_guard lock(mutex_);
  return generation_;
}

std::size_t StreamTracker::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

void StreamTracker::reset() {
  // Called in the child after fork, where no other thread exists: no lock needed, and the mutex
  // may have been held by a parent thread at the moment of the fork.
  new (&mutex_) std::mutex;
  entries_.clear();
  ++generation_;
}

}  // namespace allocshim
