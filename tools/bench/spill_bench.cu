// spill_bench: read bandwidth of an allocation spilled past the device budget, against the model
// bound and against managed memory, all measured in the same run (docs/oversubscription.md).
//
//   allocshim run --conf budget.device=4GiB,budget.spill=host -- spill_bench [BUDGET]
//
// BUDGET (default 4GiB) must be the shim's budget: the program checks that cudaMemGetInfo reports
// it. Measured, each a grid-stride read kernel (median of 5 after a warm-up):
//   B_dev   a device buffer (2 GiB, freed before the spilled ones);
//   B_host  pinned host memory mapped into the device (cudaHostAlloc mapped, 2 GiB);
//   for each oversubscription factor F in 1.25, 1.5, 2.0: one cudaMalloc of F x BUDGET, which the
//   shim serves with device chunks for the room left under the budget (cudaMemGetInfo's free just
//   before) and host chunks for the rest, so f_dev = room / size, f_host = 1 - f_dev:
//     spilled       the shim's allocation;
//     bound         1 / (f_dev / B_dev + f_host / B_host), the model of one range mixing both;
//     managed host  cudaMallocManaged of the same size, preferred location host, accessed by the
//                   device, prefetched to the host (the placement spill = "managed" uses);
//     managed strip the same with f_host of its 2 MiB pages preferred on the host, the rest
//                   preferred on and prefetched to the device (what the managed backend's stripe
//                   option does).
// Managed memory is allocated only when NVML says the card has that much free (the shim's
// cudaMemGetInfo reports the budget, not the card): rows are skipped otherwise.
// Prints a Markdown table and a "summary:" line; exit 1 when a spilled row is below 95% of its bound.
#include <dlfcn.h>

#include "oversub_common.h"

using namespace oversub;

namespace {

// The card's free memory from NVML (loaded at run time: nothing links it), or 0 if unknown.
std::size_t card_free_bytes() {
  struct NvmlMemory {
    unsigned long long total, free, used;
  };
  void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return 0;
  using Init = int (*)();
  using ByBus = int (*)(const char*, void**);
  using MemInfo = int (*)(void*, NvmlMemory*);
  auto init = reinterpret_cast<Init>(dlsym(h, "nvmlInit_v2"));
  auto by_bus = reinterpret_cast<ByBus>(dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2"));
  auto mem_info = reinterpret_cast<MemInfo>(dlsym(h, "nvmlDeviceGetMemoryInfo"));
  char bus[32] = {};
  void* dev = nullptr;
  NvmlMemory m{};
  if (!init || !by_bus || !mem_info || init() != 0 ||
      cudaDeviceGetPCIBusId(bus, sizeof bus, 0) != cudaSuccess || by_bus(bus, &dev) != 0 ||
      mem_info(dev, &m) != 0)
    return 0;
  return static_cast<std::size_t>(m.free);
}

cudaMemLocation device_loc() {
  cudaMemLocation l{};
  l.type = cudaMemLocationTypeDevice;
  l.id = 0;
  return l;
}

cudaMemLocation host_loc() {
  cudaMemLocation l{};
  l.type = cudaMemLocationTypeHost;
  l.id = 0;
  return l;
}

// Managed memory of `bytes` with a fraction `f_host` of its 2 MiB pages on the host (spread
// evenly, as the managed backend's stripe does), the rest on the device; read bandwidth.
double managed_gbps(std::size_t bytes, double f_host, unsigned* sink) {
  constexpr std::size_t kPage = 2 * kMiB;
  void* p = nullptr;
  CHECK(cudaMallocManaged(&p, bytes));
  const auto q = static_cast<unsigned long long>(f_host * 1e6 + 0.5);
  const std::size_t pages = (bytes + kPage - 1) / kPage;
  for (std::size_t i = 0; i < pages;) {
    const bool on_host = (i + 1) * q / 1000000 > i * q / 1000000;
    std::size_t j = i + 1;
    while (j < pages && ((j + 1) * q / 1000000 > j * q / 1000000) == on_host) ++j;
    char* at = static_cast<char*>(p) + i * kPage;
    const std::size_t len = std::min(j * kPage, bytes) - i * kPage;
    const cudaMemLocation where = on_host ? host_loc() : device_loc();
    CHECK(cudaMemAdvise(at, len, cudaMemAdviseSetPreferredLocation, where));
    CHECK(cudaMemPrefetchAsync(at, len, where, 0, nullptr));
    i = j;
  }
  CHECK(cudaMemAdvise(p, bytes, cudaMemAdviseSetAccessedBy, device_loc()));
  CHECK(cudaDeviceSynchronize());
  const double gbps = read_gbps(p, bytes, sink);
  CHECK(cudaFree(p));
  return gbps;
}

}  // namespace

int main(int argc, char** argv) {
  require_gpu();
  const std::size_t budget = argc > 1 ? parse_size(argv[1]) : 4 * kGiB;
  std::size_t free = 0, total = 0;
  CHECK(cudaMemGetInfo(&free, &total));
  EXPECT(total == budget,
         "cudaMemGetInfo reports %zu bytes, not the budget %zu: run under the shim "
         "with budget.device set to it",
         total, budget);
  unsigned* sink = nullptr;
  CHECK(cudaMalloc(&sink, sizeof *sink));

  constexpr std::size_t kRef = 2 * kGiB;
  void* d = nullptr;
  CHECK(cudaMalloc(&d, kRef));
  CHECK(cudaMemset(d, 1, kRef));
  const double b_dev = read_gbps(d, kRef, sink);
  CHECK(cudaFree(d));
  void* h = nullptr;
  CHECK(cudaHostAlloc(&h, kRef, cudaHostAllocMapped));
  std::memset(h, 1, kRef);
  void* hd = nullptr;
  CHECK(cudaHostGetDevicePointer(&hd, h, 0));
  const double b_host = read_gbps(hd, kRef, sink);
  CHECK(cudaFreeHost(h));

  std::printf(
      "| factor | size | f_host | spilled GB/s | bound GB/s | spilled/bound | managed host GB/s | managed stripe GB/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  double worst = 1e9;
  for (const double factor : {1.25, 1.5, 2.0}) {
    const auto bytes = static_cast<std::size_t>(factor * static_cast<double>(budget));
    CHECK(cudaMemGetInfo(&free, &total));
    const std::size_t room = std::min(free / (2 * kMiB) * (2 * kMiB), bytes);
    const double f_dev = static_cast<double>(room) / static_cast<double>(bytes);
    const double f_host = 1.0 - f_dev;
    void* s = nullptr;
    CHECK(cudaMalloc(&s, bytes));
    CHECK(cudaMemset(s, 2, bytes));
    const double spilled = read_gbps(s, bytes, sink);
    CHECK(cudaFree(s));
    const double bound = 1.0 / (f_dev / b_dev + f_host / b_host);
    worst = std::min(worst, spilled / bound);
    char mh[32] = "skipped", ms[32] = "skipped";
    const std::size_t card_free = card_free_bytes();
    if (card_free > bytes + kGiB) {
      std::snprintf(mh, sizeof mh, "%.1f", managed_gbps(bytes, 1.0, sink));
      std::snprintf(ms, sizeof ms, "%.1f", managed_gbps(bytes, f_host, sink));
    }
    std::printf("| %.2f | %.2f GiB | %.3f | %.1f | %.1f | %.1f%% | %s | %s |\n", factor,
                static_cast<double>(bytes) / static_cast<double>(kGiB), f_host, spilled, bound,
                100.0 * spilled / bound, mh, ms);
    std::fflush(stdout);
  }
  CHECK(cudaFree(sink));
  std::printf(
      "\nB_dev %.1f GB/s (device buffer), B_host %.1f GB/s (pinned host, mapped), budget %.2f GiB\n",
      b_dev, b_host, static_cast<double>(budget) / static_cast<double>(kGiB));
  std::printf("summary: spilled reads at >= %.1f%% of the model bound (target 95%%)\n",
              100.0 * worst);
  return worst >= 0.95 ? 0 : 1;
}
