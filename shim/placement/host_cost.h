// What reading host memory costs the kernels that do it (docs/design/oversubscription.md, "What
// kernels use"). Counting submissions cannot tell a kernel that reads a buffer once from a matrix
// product that reads it a dozen times over the link; the time the kernel takes can. So a launch
// that names host-resident allocations is timed now and then: an event before it and one after it
// on its stream (each allocation once per UseRecord::kRetimeEpochs and each function once per
// thread and epoch, kMaxPerEpoch launches in all). At a safe point, each finished one's time is
// set against the time its host bytes take to cross the link once; that ratio, in 1/kPrior, is a
// cost sample for every allocation it named on the host, each of which keeps a moving average of
// them (UseRecord::cost). The policy weighs uses by it (placement/migration.h): data read many times
// over the link comes back before data read once, and data never timed counts as read once.
//
// A kernel's own work is in its time too: a long kernel naming a small host-resident buffer makes
// that buffer look costly, and it comes back first, which costs little because it is small.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "base/driver.h"

namespace allocshim {

class HostCost {
 public:
  explicit HostCost(const Driver& driver) : driver_(driver) {}
  HostCost(const HostCost&) = delete;
  HostCost& operator=(const HostCost&) = delete;

  // An allocation a timed launch names on the host: its base, and its bytes there at the launch.
  struct Named {
    DevPtr base = 0;
    std::uint64_t host_bytes = 0;
  };
  // Before the driver call of a launch to `stream`, in the calling thread's context on `device`,
  // naming `named` in `epoch`: records the start. Returns the sample's token, 0 when not timed
  // (this epoch's samples are taken, too many wait, or the driver refused).
  std::uint32_t begin(int device, Stream stream, std::uint64_t epoch, std::vector<Named> named);
  // After the driver call: records the end if the launch was made, else drops the sample.
  void end(std::uint32_t token, Stream stream, bool launched);
  // At a safe point of `device` in `epoch`: each finished sample's cost, given to `apply` for each
  // allocation it named.
  void harvest(int device, std::uint64_t epoch,
               const std::function<void(DevPtr base, std::uint32_t cost)>& apply);
  // The context `ctx` of `device` is going (`alive`: not gone yet): its samples are dropped, their
  // events destroyed while they still can be.
  void forget(int device, Context ctx, bool alive);

  struct Counts {
    std::uint64_t timed = 0;     // launches timed
    std::uint64_t measured = 0;  // of them, finished and turned into costs
  };
  Counts counts() const;

  // One crossing of the link per use: what an allocation never timed is assumed to cost.
  static constexpr std::uint32_t kPrior = 256;
  static constexpr std::uint32_t kMaxCost = 64 * kPrior;
  // A use that reads its host bytes over the link this many times (or a kernel that slow) is no
  // guess: data measured so costly is let back even where a trial's verdict held it on the host.
  static constexpr std::uint32_t kCostly = 4 * kPrior;
  // What a kernel reads over the link per nanosecond, roughly: the scale of kPrior.
  static constexpr std::uint64_t kLinkBytesPerNs = 20;
  static constexpr unsigned kMaxPerEpoch = 64;
  static constexpr unsigned kMaxPending = 128;
  // A sample unfinished this many epochs after its launch is dropped (its stream never drained).
  static constexpr std::uint64_t kMaxAgeEpochs = 64;
  // The cost `ns` of a launch whose named allocations had `host_bytes` on the host says.
  static std::uint32_t cost_of(std::uint64_t ns, std::uint64_t host_bytes);
  // A record's cost after `sample`: 3/4 of the old one plus 1/4 of the sample, or the sample
  // itself for the first.
  static std::uint32_t blend(std::uint32_t old, std::uint32_t sample) {
    return old == 0 ? sample : static_cast<std::uint32_t>((std::uint64_t{old} * 3 + sample) / 4);
  }

 private:
  struct Sample {
    bool used = false, ended = false;
    int device = 0;
    Context ctx = nullptr;
    Event start = nullptr, end = nullptr;
    std::uint64_t epoch = 0;
    std::vector<Named> named;
  };
  void drop(Sample& s, bool destroy);

  const Driver& driver_;
  mutable std::mutex mutex_;  // everything below; taken only by timed launches and safe points
  Sample samples_[kMaxPending];
  std::uint64_t epoch_ = 0;  // the epoch in_epoch_ counts
  unsigned in_epoch_ = 0;
  std::uint64_t timed_ = 0, measured_ = 0;
};

}  // namespace allocshim
