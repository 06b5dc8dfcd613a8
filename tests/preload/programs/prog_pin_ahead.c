/* Pinning ahead through the hook layer (the harness sets a 64 MiB budget, spill = host, migrate =
 * auto, pin_ahead = true): a 48 MiB allocation leaves less room than itself, so the spill target's
 * pinner thread starts pinning host memory for a demotion. With "fork", a child forked allocates
 * once and exits (its exit must not wait for the parent's pinner, which does not exist there);
 * then the program exits with the pinner possibly mid-work, which exit must join without hanging
 * and whose pieces it must give back. */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prog_util.h"

#define MiB ((size_t)1 << 20)

int main(int argc, char** argv) {
  init_context();
  alarm(20); /* a hang at exit fails the test instead of stopping it */
  CUdeviceptr a = 0;
  CHECK_CU(cuMemAlloc(&a, 48 * MiB));
  touch(a, 48 * MiB, 1);
  if (argc > 1 && strcmp(argv[1], "fork") == 0) {
    const pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
      /* A call through the shim (the child's own core, which writes its own stats), then exit. */
      CUdeviceptr c = 0;
      CHECK_CU(cuMemAlloc(&c, 4 * MiB));
      CHECK_CU(cuMemFree(c));
      exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  report("pid", (unsigned long long)getpid());
  return 0; /* a is left live: exit runs with the pinner started */
}
