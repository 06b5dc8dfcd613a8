// The reuse pattern of issue 12 (docs/design/oversubscription.md, "The reuse pattern"): COLD
// bytes are allocated and written, then left alone; then HOT bytes are allocated, written, and read
// ITERS times by a grid-stride kernel. Prints the hot set's read bandwidth over all ITERS reads
// (and the first read alone), then verifies both sets with kernels.
//
//   migrate_bench malloc COLD HOT ITERS [again]    cudaMalloc (run natively, or under allocshim
//                                                  with a budget and a migrate mode); `again`:
//                                                  then the hot set is freed, the device left
//                                                  idle for 32 synchronizations (where the cold
//                                                  set may come back) and the hot set allocated
//                                                  again, both timed ("again promote_ms=P
//                                                  realloc_hot_ms=R")
//   migrate_bench weights-first COLD HOT ITERS     cudaMalloc, the other order: HOT allocated and
//                                                  written first (a model's weights), then COLD;
//                                                  each read of HOT is followed by a
//                                                  cudaDeviceSynchronize (a safe point). Also prints
//                                                  "passes gbps=P1,P2,..." for the first five reads
//   migrate_bench managed-host COLD HOT ITERS      cudaMallocManaged, every page preferred on the
//                                                  host and the GPU advised as accessor (read in
//                                                  place over the link, as a budget would place it)
//   migrate_bench managed-prefetch COLD HOT ITERS  cudaMallocManaged, the cold set prefetched to the
//                                                  host and the hot set to the GPU (the program
//                                                  migrating by hand)
//   migrate_bench managed-fault COLD HOT ITERS     cudaMallocManaged without advice, both sets
//                                                  written by the CPU: the GPU's reads fault the
//                                                  hot pages over
// Managed memory is never asked for beyond the GPU's free memory (the sizes must fit).
// Output: "result mode=M hot_gbps=G first_gbps=F alloc_hot_ms=A reads_ms=R e2e_ms=E" (E = A + R)
// and "verify ok". Exit 0, 1 on a
// wrong word, 77 without a GPU.
#include <chrono>

#include "oversub_common.h"

using namespace oversub;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void host_fill(void* p, std::size_t bytes, std::uint32_t seed) {
  auto* w = static_cast<std::uint32_t*>(p);
  for (std::size_t i = 0; i < bytes / 4; ++i) w[i] = pattern(i, seed);
}

// The hot set allocated first: a program's weights, read at every pass, then a larger buffer
// written once. End to end = from the cold set's allocation to the last read.
int weights_first(std::size_t cold_bytes, std::size_t hot_bytes, int iters) {
  void* hot = nullptr;
  CHECK(cudaMalloc(&hot, hot_bytes));
  fill(hot, hot_bytes, 0x407);
  CHECK(cudaDeviceSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  void* cold = nullptr;
  CHECK(cudaMalloc(&cold, cold_bytes));
  const double alloc_ms = ms_since(t0);
  fill(cold, cold_bytes, 0xc01d);
  CHECK(cudaDeviceSynchronize());
  unsigned* sink = nullptr;
  CHECK(cudaMalloc(&sink, sizeof *sink));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  const int blocks = grid_blocks() * 2;
  std::string passes;
  double reads_ms = 0, last_gbps = 0;
  for (int i = 0; i < iters; ++i) {
    CHECK(cudaEventRecord(start));
    read_kernel<<<blocks, 512>>>(static_cast<const uint4*>(hot), hot_bytes / 16, sink);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(stop));
    CHECK(cudaDeviceSynchronize());
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    reads_ms += ms;
    last_gbps = double(hot_bytes) / (ms * 1e6);
    if (i < 5) passes += (i ? "," : "") + std::to_string(static_cast<int>(last_gbps));
  }
  const double e2e_ms = ms_since(t0);
  std::printf("passes gbps=%s\n", passes.c_str());
  std::printf(
      "result mode=weights-first hot_gbps=%.1f last_gbps=%.1f alloc_cold_ms=%.1f reads_ms=%.1f e2e_ms=%.1f\n",
      double(hot_bytes) * iters / (reads_ms * 1e6), last_gbps, alloc_ms, reads_ms, e2e_ms);
  unsigned long long* bad = nullptr;
  CHECK(cudaMalloc(&bad, sizeof *bad));
  EXPECT(count_bad(cold, cold_bytes, 0xc01d, bad) == 0, "the cold set is wrong");
  EXPECT(count_bad(hot, hot_bytes, 0x407, bad) == 0, "the hot set is wrong");
  std::printf("verify ok\n");
  for (void* p : {cold, hot, static_cast<void*>(sink), static_cast<void*>(bad)}) CHECK(cudaFree(p));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(
        stderr,
        "usage: %s malloc|weights-first|managed-host|managed-prefetch|managed-fault COLD HOT ITERS\n",
        argv[0]);
    return 2;
  }
  require_gpu();
  const std::string mode = argv[1];
  const std::size_t cold_bytes = parse_size(argv[2]), hot_bytes = parse_size(argv[3]);
  const int iters = std::atoi(argv[4]);
  const bool managed = mode != "malloc" && mode != "weights-first";
  if (managed) {
    std::size_t free = 0, total = 0;
    CHECK(cudaMemGetInfo(&free, &total));
    EXPECT(cold_bytes + hot_bytes + kGiB < free, "managed sets larger than the GPU's free memory");
  }
  int dev = 0;
  CHECK(cudaGetDevice(&dev));
  cudaMemLocation host_loc{};
  host_loc.type = cudaMemLocationTypeHost;
  cudaMemLocation dev_loc{};
  dev_loc.type = cudaMemLocationTypeDevice;
  dev_loc.id = dev;

  auto alloc = [&](std::size_t bytes) {
    void* p = nullptr;
    if (managed)
      CHECK(cudaMallocManaged(&p, bytes));
    else
      CHECK(cudaMalloc(&p, bytes));
    if (mode == "managed-host") {
      CHECK(cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, host_loc));
      CHECK(cudaMemAdvise(p, bytes, cudaMemAdviseSetAccessedBy, dev_loc));
    }
    return p;
  };
  auto write = [&](void* p, std::size_t bytes, std::uint32_t seed) {
    if (mode == "managed-fault")
      host_fill(p, bytes, seed);
    else
      fill(p, bytes, seed);
    CHECK(cudaDeviceSynchronize());
  };

  if (mode == "weights-first") return weights_first(cold_bytes, hot_bytes, iters);
  void* cold = alloc(cold_bytes);
  write(cold, cold_bytes, 0xc01d);
  if (mode == "managed-prefetch") CHECK(cudaMemPrefetchAsync(cold, cold_bytes, host_loc, 0));
  CHECK(cudaDeviceSynchronize());

  const auto t0 = std::chrono::steady_clock::now();
  void* hot = alloc(hot_bytes);
  const double alloc_ms = ms_since(t0);
  write(hot, hot_bytes, 0x407);
  if (mode == "managed-prefetch") CHECK(cudaMemPrefetchAsync(hot, hot_bytes, dev_loc, 0));
  CHECK(cudaDeviceSynchronize());

  unsigned* sink = nullptr;
  CHECK(cudaMalloc(&sink, sizeof *sink));
  cudaEvent_t start, first, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&first));
  CHECK(cudaEventCreate(&stop));
  const int blocks = grid_blocks() * 2;
  CHECK(cudaEventRecord(start));
  for (int i = 0; i < iters; ++i) {
    read_kernel<<<blocks, 512>>>(static_cast<const uint4*>(hot), hot_bytes / 16, sink);
    if (i == 0) CHECK(cudaEventRecord(first));
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(stop));
  CHECK(cudaEventSynchronize(stop));
  float all_ms = 0, first_ms = 0;
  CHECK(cudaEventElapsedTime(&all_ms, start, stop));
  CHECK(cudaEventElapsedTime(&first_ms, start, first));
  const double gbps = double(hot_bytes) * iters / (all_ms * 1e6);
  const double first_gbps = double(hot_bytes) / (first_ms * 1e6);
  // End to end: the hot set's allocation (where demotion happens) plus its reads (where managed
  // memory faults); the fill in between is the program's either way.
  std::printf(
      "result mode=%s hot_gbps=%.1f first_gbps=%.1f alloc_hot_ms=%.1f reads_ms=%.1f e2e_ms=%.1f\n",
      mode.c_str(), gbps, first_gbps, alloc_ms, all_ms, alloc_ms + all_ms);

  unsigned long long* bad = nullptr;
  CHECK(cudaMalloc(&bad, sizeof *bad));
  EXPECT(count_bad(cold, cold_bytes, 0xc01d, bad) == 0, "the cold set is wrong");
  EXPECT(count_bad(hot, hot_bytes, 0x407, bad) == 0, "the hot set is wrong");
  if (!managed && argc > 5 && std::string(argv[5]) == "again") {
    // The hot set freed and the device left idle: under migrate = "promote" or "auto" the cold set
    // comes back to the device at the next safe points (each synchronization promotes a bounded
    // amount). Then the hot set is allocated again: under "auto" that demotes the cold set once
    // more, now into the host pieces its promotion kept (the host reserve): a move without pinning.
    CHECK(cudaFree(hot));
    const auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < 32; ++i) CHECK(cudaDeviceSynchronize());
    const double promote_ms = ms_since(t1);
    const auto t2 = std::chrono::steady_clock::now();
    hot = alloc(hot_bytes);
    const double realloc_ms = ms_since(t2);
    write(hot, hot_bytes, 0x408);
    EXPECT(count_bad(cold, cold_bytes, 0xc01d, bad) == 0,
           "the cold set is wrong after moving back and forth");
    EXPECT(count_bad(hot, hot_bytes, 0x408, bad) == 0, "the second hot set is wrong");
    std::printf("again promote_ms=%.1f realloc_hot_ms=%.1f\n", promote_ms, realloc_ms);
  }
  std::printf("verify ok\n");
  for (void* p : {cold, hot, static_cast<void*>(sink), static_cast<void*>(bad)}) CHECK(cudaFree(p));
  return 0;
}
