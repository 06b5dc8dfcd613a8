#include "backends/host_maker.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <system_error>

namespace allocshim::host_detail {

HostMaker::HostMaker(const Driver& driver, Context ctx, std::vector<std::size_t> sizes,
                     unsigned threads, Create create)
    : driver_(driver),
      ctx_(ctx),
      sizes_(std::move(sizes)),
      create_(std::move(create)),
      slots_(sizes_.size()) {
  const std::size_t n = sizes_.size() > 1 ? std::min<std::size_t>(threads, sizes_.size()) : 0;
  if (n == 0) return;
  // Workers take no signal: the program's handlers run on the program's threads.
  sigset_t all, saved;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &saved);
  workers_.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    try {
      workers_.emplace_back([this] { work(); });
    } catch (const std::system_error&) {
      break;  // fewer workers (none: take() creates inline)
    }
  }
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
}

HostMaker::~HostMaker() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  for (std::thread& t : workers_) t.join();
  for (const Slot& s : slots_)
    if (s.done && !s.taken && s.result == res::ok) driver_.mem_release(s.handle);
}

void HostMaker::work() {
  pthread_setname_np(pthread_self(), "allocshim-pin");
  driver_.ctx_set_current(ctx_);
  std::unique_lock lock(mutex_);
  while (!stop_ && next_ < sizes_.size()) {
    const std::size_t i = next_++;
    lock.unlock();
    MemHandle h = 0;
    const Result r = create_(sizes_[i], &h);
    lock.lock();
    Slot& s = slots_[i];
    s.done = true;
    s.result = r;
    s.handle = h;
    if (r != res::ok && !stop_) {
      // The host is short (or the driver refuses): the later pieces would fail too.
      stop_ = true;
      failure_ = r;
    }
    ready_.notify_all();
  }
}

Result HostMaker::take(std::size_t i, MemHandle* handle) {
  if (i >= slots_.size()) return res::invalid_value;
  std::unique_lock lock(mutex_);
  if (refused_ != res::ok) return refused_;  // after a failure the run is over
  Slot& s = slots_[i];
  if (workers_.empty()) {
    lock.unlock();
    s.result = create_(sizes_[i], &s.handle);
    s.done = true;
    lock.lock();
  } else {
    // Made by a worker, or never started because a piece failed.
    ready_.wait(lock, [&] { return s.done || (stop_ && i >= next_); });
  }
  if (!s.done || s.result != res::ok) {
    refused_ = s.done ? s.result : failure_;
    return refused_;
  }
  s.taken = true;
  *handle = s.handle;
  return res::ok;
}

}  // namespace allocshim::host_detail
