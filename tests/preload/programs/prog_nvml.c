/* NVML's memory queries beside cuMemGetInfo: through the symbol the program links (-lnvidia-ml)
 * and through dlsym on a dlopened libnvidia-ml.so.1 (as nvidia-smi and pynvml reach it). Reports
 * what each says, after allocating 64 MiB. */
#include <dlfcn.h>
#include <stdint.h>

#include "fake_nvml.h"
#include "prog_util.h"

int main(void) {
  init_context();
  CUdeviceptr p = 0;
  CHECK_CU(cuMemAlloc(&p, 64 << 20));
  size_t free = 0, total = 0;
  CHECK_CU(cuMemGetInfo(&free, &total));
  report("cuda_total", total);
  report("cuda_free", free);

  nvmlDevice_t dev = NULL;
  CHECK(nvmlInit_v2() == 0 && nvmlDeviceGetHandleByIndex_v2(0, &dev) == 0);
  nvmlMemory_t m;
  CHECK(nvmlDeviceGetMemoryInfo(dev, &m) == 0);
  report("linked_total", m.total);
  report("linked_free", m.free);
  report("linked_used", m.used);

  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  CHECK(nvml != NULL);
  int (*info)(nvmlDevice_t, nvmlMemory_t*) =
      (int (*)(nvmlDevice_t, nvmlMemory_t*))dlsym(nvml, "nvmlDeviceGetMemoryInfo");
  int (*info2)(nvmlDevice_t, nvmlMemory_v2_t*) =
      (int (*)(nvmlDevice_t, nvmlMemory_v2_t*))dlsym(nvml, "nvmlDeviceGetMemoryInfo_v2");
  CHECK(info != NULL && info2 != NULL);
  CHECK(info(dev, &m) == 0);
  report("dlsym_total", m.total);
  report("dlsym_free", m.free);
  nvmlMemory_v2_t m2;
  m2.version = (unsigned)(sizeof m2 | (2u << 24));
  CHECK(info2(dev, &m2) == 0);
  report("v2_total", m2.total);
  report("v2_free", m2.free);
  report("v2_sum", m2.reserved + m2.used + m2.free);
  report("v2_used", m2.used);
  CHECK_CU(cuMemFree(p));
  return 0;
}
