// What pinning host memory costs (docs/design/oversubscription.md, "What a move costs"): cuMemCreate at
// the device's HOST_NUMA location (what the shim's spill target and demotion create), for piece
// sizes of 2 MiB (a spilled chunk), 64 MiB (a demoted piece) and 512 MiB, made by 1 to 16 threads
// at once, TOTAL bytes in all; and cudaHostAlloc of TOTAL at once for reference. Natively, no shim.
//
//   pin_bench [TOTAL]        (default 4GiB)
//   pin_bench --probe        which properties of device allocations cuMemCreate accepts on the host
//
// Output: one line per case, "pin size=S threads=T create_gbps=G release_ms=R", then a table.
// Exit 0, 1 on a driver error, 77 without a GPU.
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "oversub_common.h"

using namespace oversub;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Result {
  double create_gbps, release_ms;
};

Result run(CUcontext ctx, const CUmemAllocationProp& prop, std::size_t piece, std::size_t total,
           int threads) {
  const std::size_t n = total / piece;
  std::vector<CUmemGenericAllocationHandle> h(n);
  std::atomic<std::size_t> next{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      CU(cuCtxSetCurrent(ctx));
      for (std::size_t i; (i = next.fetch_add(1)) < n;) CU(cuMemCreate(&h[i], piece, &prop, 0));
    });
  for (auto& t : pool) t.join();
  const double create_s = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  for (auto x : h) CU(cuMemRelease(x));
  return Result{double(n * piece) / create_s / 1e9, seconds_since(t1) * 1e3};
}

}  // namespace

// --probe: which allocation properties a program asks of device memory the driver also accepts at
// the host location (what the shim's substitution of the program's own cuMemCreate meets).
void probe(CUdevice dev, const CUmemAllocationProp& host) {
  int rdma = 0;
  cuDeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev);
  std::printf("probe: device GPUDirect RDMA with VMM supported: %d\n", rdma);
  struct Case {
    const char* name;
    unsigned handles;
    unsigned char rdma, compression;
  };
  for (const Case c :
       {Case{"plain", 0, 0, 0}, Case{"posix_fd", CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0, 0},
        Case{"gpuDirectRDMACapable", 0, 1, 0},
        Case{"posix_fd + gpuDirectRDMACapable", CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1, 0},
        Case{"fabric", CU_MEM_HANDLE_TYPE_FABRIC, 0, 0},
        Case{"compression", 0, 0, CU_MEM_ALLOCATION_COMP_GENERIC}}) {
    for (const bool on_host : {false, true}) {
      CUmemAllocationProp p = host;
      if (!on_host) {
        p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = dev;
      }
      p.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(c.handles);
      p.allocFlags.gpuDirectRDMACapable = c.rdma;
      p.allocFlags.compressionType = c.compression;
      CUmemGenericAllocationHandle h = 0;
      const CUresult r = cuMemCreate(&h, 2 * kMiB, &p, 0);
      std::printf("probe %s at %s: %d\n", c.name, on_host ? "host" : "device", r);
      if (r == CUDA_SUCCESS) cuMemRelease(h);
    }
  }
}

int main(int argc, char** argv) {
  require_gpu();
  const bool probing = argc > 1 && std::string(argv[1]) == "--probe";
  const std::size_t total = argc > 1 && !probing ? parse_size(argv[1]) : 4 * kGiB;
  CHECK(cudaFree(nullptr));
  CUcontext ctx = nullptr;
  CU(cuCtxGetCurrent(&ctx));
  CUdevice dev = 0;
  CU(cuCtxGetDevice(&dev));
  int numa = -1;
  if (cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev) != CUDA_SUCCESS) numa = -1;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = numa >= 0 ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_HOST;
  prop.location.id = numa >= 0 ? numa : 0;
  if (probing) {
    probe(dev, prop);
    return 0;
  }
  std::printf("pin_bench: %s host memory (numa %d), %zu MiB per case, %u CPUs\n",
              numa >= 0 ? "HOST_NUMA" : "HOST", numa, total >> 20,
              std::thread::hardware_concurrency());

  struct Row {
    std::size_t piece;
    int threads;
    Result r;
  };
  std::vector<Row> rows;
  for (const std::size_t piece : {2 * kMiB, 64 * kMiB, 512 * kMiB})
    for (const int threads : {1, 2, 4, 8, 16}) {
      if (piece == 512 * kMiB && threads > 8) continue;
      const Result r = run(ctx, prop, piece, total, threads);
      rows.push_back({piece, threads, r});
      std::printf("pin size=%zuMiB threads=%d create_gbps=%.2f release_ms=%.1f\n", piece >> 20,
                  threads, r.create_gbps, r.release_ms);
      std::fflush(stdout);
    }
  void* p = nullptr;
  auto t0 = std::chrono::steady_clock::now();
  CHECK(cudaHostAlloc(&p, total, cudaHostAllocMapped));
  const double host_alloc_gbps = double(total) / seconds_since(t0) / 1e9;
  CHECK(cudaFreeHost(p));
  std::printf("pin cudaHostAlloc create_gbps=%.2f\n", host_alloc_gbps);

  std::printf(
      "\n| piece | threads | pinned GB/s | vs 1 thread | release ms |\n|---|---|---|---|---|\n");
  double one = 0;
  for (const Row& row : rows) {
    if (row.threads == 1) one = row.r.create_gbps;
    std::printf("| %zu MiB | %d | %.2f | %.2fx | %.1f |\n", row.piece >> 20, row.threads,
                row.r.create_gbps, row.r.create_gbps / one, row.r.release_ms);
  }
  std::printf("| cudaHostAlloc %zu MiB | 1 | %.2f | | |\n", total >> 20, host_alloc_gbps);
  return 0;
}
