// The simulated device `allocshim replay --simulate SIZE` runs on: a driver table (base/driver.h)
// that keeps the books of a device without one, in the manner of RMM's simulated memory resource.
//
// What it models is what decides whether a policy fits and how much it reserves:
//   - Each device has a capacity; cuMemAlloc (rounded up to 256 bytes), pool blocks (rounded up to
//     the granularity) and cuMemCreate handles on a device count against it. Host and managed
//     memory count against nothing.
//   - Addresses are numbers, never memory: nothing may read or write what it is given (replay
//     does not; copies and fills do nothing).
//   - VMM: reservations, physical handles with references, mappings of handles into reservations.
//   - Pools keep freed blocks cached (RESERVED_MEM_CURRENT counts them) and reuse a cached block of
//     the same rounded size; a synchronization gives back what is cached above the release
//     threshold, as trim_to does.
//   - Streams and events are handles whose work completes at once.
// No IPC, no pointer attributes, no kernel parameter layouts (not_supported).
//
// Only one may exist at a time: the table holds plain function pointers, which reach the instance
// through a process-wide pointer.
#pragma once

#include <cstddef>
#include <memory>

#include "base/driver.h"

namespace allocshim::sim {

struct SimConfig {
  int devices = 1;
  std::size_t capacity = std::size_t{1} << 30;     // per device
  std::size_t granularity = std::size_t{2} << 20;  // VMM and pool granularity
};

class SimulatedDevice {
 public:
  explicit SimulatedDevice(SimConfig config);
  ~SimulatedDevice();
  SimulatedDevice(const SimulatedDevice&) = delete;
  SimulatedDevice& operator=(const SimulatedDevice&) = delete;

  // The driver table; valid while this instance lives.
  const Driver& driver() const;
  // Bytes counted against `device`'s capacity now, and at most so far.
  std::size_t used(int device) const;
  std::size_t peak_used(int device) const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace allocshim::sim
