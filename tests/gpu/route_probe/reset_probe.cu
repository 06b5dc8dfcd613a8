// What cudaDeviceReset does to the primary context, as the driver API sees it: its state, handle
// and id (cuCtxGetId) before and after, what a VMM mapping made before the reset is worth after it,
// and what cuCtxGetId, cuCtxGetCurrent and cuDevicePrimaryCtxGetState cost. Phases are marked for
// route_probe.c (run under it to see which entry points each phase reaches). Results:
// tests/gpu/results/h100-2026-11-25-reset-route.md.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <chrono>
#include <cstdio>
#include <vector>

static void (*mark)(const char*) = nullptr;
static void M(const char* s) {
  if (mark) mark(s);
  std::printf("=== %s\n", s);
  std::fflush(stdout);
}
#define R(call)                                         \
  do {                                                  \
    CUresult r_ = (call);                               \
    const char* n_ = nullptr;                           \
    cuGetErrorName(r_, &n_);                            \
    std::printf("%-60s -> %s\n", #call, n_ ? n_ : "?"); \
  } while (0)

template <class F>
double ns_per(F f, int n = 200000) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
         n;
}

__global__ void touch(unsigned* p, size_t n, unsigned v) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = v;
}

static void state(const char* when) {
  unsigned flags = 0;
  int active = -1;
  CUresult r = cuDevicePrimaryCtxGetState(0, &flags, &active);
  CUcontext cur = nullptr;
  CUresult r2 = cuCtxGetCurrent(&cur);
  unsigned long long id = 0;
  CUresult r3 = cur ? cuCtxGetId(cur, &id) : CUDA_ERROR_INVALID_CONTEXT;
  std::printf("%s: primary state r=%d active=%d flags=%u; current r=%d ctx=%p id r=%d id=%llu\n",
              when, r, active, flags, r2, (void*)cur, r3, id);
}

int main(int argc, char** argv) {
  mark = reinterpret_cast<void (*)(const char*)>(dlsym(RTLD_DEFAULT, "probe_mark"));
  M("init");
  cudaFree(nullptr);
  M("init done");
  state("after init");
  CUcontext ctxA = nullptr;
  cuCtxGetCurrent(&ctxA);
  CUcontext prim = nullptr;
  R(cuDevicePrimaryCtxRetain(&prim, 0));
  cuDevicePrimaryCtxRelease(0);
  std::printf("primary handle %p current %p\n", (void*)prim, (void*)ctxA);
  unsigned long long id = 0;
  std::printf("ns per cuCtxGetId %.1f, cuCtxGetCurrent %.1f, cuDevicePrimaryCtxGetState %.1f\n",
              ns_per([&] { cuCtxGetId(ctxA, &id); }), ns_per([&] {
                CUcontext c;
                cuCtxGetCurrent(&c);
              }),
              ns_per([&] {
                unsigned f;
                int a;
                cuDevicePrimaryCtxGetState(0, &f, &a);
              }));
  void* p = nullptr;
  cudaMalloc(&p, 1 << 20);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  void* q = nullptr;
  cudaMallocAsync(&q, 1 << 20, s);
  // VMM memory made in this context: does its mapping outlive the reset?
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t chunk = 2 << 20;
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr v = 0;
  R(cuMemCreate(&h, chunk, &prop, 0));
  R(cuMemAddressReserve(&v, chunk, 0, 0, 0));
  R(cuMemMap(v, chunk, 0, h, 0));
  CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  R(cuMemSetAccess(v, chunk, &acc, 1));
  CUmemoryPool pool = nullptr;
  CUmemPoolProps pp = {};
  pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  pp.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  R(cuMemPoolCreate(&pool, &pp));
  cudaDeviceSynchronize();
  M("reset begin");
  cudaDeviceReset();
  M("reset end");
  state("after reset");
  M("realloc begin");
  void* p2 = nullptr;
  cudaError_t e = cudaMalloc(&p2, 1 << 20);
  M("realloc end");
  std::printf("cudaMalloc after reset: %d\n", (int)e);
  state("after realloc");
  CUcontext ctxB = nullptr;
  cuCtxGetCurrent(&ctxB);
  std::printf("ctx handle same after reset: %s\n", ctxA == ctxB ? "yes" : "no");
  // The VMM chunk mapped before the reset.
  touch<<<64, 256>>>(reinterpret_cast<unsigned*>(v), chunk / 4, 0xabcdu);
  std::printf("kernel on pre-reset VMM mapping: %s / sync %s\n",
              cudaGetErrorName(cudaGetLastError()), cudaGetErrorName(cudaDeviceSynchronize()));
  std::vector<unsigned> back(chunk / 4);
  R(cuMemcpyDtoH(back.data(), v, chunk));
  std::printf("read back %x\n", back[12345]);
  R(cuMemSetAccess(v, chunk, &acc, 1));
  R(cuMemUnmap(v, chunk));
  R(cuMemRelease(h));
  R(cuMemAddressFree(v, chunk));
  M("second reset begin");
  cudaDeviceReset();
  M("second reset end");
  M("realloc2 begin");
  e = cudaMalloc(&p2, 1 << 20);
  M("realloc2 end");
  state("after realloc2");
  M("device sync");
  cudaDeviceSynchronize();
  M("exit");
  (void)argc;
  (void)argv;
  (void)p;
  (void)q;
  (void)pool;
  return 0;
}
