// Threads the shim starts inside the program (trace writer, IPC broker, Python stack helper, the
// spill target's pinner).
#pragma once

#include <pthread.h>
#include <signal.h>

#include <thread>
#include <utility>

namespace allocshim::os {

// A std::thread that blocks every signal from its first instruction on (it inherits the mask in
// force while it is created): a signal the program sends its own process, or that the kernel
// delivers to any thread, is then handled on one of the program's threads, by its handlers.
template <class Body>
std::thread start_thread(Body&& body) {
  sigset_t all, saved;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &saved);
  struct Restore {
    const sigset_t* saved;
    ~Restore() { pthread_sigmask(SIG_SETMASK, saved, nullptr); }
  } restore{&saved};
  return std::thread(std::forward<Body>(body));
}

}  // namespace allocshim::os
