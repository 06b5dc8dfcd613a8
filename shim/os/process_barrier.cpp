#include "os/process_barrier.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace allocshim::os {
namespace {

int membarrier(int cmd) { return static_cast<int>(syscall(SYS_membarrier, cmd, 0, 0)); }

}  // namespace

bool process_barrier_ready() {
  static const bool ready = [] {
    const int supported = membarrier(MEMBARRIER_CMD_QUERY);
    return supported > 0 && (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 &&
           membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
  }();
  return ready;
}

void process_barrier() {
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return;
  // Registration belongs to the address space: register again (a fork child keeps it on the
  // kernels seen, but nothing promises it), and take the slow global barrier, which needs none,
  // if that fails too.
  if (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
      membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
    return;
  membarrier(MEMBARRIER_CMD_GLOBAL);
}

}  // namespace allocshim::os
