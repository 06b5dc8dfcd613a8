/* Fork from a program whose other threads allocate through the shim, many times, with children
 * that only exit. Each child inherits whatever lock another parent thread held at the fork; its
 * exit (thread-local destructors, atexit handlers, the library's finalizers) must take none of
 * them. A child that has not exited after kChildTimeoutS is killed and counted as hung. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "prog_util.h"

enum { kThreads = 4, kWave = 8, kChildTimeoutS = 10 };

static volatile int g_stop;
static unsigned long long g_churn;

static void* churn(void* arg) {
  CUcontext ctx = (CUcontext)arg;
  CHECK_CU(cuCtxSetCurrent(ctx));
  unsigned k = 0;
  while (!__atomic_load_n(&g_stop, __ATOMIC_ACQUIRE)) {
    CUdeviceptr p = 0;
    CHECK_CU(cuMemAlloc(&p, 4096u << (k++ % 8)));
    CHECK_CU(cuMemFree(p));
    __atomic_fetch_add(&g_churn, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

int main(int argc, char** argv) {
  const int forks = argc > 1 ? atoi(argv[1]) : 2000;
  init_context();
  CUcontext ctx = NULL;
  CHECK_CU(cuCtxGetCurrent(&ctx));
  /* The forking thread has a thread id in the shim too: its exit in the child runs the hooks. */
  CUdeviceptr mine = 0;
  CHECK_CU(cuMemAlloc(&mine, 1 << 20));

  pthread_t threads[kThreads];
  for (int i = 0; i < kThreads; ++i) CHECK(pthread_create(&threads[i], NULL, churn, ctx) == 0);
  while (__atomic_load_n(&g_churn, __ATOMIC_RELAXED) < 1000) usleep(100);

  /* In waves of kWave children alive at once, forked while the threads allocate. */
  int hung = 0, failed = 0;
  for (int k = 0; k < forks; k += kWave) {
    pid_t pids[kWave];
    const int n = forks - k < kWave ? forks - k : kWave;
    for (int i = 0; i < n; ++i) {
      pids[i] = fork();
      CHECK(pids[i] >= 0);
      if (pids[i] == 0) {
        alarm(kChildTimeoutS); /* SIGALRM ends a hung child: the parent sees the signal */
        exit(0);
      }
    }
    for (int i = 0; i < n; ++i) {
      int status = 0;
      CHECK(waitpid(pids[i], &status, 0) == pids[i]);
      if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
        ++hung;
      else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        ++failed;
    }
  }
  __atomic_store_n(&g_stop, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < kThreads; ++i) CHECK(pthread_join(threads[i], NULL) == 0);
  CHECK_CU(cuMemFree(mine));
  report("forks", (unsigned long long)forks);
  report("hung", (unsigned long long)hung);
  report("failed", (unsigned long long)failed);
  return hung || failed ? 4 : 0;
}
