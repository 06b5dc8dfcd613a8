/* Route (e): fork while another thread is allocating. Each child allocates through the shim on its
 * own, exits normally (writing its own stats file: ALLOCSHIM_STATS with %p) and must never hang on
 * a lock the allocating thread held at the fork. */
#include <pthread.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prog_util.h"

enum { kParentLive = 10, kForks = 20, kChildAllocs = 5, kChildTimeoutS = 20 };

static volatile int g_stop;
static unsigned long long g_churn;

static void* churn(void* arg) {
  CUcontext ctx = (CUcontext)arg;
  CHECK_CU(cuCtxSetCurrent(ctx));
  while (!__atomic_load_n(&g_stop, __ATOMIC_ACQUIRE)) {
    CUdeviceptr p = 0;
    CHECK_CU(cuMemAlloc(&p, 4096));
    *(volatile unsigned char*)(uintptr_t)p = 1;
    CHECK_CU(cuMemFree(p));
    __atomic_fetch_add(&g_churn, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

static void child(void) {
  alarm(kChildTimeoutS); /* a deadlock fails the test instead of hanging it */
  CUdeviceptr p[kChildAllocs];
  for (int i = 0; i < kChildAllocs; ++i) {
    CHECK_CU(cuMemAlloc(&p[i], 1 << 16));
    touch(p[i], 1 << 16, (unsigned)i);
  }
  for (int i = 0; i < kChildAllocs; ++i) CHECK_CU(cuMemFree(p[i]));
  exit(0);
}

int main(void) {
  init_context();
  CUcontext ctx = NULL;
  CHECK_CU(cuCtxGetCurrent(&ctx));
  CUdeviceptr live[kParentLive];
  for (int i = 0; i < kParentLive; ++i) CHECK_CU(cuMemAlloc(&live[i], 1 << 20));

  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, churn, ctx) == 0);
  while (__atomic_load_n(&g_churn, __ATOMIC_RELAXED) < 100) usleep(100);
  for (int k = 0; k < kForks; ++k) {
    const pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) child();
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "child %d: %s %d\n", (int)pid, WIFEXITED(status) ? "exit" : "signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
      return 4;
    }
    usleep(1000);
  }
  __atomic_store_n(&g_stop, 1, __ATOMIC_RELEASE);
  CHECK(pthread_join(thread, NULL) == 0);

  /* The parent's memory survived the children. */
  for (int i = 0; i < kParentLive; ++i) {
    touch(live[i], 1 << 20, (unsigned)i);
    CHECK_CU(cuMemFree(live[i]));
  }
  report("pid", (unsigned long long)getpid());
  report("forks", kForks);
  report("child_alloc", kChildAllocs);
  report("alloc", kParentLive + __atomic_load_n(&g_churn, __ATOMIC_RELAXED));
  return 0;
}
