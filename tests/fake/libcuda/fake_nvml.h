/* NVML's types and the entry points the fake (fake_nvml.c) and the preload test's program
 * (prog_nvml.c) share: the ABI of the real libnvidia-ml.so.1 for these calls. */
#ifndef ALLOCSHIM_FAKE_NVML_H
#define ALLOCSHIM_FAKE_NVML_H

typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

int nvmlInit_v2(void);
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t* d);
int nvmlDeviceGetUUID(nvmlDevice_t d, char* buf, unsigned int len);
int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* m);
int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t* m);

#endif
