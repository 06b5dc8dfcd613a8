// allocshim replay: the allocation/free sequence of traces run again against a policy, on the GPU
// (the real driver) or on a simulated device (tools/sim), so policies can be compared without
// rerunning the program.
//
// Events are replayed in one thread in timestamp order. That order is consistent with every
// thread's own order and with the order across threads (a block is freed before another thread
// gets its address back: free events are stamped when the free began), so each free meets the
// allocation it belongs to. Allocations that failed in the trace are attempted again: another
// policy may serve them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/driver.h"
#include "policy/policy.h"
#include "analysis/analysis.h"

namespace allocshim {
class Core;
}

namespace allocshim::analysis {

// Times of operations: exact count and mean, percentiles from a uniform sample of at most
// kMaxSamples of them (all of them in smaller replays), so that memory does not grow with the trace.
struct Durations {
  static constexpr std::size_t kMaxSamples = std::size_t{1} << 20;
  void add(std::uint32_t ns);
  std::uint32_t percentile(double p) const;
  double mean() const { return count ? static_cast<double>(sum) / static_cast<double>(count) : 0; }
  std::vector<std::uint32_t> samples;
  std::uint64_t count = 0, sum = 0;
  std::uint64_t rng = 0x9e3779b97f4a7c15ull;
};

struct ReplayResult {
  std::uint64_t allocs = 0, frees = 0, failures = 0,
                recovered = 0;  // recovered: failed in the trace
  std::uint64_t trace_failures = 0;
  Durations alloc_ns, free_ns;
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

// Replays events, handed over one at a time in time order (EventStream), against `policy` over
// `driver`. Devices beyond the driver's count are folded onto device 0.
//
// Memory grows with the allocations live at once (each costs a few hundred bytes here, in the
// core and in a simulated device), which a small trace can make as many as it likes: past
// `max_live` of them the replay stops, and stopped() says where.
class Replayer {
 public:
  static constexpr std::size_t kMaxLive = std::size_t{1} << 20;
  Replayer(const Driver& driver, const policy::Policy& policy, std::size_t max_live = kMaxLive);
  ~Replayer();
  Replayer(const Replayer&) = delete;
  Replayer& operator=(const Replayer&) = delete;
  void step(const Event& e);  // e.process: traces of several processes have separate address spaces
  ReplayResult finish();      // frees what is still live
  // Why the replay stopped early (empty if it did not): the event past the limit, located.
  const std::string& stopped() const { return stopped_; }
  std::uint32_t stopped_process() const { return stopped_process_; }  // the event's Event::process

 private:
  const Driver& driver_;
  std::unique_ptr<Core> core_;
  std::vector<Context> contexts_;
  int devices_ = 1, current_ = 0;
  // (process, address in the trace) -> (address now, size)
  std::unordered_map<std::uint64_t, std::pair<DevPtr, std::uint64_t>> live_;
  std::uint64_t live_bytes_ = 0, synthetic_ = 0, t_start_ = 0;
  std::size_t max_live_;
  std::string stopped_;
  std::uint32_t stopped_process_ = 0;
  ReplayResult r_;
};

// The events of traces held in memory, sorted by time and replayed (ReplayResult::error says if
// the live limit stopped it).
ReplayResult replay(const std::vector<Trace>& traces, const Driver& driver,
                    const policy::Policy& policy);

void write_replay_text(const ReplayResult& r, std::ostream& out);
void write_replay_json(const ReplayResult& r, std::ostream& out);

}  // namespace allocshim::analysis
