/* Kernels of known length under [compute] slices, through the hook layer: the fake kernel (run on
 * the host inside cuLaunchKernel by tests/fake/libcuda) sleeps 200 us. The program waits until
 * START_AT (CLOCK_REALTIME seconds), launches kernels back to back for SECONDS and reports how
 * many ran: two such processes under the shim split that time by their shares.
 *
 *   prog_compute START_AT SECONDS */
#include <time.h>

#include "prog_util.h"

static void sleep_kernel(void** params) {
  (void)params;
  const struct timespec t = {0, 200000};
  nanosleep(&t, NULL);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  CHECK(argc == 3);
  const double start_at = atof(argv[1]), seconds = atof(argv[2]);
  init_context();
  while (now() < start_at) {
    const struct timespec t = {0, 1000000};
    nanosleep(&t, NULL);
  }
  const double t0 = now();
  unsigned long long kernels = 0;
  while (now() - t0 < seconds) {
    CHECK_CU(
        cuLaunchKernel((CUfunction)(void*)sleep_kernel, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    ++kernels;
  }
  CHECK_CU(cuCtxSynchronize());
  report("kernels", kernels);
  return 0;
}
