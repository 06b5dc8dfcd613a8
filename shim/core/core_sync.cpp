// The core at the program's synchronizations and launches: safe points for migration (a
// synchronization the program made, or one the shim makes when every stream is idle), and
// promotion ahead of a launch that names memory on the host.
#include <vector>

#include "core/core.h"
#include "placement/migration.h"

namespace allocshim {

void Core::after_context_sync(std::uint64_t sync, std::uint64_t waited_ns) {
  const int device = current_device();
  const std::size_t n = backend_count();
  for (std::size_t i = 0; i < n; ++i) backends_[i]->context_synchronized(device, sync);
  if (__builtin_expect(budget_.active(), 0)) {
    budget_.migration().on_safe_point(device);
    at_safe_point(device, waited_ns);
  }
}

void Core::at_safe_point(int device, std::uint64_t waited_ns) {
  if (__builtin_expect(!budget_.active(), 1)) return;
  if (budget_.note_safe_point(device, waited_ns)) budget_.at_safe_point(device, waited_ns);
}

std::uint32_t Core::before_launch(unsigned ask, Stream stream) {
  UseTracker::Named named;
  Migration& m = budget_.migration();
  if (!m.uses().take_named(named) || budget_.migrate() != Budget::Migrate::auto_) return 0;
  // A launch captured into a graph runs later: a synchronization would break the capture, and
  // events would time nothing. A driver that cannot say is treated as capturing.
  bool capturing = true;
  if (driver_.stream_is_capturing == nullptr ||
      driver_.stream_is_capturing(stream, &capturing) != res::ok || capturing)
    return 0;
  if ((ask & UseTracker::kAskAhead) != 0) {
    std::vector<DevPtr> wanted;
    for (const HostCost::Named& h : named.host) wanted.push_back(h.base);
    // The move closes the gate and waits for every submission inside it, this one included.
    m.gate().leave();
    const std::uint64_t moved = budget_.promote_ahead(named.device, wanted, named.named);
    m.gate().enter();
    // What the launch reads on the host is no longer what it named: not a sample.
    if (moved > 0) return 0;
  }
  if ((ask & UseTracker::kTime) == 0) return 0;
  return m.host_cost().begin(named.device, stream, m.uses().epoch(), std::move(named.host));
}

void Core::after_partial_sync(std::uint64_t waited_ns) {
  if (__builtin_expect(!budget_.active(), 1)) return;
  const int device = current_device();
  budget_.migration().on_safe_point(device);
  if (!budget_.note_safe_point(device, waited_ns)) return;
  // The device is idle for the shim's memory only if no stream has work: the legacy stream, the
  // calling thread's per-thread stream, and every stream the program created.
  std::vector<Stream> streams;
  streams_.all(device, streams);
  streams.push_back(kStreamLegacy);
  streams.push_back(kStreamPerThread);
  for (Stream s : streams) {
    if (driver_.stream_query(s) == res::not_ready) {
      budget_.on_skipped_busy(device);
      return;
    }
  }
  // Other threads' per-thread streams are not known: the context synchronization covers them.
  budget_.on_shim_sync(device);
  if (driver_.ctx_synchronize() == res::ok) budget_.at_safe_point(device, waited_ns);
}

}  // namespace allocshim
