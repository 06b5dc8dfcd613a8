// The thread that pins host memory ahead of demotions for the spill target ([backends.host] pin_ahead;
// docs/design/oversubscription.md, "Pinning ahead"), and its life cycle. What it pins, for which
// device and how much, is the spill target's (host_ahead.cpp); this class only runs its passes.
//
// Life cycle: the thread starts on the first kick (the allocation slow path), blocks every signal,
// and runs passes until stopped. stop() joins it (a pass pins at most one piece, so that is short);
// a later kick starts it again, as after a context reset. At exit, an atexit handler registered
// with the first start (so it runs before the CUDA runtime's own teardown, registered earlier)
// stops every pinner for good and has its owner give back what it pinned. In a forked child the
// thread does not exist: the child forgets every pinner of its parent (their owner, the parent's
// core, is never used there either) and its exit touches none of them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace allocshim::host_detail {

class Pinner {
 public:
  using Clock = std::chrono::steady_clock;
  // One pass of the work (on the pinner's thread, no lock of the pinner held): returns when the
  // next pass is due; Clock::time_point::min() for at once, max() for only when kicked.
  using Pass = std::function<Clock::time_point()>;
  // At exit, after the thread stopped for good: gives back what the passes pinned.
  using Close = std::function<void()>;
  Pinner(Pass pass, Close close);
  // Stops and joins the thread; nothing is given back (the owner does that).
  ~Pinner();
  Pinner(const Pinner&) = delete;
  Pinner& operator=(const Pinner&) = delete;

  // Asks for a pass soon, starting the thread if it is not running (slow path: takes a lock).
  void kick();
  // Stops and joins the thread. Must not be called with a lock a pass takes.
  void stop();
  // Whether the thread runs now (tests).
  bool running() const;

  // The exit handler's work: every pinner of this process stopped for good, then closed (tests
  // call it to see what exit does).
  static void close_all();
  // Pinners this process has registered (tests: none in a forked child).
  static int registered();

 private:
  void run();
  void close_for_exit();

  Pass pass_;
  Close close_;
  mutable std::mutex mutex_;  // everything below; never held across a pass or a join
  std::condition_variable wake_;
  std::condition_variable stopped_;
  bool kicked_ = false;   // a pass is wanted now
  bool running_ = false;  // the thread was started and not yet joined
  bool stop_ = false;     // the thread must end
  bool closed_ = false;   // exit: never start again
  std::thread thread_;    // empty while a stop() joins it
};

}  // namespace allocshim::host_detail
