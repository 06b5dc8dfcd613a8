/* Live migration through the hook layer (the harness sets budget.device=64MiB, spill=host,
 * migrate=auto): a cuMemAlloc past the budget demotes the oldest block, which keeps its address and
 * bytes; the program's synchronizations are safe points that bring it back; the program's own
 * cuMemCreate past the budget is made on the host (without the device-only flags the driver
 * refuses there) and maps and grants access as usual. */
#include <stdint.h>

#include "prog_util.h"

#define MiB ((size_t)1 << 20)

static void fill(CUdeviceptr p, size_t n, unsigned seed) {
  unsigned char* b = (unsigned char*)(uintptr_t)p;
  for (size_t i = 0; i < n; i += 4093) b[i] = (unsigned char)(i * 7 + seed);
}

static void verify(CUdeviceptr p, size_t n, unsigned seed) {
  const unsigned char* b = (const unsigned char*)(uintptr_t)p;
  for (size_t i = 0; i < n; i += 4093) CHECK(b[i] == (unsigned char)(i * 7 + seed));
}

int main(void) {
  init_context();
  CUdeviceptr a = 0, b = 0, c = 0;
  CHECK_CU(cuMemAlloc(&a, 48 * MiB));
  fill(a, 48 * MiB, 1);
  CHECK_CU(cuMemAlloc(&b, 32 * MiB)); /* 16 MiB of room: `a` goes to the host */
  fill(b, 32 * MiB, 2);
  verify(a, 48 * MiB, 1);
  CHECK_CU(cuCtxSynchronize());        /* a safe point without room: nothing moves */
  CHECK_CU(cuMemFreeAsync(b, NULL));   /* never a safe point */
  CHECK_CU(cuStreamSynchronize(NULL)); /* every stream idle: `a` comes back */
  verify(a, 48 * MiB, 1);
  CHECK_CU(cuMemAlloc(&c, 16 * MiB)); /* fits beside `a`: the budget is full */

  /* The program's own physical memory past the budget, asked as PyTorch's expandable segments
   * ask for it (GPUDirect RDMA capable, which the driver refuses at a host location). */
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.allocFlags.gpuDirectRDMACapable = 1;
  CUmemGenericAllocationHandle h = 0;
  CHECK_CU(cuMemCreate(&h, 32 * MiB, &prop, 0));
  CUdeviceptr va = 0;
  CHECK_CU(cuMemAddressReserve(&va, 32 * MiB, 0, 0, 0));
  CHECK_CU(cuMemMap(va, 32 * MiB, 0, h, 0));
  CUmemAccessDesc access;
  memset(&access, 0, sizeof access);
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK_CU(cuMemSetAccess(va, 32 * MiB, &access, 1));
  touch(va, 32 * MiB, 3);
  CHECK_CU(cuMemUnmap(va, 32 * MiB));
  CHECK_CU(cuMemRelease(h));
  CHECK_CU(cuMemAddressFree(va, 32 * MiB));

  CHECK_CU(cuMemFree(c));
  CHECK_CU(cuMemFree(a));
  report("done", 1);
  return 0;
}
