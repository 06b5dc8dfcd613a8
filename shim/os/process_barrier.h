// A memory barrier on every running thread of this process, issued by one thread (membarrier(2)):
// it lets a hot path that publishes with a plain store and then loads skip its own fence, because
// the rare other side makes every thread fence at once (the asymmetric Dekker pattern).
#pragma once

namespace allocshim::os {

// Whether process_barrier() is available: asked, and the process registered for it, once. False
// where the kernel or a seccomp filter refuses membarrier; then the hot side must fence itself.
bool process_barrier_ready();

// Every thread of this process running now executes a full memory barrier before this returns;
// one that is not running issues one before it runs again. Only after process_barrier_ready().
void process_barrier();

}  // namespace allocshim::os
