// oversub_test: a program that needs more memory than its device budget, under the shim with
// budget.device=8GiB and a spill target (docs/oversubscription.md).
//
//   oversub_test many BUDGET [SPILL]   12 GiB in 64 pieces of 192 MiB
//   oversub_test one BUDGET [SPILL]    12 GiB in one piece
//   oversub_test promote BUDGET  (migrate = "promote") a block split between device and host chunks
//                                is read by kernels on two streams while the program frees a
//                                block that returns room under the budget; the free and the
//                                synchronizations after it promote the host chunks (at most
//                                256 MiB each): the data stays intact and the block then reads at
//                                device speed.
// BUDGET (e.g. 8GiB) is what cudaMemGetInfo must report as total under the shim; every byte is
// written and verified by kernels. SPILL (host, the default, or managed) is the policy's spill
// target: with host, device chunks fill the budget, so nothing is left free while 12 GiB are live;
// managed memory is not counted against the budget. Prints "allocations: N" / "frees: N" for the GPU harness.
// Exit status: 0 pass, 1 fail, 77 no GPU/driver.
#include "oversub_common.h"

using namespace oversub;

namespace {

void expect_budget(std::size_t budget) {
  std::size_t free = 0, total = 0;
  CHECK(cudaMemGetInfo(&free, &total));
  EXPECT(total == budget, "cudaMemGetInfo total %zu, expected the budget %zu (is the shim loaded?)",
         total, budget);
  EXPECT(free <= total, "free %zu above total %zu", free, total);
}

// Writes and verifies every word of every piece, all written before any is read.
void write_and_verify(const std::vector<void*>& pieces, std::size_t piece,
                      unsigned long long* bad) {
  for (std::size_t i = 0; i < pieces.size(); ++i)
    fill(pieces[i], piece, 0x1000u + static_cast<unsigned>(i));
  CHECK(cudaDeviceSynchronize());
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const unsigned long long n =
        count_bad(pieces[i], piece, 0x1000u + static_cast<unsigned>(i), bad);
    EXPECT(n == 0, "piece %zu of %zu bytes: %llu wrong words", i, piece, n);
  }
}

int run_pieces(std::size_t total, int count, std::size_t budget, bool host_spill) {
  expect_budget(budget);
  auto* bad = static_cast<unsigned long long*>(dmalloc(sizeof(unsigned long long)));
  const std::size_t piece = total / static_cast<std::size_t>(count);
  std::vector<void*> pieces;
  for (int i = 0; i < count; ++i) pieces.push_back(dmalloc(piece));
  std::size_t free = 0, reported = 0;
  CHECK(cudaMemGetInfo(&free, &reported));
  // 12 GiB live against 8 GiB: the budget is spent (up to the last chunks a pool may keep).
  if (host_spill)
    EXPECT(free < 64 * kMiB, "%zu bytes still free under the budget with %zu bytes live", free,
           total);
  write_and_verify(pieces, piece, bad);
  for (void* p : pieces) dfree(p);
  CHECK(cudaMemGetInfo(&free, &reported));
  EXPECT(free + 64 * kMiB >= budget, "only %zu bytes free after every piece was freed", free);
  dfree(bad);
  std::printf("summary: %d x %zu MiB written and verified under a %zu MiB budget\n", count,
              piece / kMiB, budget / kMiB);
  return 0;
}

int run_promote(std::size_t budget) {
  expect_budget(budget);
  auto* bad = static_cast<unsigned long long*>(dmalloc(2 * sizeof(unsigned long long)));
  CHECK(cudaMemset(bad, 0, 2 * sizeof(unsigned long long)));
  // A takes 3/4 of the budget; B (half the budget) then gets device chunks for the last quarter
  // and host chunks for the rest.
  void* a = dmalloc(budget / 4 * 3);
  const std::size_t b_bytes = budget / 2;
  void* b = dmalloc(b_bytes);
  fill(b, b_bytes, 0xb0b);
  CHECK(cudaDeviceSynchronize());
  EXPECT(count_bad(b, b_bytes, 0xb0b, bad) == 0, "B is wrong before the promotion");
  auto* sink = static_cast<unsigned*>(dmalloc(sizeof(unsigned)));
  const double before = read_gbps(b, b_bytes, sink, 3);

  // Kernels on two non-blocking streams read B while the host frees A: the free must wait for
  // them before moving any chunk, and must not move a chunk they could still read.
  cudaStream_t s[2];
  for (auto& st : s) CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CHECK(cudaMemset(bad, 0, 2 * sizeof(unsigned long long)));
  for (int round = 0; round < 4; ++round)
    for (int i = 0; i < 2; ++i) check_async(b, b_bytes, 0xb0b, bad + i, s[i]);
  dfree(a);  // room returns: the host chunks of B move to the device
  for (int i = 0; i < 2; ++i) check_async(b, b_bytes, 0xb0b, bad + i, s[i]);
  for (auto& st : s) CHECK(cudaStreamSynchronize(st));
  unsigned long long concurrent[2] = {};
  CHECK(cudaMemcpy(concurrent, bad, sizeof concurrent, cudaMemcpyDeviceToHost));
  EXPECT(concurrent[0] == 0 && concurrent[1] == 0,
         "kernels running across the promotion saw %llu and %llu wrong words", concurrent[0],
         concurrent[1]);
  EXPECT(count_bad(b, b_bytes, 0xb0b, bad) == 0, "B is wrong after the promotion");
  // Each synchronization is a safe point that promotes at most 256 MiB (Budget::kPromotePerPoint):
  // enough of them bring the rest of B back.
  for (std::size_t moved = 0; moved < b_bytes; moved += std::size_t{256} << 20)
    CHECK(cudaDeviceSynchronize());
  EXPECT(count_bad(b, b_bytes, 0xb0b, bad) == 0, "B is wrong after the last promotion");
  // Writes after the promotion land in the device chunks and stay.
  fill(b, b_bytes, 0xc0c);
  CHECK(cudaDeviceSynchronize());
  EXPECT(count_bad(b, b_bytes, 0xc0c, bad) == 0, "B does not keep writes after the promotion");
  const double after = read_gbps(b, b_bytes, sink, 3);
  for (auto& st : s) CHECK(cudaStreamDestroy(st));
  dfree(b);
  dfree(sink);
  dfree(bad);
  std::printf("summary: B read at %.0f GB/s half spilled, %.0f GB/s after promotion\n", before,
              after);
  EXPECT(after > 4 * before, "B reads at %.0f GB/s after the free (%.0f before): not promoted",
         after, before);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  start_program(argc, argv, 2, "many|one|promote BUDGET [host|managed]");
  const std::string mode = argv[1];
  const std::size_t budget = parse_size(argv[2]);
  const bool host_spill = argc < 4 || std::string(argv[3]) == "host";
  int rc = 2;
  if (mode == "many")
    rc = run_pieces(12 * kGiB, 64, budget, host_spill);
  else if (mode == "one")
    rc = run_pieces(12 * kGiB, 1, budget, host_spill);
  else if (mode == "promote")
    rc = run_promote(budget);
  std::printf("allocations: %d\nfrees: %d\n", allocations, frees);
  return rc;
}
