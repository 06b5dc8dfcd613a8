// A program that computes between allocations ([budget] pin_ahead; docs/design/oversubscription.md,
// "Pinning ahead"): FIRST bytes are allocated and written, kernels read them for COMPUTE_MS (the
// program's work, its memory near the budget), then SECOND bytes are allocated. Under a budget
// that FIRST + SECOND exceeds, with migrate = "auto", that allocation demotes part of FIRST: its
// time is what pinning the host pieces costs, unless they were pinned ahead during the compute.
//
//   pin_ahead_bench FIRST SECOND COMPUTE_MS
//
// Output: "result alloc_ms=A compute_passes=N" (A: the SECOND allocation alone) and "verify ok"
// once both sets are checked by kernels. Exit 0, 1 on a wrong word, 77 without a GPU.
#include <chrono>

#include "oversub_common.h"

using namespace oversub;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s FIRST SECOND COMPUTE_MS\n", argv[0]);
    return 2;
  }
  require_gpu();
  const std::size_t first_bytes = parse_size(argv[1]), second_bytes = parse_size(argv[2]);
  const double compute_ms = std::atof(argv[3]);
  unsigned* sink = nullptr;
  unsigned long long* bad = nullptr;
  CHECK(cudaMalloc(&sink, sizeof *sink));
  CHECK(cudaMalloc(&bad, sizeof *bad));
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
  EXPECT(count_bad(first, first_bytes, 0xf1257, bad) == 0, "the first set is wrong");
  EXPECT(count_bad(second, second_bytes, 0x5ec0d, bad) == 0, "the second set is wrong");
  std::printf("verify ok\n");
  for (void* p : {first, second, static_cast<void*>(sink), static_cast<void*>(bad)}) CHECK(cudaFree(p));
  return 0;
}
