// Live migration on a real GPU (docs/oversubscription.md, "Migration"), run under
// budget.device=BUDGET, spill=host, migrate=auto:
//   1. A (3/4 of the budget) is written by a kernel, then left alone for some safe points (the
//      placement keeps memory just used and lets a newcomer spill itself instead); B (half the
//      budget) does not fit beside it, so allocating B demotes pieces of A to the host. Kernels on
//      two non-blocking streams then verify A and fill B at once.
//   2. B is freed with cudaFreeAsync (no safe point): room returns. A long kernel on stream 2 keeps
//      reading A while the program synchronizes stream 1: that safe point must be skipped (nothing
//      of A may move under the kernel), which the harness checks in the stats (skipped_busy).
//   3. Each cudaDeviceSynchronize then promotes at most 256 MiB of A; after every one, kernels on
//      both streams verify A (and the long kernel's count stays 0).
//   4. A is left alone again, then C (3/4 of the budget) demotes it again; kernels on both streams
//      verify A and C.
// Every byte is written and verified by kernels before and after each migration. Prints
// "allocations: N" / "frees: N" for the GPU harness. Exit 0 pass, 1 fail, 77 no GPU.
#include <chrono>
#include <thread>

#include "oversub_common.h"

using namespace oversub;

namespace {

// Verifies [p, p + bytes) on both streams at once (each half on one), then synchronizes the
// context (a safe point) and returns the mismatches.
unsigned long long verify_two_streams(const void* p, std::size_t bytes, std::uint32_t seed,
                                      unsigned long long* bad, cudaStream_t s[2]) {
  CHECK(cudaMemset(bad, 0, 2 * sizeof(unsigned long long)));
  CHECK(cudaDeviceSynchronize());
  // The pattern depends on the word index, so each stream checks the whole range.
  for (int i = 0; i < 2; ++i) check_async(p, bytes, seed, bad + i, s[i]);
  for (int i = 0; i < 2; ++i) CHECK(cudaStreamSynchronize(s[i]));
  unsigned long long host[2] = {};
  CHECK(cudaMemcpy(host, bad, sizeof host, cudaMemcpyDeviceToHost));
  return host[0] + host[1];
}

// Safe points with nothing launched, more than an epoch apart: what was used before cools until
// a newcomer used once is denser, so its room is taken from it.
void let_cool() {
  for (int i = 0; i < 16; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(15));
    CHECK(cudaDeviceSynchronize());
  }
}

}  // namespace

int main(int argc, char** argv) {
  start_program(argc, argv, 1, "BUDGET");
  const std::size_t budget = parse_size(argv[1]);
  const std::size_t a_bytes = budget / 4 * 3, b_bytes = budget / 2, c_bytes = budget / 4 * 3;
  cudaStream_t s[2];
  for (auto& st : s) CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto* bad = static_cast<unsigned long long*>(dmalloc(3 * sizeof(unsigned long long)));

  void* a = dmalloc(a_bytes);
  fill(a, a_bytes, 0xa1);
  CHECK(cudaDeviceSynchronize());
  EXPECT(verify_two_streams(a, a_bytes, 0xa1, bad, s) == 0, "A is wrong before any migration");

  // 1. B does not fit beside A: pieces of A go to the host.
  let_cool();
  void* b = dmalloc(b_bytes);
  fill(b, b_bytes, 0xb2, s[1]);
  check_async(a, a_bytes, 0xa1, bad, s[0]);
  CHECK(cudaDeviceSynchronize());
  unsigned long long wrong = 0;
  CHECK(cudaMemcpy(&wrong, bad, sizeof wrong, cudaMemcpyDeviceToHost));
  EXPECT(wrong == 0, "A is wrong after the demotion (%llu words)", wrong);
  EXPECT(verify_two_streams(b, b_bytes, 0xb2, bad, s) == 0, "B is wrong");

  // 2. Room returns without a safe point; a long kernel reads A on stream 2 while stream 1 is
  // synchronized: no piece of A may move under it.
  CHECK(cudaFreeAsync(b, s[0]));
  ++frees;
  CHECK(cudaStreamSynchronize(s[0]));  // stream 2 idle yet: may promote, A is verified below
  CHECK(cudaMemset(bad + 2, 0, sizeof(unsigned long long)));
  CHECK(cudaDeviceSynchronize());
  for (int round = 0; round < 40; ++round) check_async(a, a_bytes, 0xa1, bad + 2, s[1]);
  CHECK(cudaStreamSynchronize(s[0]));  // stream 2 busy: skipped
  CHECK(cudaStreamSynchronize(s[1]));
  CHECK(cudaMemcpy(&wrong, bad + 2, sizeof wrong, cudaMemcpyDeviceToHost));
  EXPECT(wrong == 0, "the long reader of A saw %llu wrong words", wrong);

  // 3. Promotion, at most 256 MiB per safe point, verified after each.
  for (std::size_t moved = 0; moved < a_bytes; moved += std::size_t{256} << 20) {
    CHECK(cudaDeviceSynchronize());
    EXPECT(verify_two_streams(a, a_bytes, 0xa1, bad, s) == 0, "A is wrong after a promotion");
  }
  auto* sink = static_cast<unsigned*>(dmalloc(sizeof(unsigned)));
  const double promoted = read_gbps(a, a_bytes, sink, 3);

  // 4. C demotes A again.
  let_cool();
  void* c = dmalloc(c_bytes);
  fill(c, c_bytes, 0xc3, s[1]);
  check_async(a, a_bytes, 0xa1, bad, s[0]);
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(&wrong, bad, sizeof wrong, cudaMemcpyDeviceToHost));
  EXPECT(wrong == 0, "A is wrong after the second demotion (%llu words)", wrong);
  EXPECT(verify_two_streams(c, c_bytes, 0xc3, bad, s) == 0, "C is wrong");
  const double c_gbps = read_gbps(c, c_bytes, sink, 3);
  // Writes after the moves stay.
  fill(a, a_bytes, 0xa4);
  CHECK(cudaDeviceSynchronize());
  EXPECT(verify_two_streams(a, a_bytes, 0xa4, bad, s) == 0, "A does not keep writes");

  for (void* p : {a, c, static_cast<void*>(sink), static_cast<void*>(bad)}) dfree(p);
  for (auto& st : s) CHECK(cudaStreamDestroy(st));
  std::printf("summary: A read at %.0f GB/s after promotion, C (newest) at %.0f GB/s\n", promoted,
              c_gbps);
  std::printf("allocations: %d\nfrees: %d\n", allocations, frees);
  return 0;
}
