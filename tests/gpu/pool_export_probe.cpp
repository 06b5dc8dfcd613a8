// Diagnostic probe (not part of the suite): can this machine export a pointer of an IPC-capable
// memory pool? allocshim's async_pool IPC needs cuMemPoolExportPointer.
//
// Build: nvcc -O2 -o pool_export_probe tests/gpu/pool_export_probe.cpp -lcuda
// Seen on the H100 VM (driver 580.159.04, CUDA 13.0, 2026-11-22): cuMemPoolCreate with
// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, cuMemAllocFromPoolAsync and
// cuMemPoolExportToShareableHandle succeed, but cuMemPoolExportPointer returns
// CUDA_ERROR_INVALID_VALUE for every variant below (before and after a stream sync, 8 B and 1 MiB,
// internal-dependency reuse on and off). Native cudaIpcGetMemHandle works on the same machine.
#include <cuda.h>
#include <cstdio>
#define C(x)                                             \
  do {                                                   \
    CUresult r = (x);                                    \
    const char* s = nullptr;                             \
    cuGetErrorName(r, &s);                               \
    printf("%-70s -> %d %s\n", #x, (int)r, s ? s : "?"); \
  } while (0)
int main() {
  C(cuInit(0));
  CUdevice dev;
  C(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  C(cuDevicePrimaryCtxRetain(&ctx, dev));
  C(cuCtxSetCurrent(ctx));
  // Variant 3 exports the pool itself (cuMemPoolExportToShareableHandle) before the pointer: the
  // documentation says a pointer is exported "from an already shared memory pool".
  for (int variant = 0; variant < 4; ++variant) {
    printf("== variant %d\n", variant);
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    CUmemoryPool pool;
    C(cuMemPoolCreate(&pool, &props));
    if (variant == 1) {
      int v = 0;
      C(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &v));
    }
    CUstream s;
    C(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    int fd0 = -1;
    if (variant == 3)
      C(cuMemPoolExportToShareableHandle(&fd0, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    CUdeviceptr p = 0;
    C(cuMemAllocFromPoolAsync(&p, variant == 2 ? 8 : (1 << 20), pool, s));
    CUmemPoolPtrExportData d;
    C(cuMemPoolExportPointer(&d, p));
    C(cuStreamSynchronize(s));
    C(cuMemPoolExportPointer(&d, p));
    int fd = -1;
    C(cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    C(cuMemFreeAsync(p, s));
    C(cuStreamSynchronize(s));
  }
  return 0;
}
