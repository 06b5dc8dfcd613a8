/* IPC through the shim: the parent allocates, writes a pattern and takes cuIpcGetMemHandle
 * handles; an importer opens them, checks the pattern (so the mapping starts at the right offset),
 * writes a marker the parent then reads (so the memory is shared), and closes them.
 *   prog_ipc fork   the importer is a forked child (native driver handles need this on the fake)
 *   prog_ipc exec   the importer is a fresh process (exec), sharing nothing but the handles
 *   prog_ipc import HEX...   the importer's side of "exec" */
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prog_util.h"

enum { kBuffers = 3, kTimeoutS = 20 };
static const size_t kSizes[kBuffers] = {1000, 64 << 10, (3 << 20) + 17};

static unsigned char pattern(int buffer, size_t i) { return (unsigned char)(buffer * 37 + i * 13); }

static void check_and_mark(int buffer, CUdeviceptr p) {
  const unsigned char* b = (const unsigned char*)(uintptr_t)p;
  for (size_t i = 0; i < kSizes[buffer] - 1; i += 61) CHECK(b[i] == pattern(buffer, i));
  ((unsigned char*)(uintptr_t)p)[kSizes[buffer] - 1] = 0xa5;
}

static int import(int count, char** hex) {
  alarm(kTimeoutS);
  CHECK(count == kBuffers);
  for (int k = 0; k < kBuffers; ++k) {
    CUipcMemHandle h;
    CHECK(strlen(hex[k]) == 2 * sizeof(h.reserved));
    for (size_t i = 0; i < sizeof(h.reserved); ++i) {
      unsigned v = 0;
      CHECK(sscanf(hex[k] + 2 * i, "%2x", &v) == 1);
      h.reserved[i] = (char)v;
    }
    CUdeviceptr p = 0;
    CHECK_CU(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    check_and_mark(k, p);
    CHECK_CU(cuIpcCloseMemHandle(p));
  }
  return 0;
}

int main(int argc, char** argv) {
  CHECK(argc >= 2);
  init_context();
  if (strcmp(argv[1], "import") == 0) return import(argc - 2, argv + 2);
  const int exec_mode = strcmp(argv[1], "exec") == 0;

  CUdeviceptr ptrs[kBuffers];
  CUipcMemHandle handles[kBuffers];
  char hex[kBuffers][2 * sizeof(handles[0].reserved) + 1];
  for (int k = 0; k < kBuffers; ++k) {
    CHECK_CU(cuMemAlloc(&ptrs[k], kSizes[k]));
    unsigned char* b = (unsigned char*)(uintptr_t)ptrs[k];
    for (size_t i = 0; i < kSizes[k]; ++i) b[i] = pattern(k, i);
    CHECK_CU(cuIpcGetMemHandle(&handles[k], ptrs[k]));
    for (size_t i = 0; i < sizeof(handles[k].reserved); ++i)
      sprintf(hex[k] + 2 * i, "%02x", (unsigned char)handles[k].reserved[i]);
  }

  const pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    if (!exec_mode) {
      char* args[kBuffers];
      for (int k = 0; k < kBuffers; ++k) args[k] = hex[k];
      exit(import(kBuffers, args));
    }
    char* args[kBuffers + 3] = {argv[0], (char*)"import", hex[0], hex[1], hex[2], NULL};
    execv("/proc/self/exe", args);
    _exit(127);
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "importer: %s %d\n", WIFEXITED(status) ? "exit" : "signal",
            WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    return 4;
  }
  for (int k = 0; k < kBuffers; ++k) {
    CHECK(((unsigned char*)(uintptr_t)ptrs[k])[kSizes[k] - 1] == 0xa5); /* the importer's write */
    CHECK_CU(cuMemFree(ptrs[k]));
  }
  report("alloc", kBuffers);
  return 0;
}
