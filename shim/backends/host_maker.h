// Pinned host memory for the host backend's pieces, created on several threads at once.
//
// Creating pinned host memory is what moving memory to the host costs: cuMemCreate at a HOST_NUMA
// location has the driver allocate, zero and pin every page, an order of magnitude slower than the
// copy over the link (pin_bench; docs/design/oversubscription.md, "What a move costs"). A demotion
// or a spill of gigabytes spends nearly all its time there. HostMaker creates
// a run of pieces on worker threads while its caller takes them in order, maps and copies each as
// soon as it is ready: creation overlaps the copies, and itself where the driver pins on several
// threads at once.
//
// Slow path only (a demotion, or an allocation past the budget): workers are started per run and
// joined before it returns, so nothing outlives the call that made them (no thread at exit or
// across fork).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "base/driver.h"

namespace allocshim::host_detail {

class HostMaker {
 public:
  // Makes one handle of each of `sizes` with `create` on up to `threads` workers (each with `ctx`
  // current); none for a run of one piece or `threads` 0: take() then creates on the caller's
  // thread, as if there were no maker.
  using Create = std::function<Result(std::size_t bytes, MemHandle* handle)>;
  HostMaker(const Driver& driver, Context ctx, std::vector<std::size_t> sizes, unsigned threads,
            Create create);
  // Stops the workers, joins them, and releases every handle made and not taken.
  ~HostMaker();
  HostMaker(const HostMaker&) = delete;
  HostMaker& operator=(const HostMaker&) = delete;

  // The handle of piece `i` (taken in order, each once): waits until it is made. After a failure
  // no more pieces are made or handed out: each later take returns that failure.
  Result take(std::size_t i, MemHandle* handle);
  std::size_t workers() const { return workers_.size(); }

 private:
  struct Slot {
    bool done = false;
    bool taken = false;
    Result result = res::ok;
    MemHandle handle = 0;
  };
  void work();

  const Driver& driver_;
  Context ctx_;
  std::vector<std::size_t> sizes_;
  Create create_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<Slot> slots_;
  std::size_t next_ = 0;      // the next piece a worker makes (under mutex_)
  bool stop_ = false;         // a failure, or the destructor: make no more (under mutex_)
  Result failure_ = res::ok;  // a worker's first failure (under mutex_)
  Result refused_ = res::ok;  // the failure take returned (under mutex_)
  std::vector<std::thread> workers_;
};

}  // namespace allocshim::host_detail
