/* Route (f): a library that is not libcuda, exporting names that start with "cu" (cudnn*, cublas*)
 * and even a hooked name (cuMemAlloc_v2). dlsym on it must return its own functions: the shim
 * substitutes only the real libcuda's addresses, never by name or prefix. */
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT int cudnnCreate(void** handle) {
  *handle = 0;
  return 0;
}
EXPORT int cublasCreate_v2(void** handle) {
  *handle = 0;
  return 0;
}
EXPORT int cuMemAlloc_v2(unsigned long long* p, unsigned long n) {
  (void)p;
  (void)n;
  return 999;
}

/* The library's own addresses, taken inside it. */
EXPORT void* preload_cudnn_self(const char* name) {
  if (strcmp(name, "cudnnCreate") == 0) return (void*)&cudnnCreate;
  if (strcmp(name, "cublasCreate_v2") == 0) return (void*)&cublasCreate_v2;
  if (strcmp(name, "cuMemAlloc_v2") == 0) return (void*)&cuMemAlloc_v2;
  return 0;
}
