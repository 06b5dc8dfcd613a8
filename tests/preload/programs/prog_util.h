/* Shared by the preload test programs: failure checks and the key=value report the harness reads.
 *
 * Each program checks what it can see itself (every call's result, the bytes it wrote, what the
 * fake libcuda counted) and exits non-zero on the first failure; the harness (preload_test.cpp)
 * then compares its report with the shim's stats file. */
#ifndef ALLOCSHIM_PRELOAD_PROG_UTIL_H
#define ALLOCSHIM_PRELOAD_PROG_UTIL_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      exit(2);                                                                 \
    }                                                                          \
  } while (0)

#define CHECK_CU(call) CHECK_CU_IS(call, CUDA_SUCCESS)
#define CHECK_CU_IS(call, expected)                                                      \
  do {                                                                                   \
    CUresult check_r_ = (call);                                                          \
    if (check_r_ != (expected)) {                                                        \
      fprintf(stderr, "%s:%d: %s returned %d, expected %d\n", __FILE__, __LINE__, #call, \
              (int)check_r_, (int)(expected));                                           \
      exit(3);                                                                           \
    }                                                                                    \
  } while (0)

static inline void report(const char* key, unsigned long long value) {
  printf("%s=%llu\n", key, value);
  fflush(stdout);
}

/* The fake libcuda's introspection, found by name so that programs which only dlopen libcuda can
 * use it too (fakecuda.h documents these). */
typedef unsigned long long (*fakecuda_calls_fn)(const char*);
typedef void* (*fakecuda_last_stream_fn)(const char*);

static inline unsigned long long fake_calls(void* libcuda, const char* symbol) {
  fakecuda_calls_fn fn = (fakecuda_calls_fn)dlsym(libcuda, "fakecuda_calls");
  CHECK(fn != NULL);
  return fn(symbol);
}

static inline void* fake_last_stream(void* libcuda, const char* symbol) {
  fakecuda_last_stream_fn fn = (fakecuda_last_stream_fn)dlsym(libcuda, "fakecuda_last_stream");
  CHECK(fn != NULL);
  return fn(symbol);
}

/* Writes a pattern over [p, p + n) and reads it back: the memory is really usable. */
static inline void touch(CUdeviceptr p, size_t n, unsigned seed) {
  unsigned char* b = (unsigned char*)(uintptr_t)p;
  for (size_t i = 0; i < n; i += 97) b[i] = (unsigned char)(i + seed);
  b[n - 1] = (unsigned char)seed;
  for (size_t i = 0; i < n - 1; i += 97) CHECK(b[i] == (unsigned char)(i + seed));
  CHECK(b[n - 1] == (unsigned char)seed);
}

/* An entry point by base name and CUDA version through cuGetProcAddress_v2, as the static runtime
 * asks for them; it must exist. */
typedef CUresult (*get_proc_v2_fn)(const char*, void**, int, cuuint64_t,
                                   CUdriverProcAddressQueryResult*);
static inline void* resolve_at_version(get_proc_v2_fn get_proc, const char* name, int version) {
  void* fn = NULL;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  CHECK_CU(get_proc(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS);
  CHECK(fn != NULL);
  return fn;
}

/* The static runtime's way in: libcuda dlopened, and only its resolver looked up with dlsym. */
static inline get_proc_v2_fn open_resolver(void** libcuda) {
  *libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  CHECK(*libcuda != NULL);
  get_proc_v2_fn get_proc = (get_proc_v2_fn)dlsym(*libcuda, "cuGetProcAddress_v2");
  CHECK(get_proc != NULL);
  return get_proc;
}

/* cuInit and the primary context of device 0 made current, as the runtime does. */
static inline void init_context(void) {
  CUcontext ctx = NULL;
  CHECK_CU(cuInit(0));
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
  CHECK_CU(cuCtxSetCurrent(ctx));
}

#endif
