/* A fake libnvidia-ml.so.1: the NVML entry points a job asks about memory, for the fake libcuda's
 * devices (the same UUIDs, FAKECUDA_CAPACITY_MB of memory each, as the fake driver reports them).
 * It reports the whole device, as NVML does; the shim is what makes it report a budget. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fake_nvml.h"

#define EXPORT __attribute__((visibility("default")))

static unsigned long long capacity(void) {
  const char* mb = getenv("FAKECUDA_CAPACITY_MB");
  return (unsigned long long)(mb ? atol(mb) : 1024) << 20;
}

static int index_of(nvmlDevice_t d) { return (int)(uintptr_t)d - 1; }

EXPORT int nvmlInit_v2(void) { return 0; }
EXPORT int nvmlShutdown(void) { return 0; }
EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t* d) {
  if (d == NULL || i > 0) return 2; /* NVML_ERROR_INVALID_ARGUMENT: one device */
  *d = (nvmlDevice_t)(uintptr_t)(i + 1);
  return 0;
}
/* The fake driver's UUID: "allocshim-fake", then zero, then the ordinal. */
EXPORT int nvmlDeviceGetUUID(nvmlDevice_t d, char* buf, unsigned int len) {
  unsigned char b[16] = {'a', 'l', 'l', 'o', 'c', 's', 'h', 'i',
                         'm', '-', 'f', 'a', 'k', 'e', 0,   0};
  b[15] = (unsigned char)index_of(d);
  if (buf == NULL || len < 41) return 2;
  snprintf(buf, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
           b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
           b[14], b[15]);
  return 0;
}
/* A small reservation and nothing used: what NVML shows of an idle GPU. */
EXPORT int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* m) {
  if (m == NULL || index_of(d) != 0) return 2;
  m->total = capacity();
  m->used = 4ull << 20;
  m->free = m->total - m->used;
  return 0;
}
EXPORT int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t* m) {
  if (m == NULL || index_of(d) != 0) return 2;
  m->total = capacity();
  m->reserved = 4ull << 20;
  m->used = 0;
  m->free = m->total - m->reserved;
  return 0;
}
