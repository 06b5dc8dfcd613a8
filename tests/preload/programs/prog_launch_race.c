/* Threads launching while another thread's allocations move their memory, through the hook layer
 * (the harness sets budget.device=64MiB, spill=host, migrate=auto). A fake kernel runs on the host
 * inside cuLaunchKernel (tests/fake/libcuda) and checks every page of the buffer it is given; the
 * main thread allocates past the budget, which demotes that buffer (a move unmaps it and copies it
 * to its new memory), and frees, which promotes it back. Without the launch gate a check would
 * meet an unmapped page (SIGSEGV) or bytes not copied yet. */
#include <pthread.h>
#include <stdint.h>

#include "prog_util.h"

#define MiB ((size_t)1 << 20)
#define BYTES (24 * MiB)

static volatile int g_done = 0;
static volatile unsigned long long g_bad = 0, g_checks = 0;

/* The fake kernel: params[0] points at the buffer's address, params[1] at its size. */
static void check_kernel(void** params) {
  const unsigned char* b = (const unsigned char*)(uintptr_t)(*(CUdeviceptr*)params[0]);
  const size_t n = *(size_t*)params[1];
  for (size_t i = 0; i < n; i += 4096)
    if (b[i] != (unsigned char)(i / 4096 * 13 + 5)) ++g_bad;
  ++g_checks;
}

static void* launcher(void* arg) {
  CUdeviceptr a = *(CUdeviceptr*)arg;
  size_t n = BYTES;
  void* params[2] = {&a, &n};
  while (!g_done)
    CHECK_CU(
        cuLaunchKernel((CUfunction)(void*)check_kernel, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
  return NULL;
}

int main(void) {
  init_context();
  /* The kernel's parameter layout is left unknown, so its launches do not count as uses and `a`
   * moves by age: this program tests the gate, and the policy keeps a buffer read this often on
   * the device (placement by use is tested in tests/unit). */
  CUdeviceptr a = 0;
  CHECK_CU(cuMemAlloc(&a, BYTES));
  unsigned char* b = (unsigned char*)(uintptr_t)a;
  for (size_t i = 0; i < BYTES; i += 4096) b[i] = (unsigned char)(i / 4096 * 13 + 5);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, launcher, &a) == 0);
  for (int round = 0; round < 40; ++round) {
    CUdeviceptr c = 0;
    CHECK_CU(cuMemAlloc(&c, 48 * MiB)); /* 16 MiB of room: `a` is demoted */
    CHECK_CU(cuMemFree(c));             /* a safe point with room: `a` comes back */
  }
  g_done = 1;
  CHECK(pthread_join(t, NULL) == 0);
  CHECK_CU(cuMemFree(a));
  report("checks", g_checks);
  report("bad", g_bad);
  return g_bad == 0 ? 0 : 4;
}
