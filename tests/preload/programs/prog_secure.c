/* Run setuid by the harness: its caller's ALLOCSHIM_* variables must not steer the shim (it reads
 * them with secure_getenv). A setuid program ignores LD_PRELOAD, and /etc/ld.so.preload is not the
 * tests' to change, so the shim is linked in (DT_NEEDED before libcuda, found by an absolute
 * RUNPATH, which a secure program still honours) and interposes the same way. */
#include <stdint.h>
#include <sys/auxv.h>

#include "prog_util.h"

int main(void) {
  init_context();
  CUdeviceptr p = 0;
  CHECK_CU(cuMemAlloc(&p, 1 << 20));
  touch(p, 1 << 20, 5);
  CHECK_CU(cuMemFree(p));
  report("secure", getauxval(AT_SECURE));
  return 0;
}
