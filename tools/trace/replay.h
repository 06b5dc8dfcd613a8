// allocshim replay: the allocation/free sequence of traces run again against a policy, on the GPU
// (the real driver) or on the simulated device of the tests, so policies can be compared without
// rerunning the program.
//
// Events are replayed in one thread in timestamp order. That order is consistent with every
// thread's own order and with the order across threads (a block is freed before another thread
// gets its address back: free events are stamped when the free began), so each free meets the
// allocation it belongs to. Allocations that failed in the trace are attempted again: another
// policy may serve them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/driver.h"
#include "policy/policy.h"
#include "trace/analysis.h"

namespace allocshim::trace {

struct ReplayResult {
  std::uint64_t allocs = 0, frees = 0, failures = 0, recovered = 0;  // recovered: failed in the trace
  std::uint64_t trace_failures = 0;
  std::vector<std::uint32_t> alloc_ns, free_ns;  // per operation
  std::uint64_t peak_reserved = 0;  // bytes the backends held from the driver, all devices
  std::uint64_t peak_live = 0;      // bytes the program held
  std::uint64_t live_at_peak_reserved = 0;
  std::uint64_t wall_ns = 0;
  std::string policy_source;
  std::string error;  // the core's error (a backend that could not be built), if any

  // 1 - live / reserved at the moment reserved peaked: the share of the driver's memory that the
  // policy held without the program using it.
  double fragmentation() const;
};

// Replays the events of `traces` against `policy` over `driver`. Devices beyond the driver's count
// are folded onto device 0.
ReplayResult replay(const std::vector<Trace>& traces, const Driver& driver, const policy::Policy& policy);

void write_replay_text(const ReplayResult& r, std::ostream& out);
void write_replay_json(const ReplayResult& r, std::ostream& out);

}  // namespace allocshim::trace
