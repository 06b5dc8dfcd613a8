// Threads launching while another thread's allocations force moves (issue 23's first row): thread
// A allocates a buffer first, fills it, then checks it over and over with kernels on a stream of its
// own; thread B allocates past the device budget, fills and frees, round after round, so that under
// migrate = "auto" the shim demotes A's buffer (the oldest) and brings it back at B's
// synchronizations while A's kernels run. Every check must find every word intact and no launch may
// fault; the shim's statistics say how many moves happened.
//
//   launch_race A_BYTES B_BYTES ROUNDS
// Output: "result wrong_words=W checks=C rounds=R"; exit 0, 1 on a wrong word or a CUDA error, 77
// without a GPU.
#include <atomic>
#include <thread>

#include "oversub_common.h"

using namespace oversub;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s A_BYTES B_BYTES ROUNDS\n", argv[0]);
    return 2;
  }
  require_gpu();
  const std::size_t a_bytes = parse_size(argv[1]), b_bytes = parse_size(argv[2]);
  const int rounds = std::atoi(argv[3]);
  void* a = dmalloc(a_bytes);  // first: the oldest allocation
  fill(a, a_bytes, 0xa11ce);
  CHECK(cudaDeviceSynchronize());

  std::atomic<bool> done{false};
  std::atomic<unsigned long long> checks{0};
  unsigned long long* bad = nullptr;
  CHECK(cudaMalloc(&bad, sizeof *bad));
  CHECK(cudaMemset(bad, 0, sizeof *bad));
  std::thread launcher([&] {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    while (!done.load()) {
      for (int i = 0; i < 4; ++i) check_async(a, a_bytes, 0xa11ce, bad, s);
      CHECK(cudaStreamSynchronize(s));
      checks += 4;
    }
    CHECK(cudaStreamDestroy(s));
  });
  for (int r = 0; r < rounds; ++r) {
    void* b = dmalloc(b_bytes);
    fill(b, b_bytes, 0xb0b + r);
    CHECK(cudaDeviceSynchronize());
    unsigned long long* b_bad = nullptr;
    CHECK(cudaMalloc(&b_bad, sizeof *b_bad));
    CHECK(cudaMemset(b_bad, 0, sizeof *b_bad));
    check_async(b, b_bytes, 0xb0b + r, b_bad);
    unsigned long long wrong_b = 0;
    CHECK(cudaMemcpy(&wrong_b, b_bad, sizeof wrong_b, cudaMemcpyDeviceToHost));
    EXPECT(wrong_b == 0, "thread B's buffer is wrong");
    CHECK(cudaFree(b_bad));
    dfree(b);
    // Idle synchronizations: safe points where A's buffer may come back.
    for (int i = 0; i < 4; ++i) CHECK(cudaDeviceSynchronize());
  }
  done = true;
  launcher.join();
  unsigned long long wrong = 0;
  CHECK(cudaMemcpy(&wrong, bad, sizeof wrong, cudaMemcpyDeviceToHost));
  std::printf("result wrong_words=%llu checks=%llu rounds=%d\n", wrong, checks.load(), rounds);
  EXPECT(wrong == 0, "thread A's buffer changed while it was read");
  CHECK(cudaFree(bad));
  dfree(a);
  std::printf("verify ok\n");
  return 0;
}
