// Live streams of the program, tracked through the stream create/destroy hooks, and the count of
// context synchronizations the program began.
//
// A `barrier` free must order the block's reuse after all work that may still touch it. Work on
// blocking streams is ordered behind the legacy default stream, so an event there covers them;
// non-blocking streams are not, so each needs an event of its own. This tracker knows which exist.
// A context synchronization completes every free made before it began (backends/free_sync.h).
#pragma once

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "base/types.h"

namespace allocshim {

class StreamTracker {
 public:
  void add(Stream stream, unsigned flags, int device);
  void remove(Stream stream);
  // The device `stream` was created on; -1 if it is not tracked.
  int device_of(Stream stream) const;
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

  // The program is about to synchronize a context: returns this synchronization's number. A free
  // whose context_syncs() was lower is complete once that synchronization returns.
  std::uint64_t begin_context_sync() { return syncs_.fetch_add(1, std::memory_order_acq_rel) + 1; }
  // Read at a free. A read-modify-write, not a load: a synchronization that begins later reads
  // from it, so everything the freeing thread issued before is ordered before that
  // synchronization (a load would order nothing).
  std::uint64_t context_syncs() const { return syncs_.fetch_add(0, std::memory_order_acq_rel); }

 private:
  struct Entry {
    Stream stream;
    unsigned flags;
    int device;
  };
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  std::uint64_t generation_ = 0;
  mutable std::atomic<std::uint64_t> syncs_{0};
};

}  // namespace allocshim
