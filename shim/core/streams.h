// Live streams of the program, tracked through the stream create/destroy hooks.
//
// A `barrier` free must order the block's reuse after all work that may still touch it. Work on
// blocking streams is ordered behind the legacy default stream, so an event there covers them;
// non-blocking streams are not, so each needs an event of its own. This tracker knows which exist.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "policy/types.h"

namespace allocshim {

class StreamTracker {
 public:
  void add(Stream stream, unsigned flags, int device);
  void remove(Stream stream);
  // Every stream of `device` (its context was destroyed, and the streams with it).
  void remove_device(int device);
  // Copies the live non-blocking streams of `device` into `out` (cleared first). Returns the
  // tracker's generation, which changes whenever the set changes, so callers can cache snapshots.
  std::uint64_t non_blocking(int device, std::vector<Stream>& out) const;
  // Copies every live stream of `device`, blocking or not (migration's idle check).
  void all(int device, std::vector<Stream>& out) const;
  std::uint64_t generation() const;
  std::size_t size() const;
  // After fork the child has no streams of its own.
  void reset();

 private:
  struct Entry {
    Stream stream;
    unsigned flags;
    int device;
  };
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  std::uint64_t generation_ = 0;
};

}  // namespace allocshim
