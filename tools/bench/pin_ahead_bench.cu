// A program that computes between allocations ([backends.host] pin_ahead; docs/design/oversubscription.md,
// "Pinning ahead"): COLD bytes are allocated and written (then left alone), HOT bytes allocated
// and written, kernels read HOT for COMPUTE_MS (the program's work, its memory near the budget),
// then SECOND bytes are allocated. Under a budget that the three exceed, with migrate = "auto",
// that allocation demotes the cold set, or, where nothing is colder than it, is spilled itself:
// its time is what pinning the host memory costs, unless that was pinned ahead during the compute.
//
//   pin_ahead_bench COLD HOT SECOND COMPUTE_MS      (COLD may be 0)
//
// Output: "result alloc_ms=A compute_passes=N" (A: the SECOND allocation alone) and "verify ok"
// once every set is checked by kernels. Exit 0, 1 on a wrong word, 77 without a GPU.
#include <chrono>

#include "oversub_common.h"

using namespace oversub;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s COLD HOT SECOND COMPUTE_MS\n", argv[0]);
    return 2;
  }
  require_gpu();
  const std::size_t cold_bytes = parse_size(argv[1]), first_bytes = parse_size(argv[2]),
                    second_bytes = parse_size(argv[3]);
  const double compute_ms = std::atof(argv[4]);
  unsigned* sink = nullptr;
  unsigned long long* bad = nullptr;
  CHECK(cudaMalloc(&sink, sizeof *sink));
  CHECK(cudaMalloc(&bad, sizeof *bad));
  void* cold = nullptr;
  if (cold_bytes > 0) {
    CHECK(cudaMalloc(&cold, cold_bytes));
    fill(cold, cold_bytes, 0xc01d);
  }
  void* first = nullptr;
  CHECK(cudaMalloc(&first, first_bytes));
  fill(first, first_bytes, 0xf1257);
  CHECK(cudaDeviceSynchronize());

  // The program's work: reads of its data, a synchronization after each (as a training step
  // ends), until COMPUTE_MS have passed.
  const int blocks = grid_blocks() * 2;
  int passes = 0;
  const auto c0 = std::chrono::steady_clock::now();
  while (ms_since(c0) < compute_ms) {
    read_kernel<<<blocks, 512>>>(static_cast<const uint4*>(first), first_bytes / 16, sink);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    ++passes;
  }

  const auto t0 = std::chrono::steady_clock::now();
  void* second = nullptr;
  CHECK(cudaMalloc(&second, second_bytes));
  const double alloc_ms = ms_since(t0);
  fill(second, second_bytes, 0x5ec0d);
  CHECK(cudaDeviceSynchronize());
  std::printf("result alloc_ms=%.2f compute_passes=%d\n", alloc_ms, passes);
  EXPECT(cold == nullptr || count_bad(cold, cold_bytes, 0xc01d, bad) == 0, "the cold set is wrong");
  EXPECT(count_bad(first, first_bytes, 0xf1257, bad) == 0, "the hot set is wrong");
  EXPECT(count_bad(second, second_bytes, 0x5ec0d, bad) == 0, "the second set is wrong");
  std::printf("verify ok\n");
  for (void* p : {cold, first, second, static_cast<void*>(sink), static_cast<void*>(bad)})
    if (p != nullptr) CHECK(cudaFree(p));
  return 0;
}
