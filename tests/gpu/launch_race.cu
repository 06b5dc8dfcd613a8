// Threads launching while another thread's allocations force moves of the very buffer they launch
// over (issue 23's first row): thread A allocates a buffer first, fills it, then checks it over and
// over with kernels on a stream of its own; thread B allocates past the device budget, fills and
// frees, round after round. A's kernels find the buffer through a pointer array in device memory,
// which the shim's parameter scan cannot see, so under migrate = "auto" the policy knows no use
// of it and places it blind (by age): B's allocations demote it while A's kernels are in flight,
// and B's idle synchronizations bring it back. Every check must find every word intact and no
// launch may fault.
//
// The program watches where the buffer lives (the physical allocation behind sampled chunks,
// through cuMemRetainAllocationHandle: host or device) from both threads and counts the changes it
// sees: the moves of the checked buffer, which a shim that kept it in place would not make.
//
//   launch_race A_BYTES B_BYTES ROUNDS [MIN_MOVES]
// Output: "result wrong_words=W checks=C rounds=R checked_moves=M host_checks=H"; exit 0, 1 on a
// wrong word, a CUDA error or fewer than MIN_MOVES (default 0) moves of the checked buffer seen,
// 77 without a GPU.
#include <atomic>
#include <mutex>
#include <thread>

#include "oversub_common.h"

using namespace oversub;

namespace {

// check_words over the buffer *where points to: the kernel's parameters name only `where`.
__global__ void check_words_at(const std::uint32_t* const* where, std::size_t n, std::uint32_t seed,
                               unsigned long long* bad) {
  const std::uint32_t* p = *where;
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  unsigned long long mine = 0;
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    mine += p[i] != pattern(i, seed);
  if (mine) atomicAdd(bad, mine);
}

// The driver entry points the watch uses, through the runtime (the program links no libcuda).
struct Driver {
  decltype(&cuMemRetainAllocationHandle) retain = nullptr;
  decltype(&cuMemGetAllocationPropertiesFromHandle) properties = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  Driver() {
    get("cuMemRetainAllocationHandle", retain);
    get("cuMemGetAllocationPropertiesFromHandle", properties);
    get("cuMemRelease", release);
  }
  template <class F>
  static void get(const char* name, F& f) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    CHECK(cudaGetDriverEntryPointByVersion(name, &p, 11000, cudaEnableDefault, &q));
    EXPECT(q == cudaDriverEntryPointSuccess && p != nullptr, "no driver entry point %s", name);
    f = reinterpret_cast<F>(p);
  }
};

// Where [p, p + bytes) lives, sampled at kSamples chunks: how many sit in host memory, or -1 when
// it cannot be told (not a VMM mapping, as natively; or a chunk caught between unmap and remap).
constexpr int kSamples = 8;
int host_chunks(const Driver& d, const void* p, std::size_t bytes) {
  int host = 0;
  for (int s = 0; s < kSamples; ++s) {
    const std::size_t off = (bytes - 1) / (kSamples - 1) * s;
    CUmemGenericAllocationHandle h;
    if (d.retain(&h, static_cast<char*>(const_cast<void*>(p)) + off) != CUDA_SUCCESS) return -1;
    CUmemAllocationProp prop{};
    const CUresult r = d.properties(&prop, h);
    d.release(h);
    if (r != CUDA_SUCCESS) return -1;
    host += prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE;
  }
  return host;
}

// The placements seen so far, from either thread: a change of how many sampled chunks are on the
// host is a move of the checked buffer.
class Watch {
 public:
  Watch(const void* p, std::size_t bytes) : p_(p), bytes_(bytes) {}
  int look() {
    std::lock_guard lock(mutex_);
    const int now = host_chunks(driver_, p_, bytes_);
    if (now < 0) return now;
    if (last_ >= 0 && now != last_) ++moves_;
    last_ = now;
    return now;
  }
  int moves() const { return moves_; }

 private:
  Driver driver_;
  const void* p_;
  std::size_t bytes_;
  std::mutex mutex_;
  int last_ = -1, moves_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  start_program(argc, argv, 3, "A_BYTES B_BYTES ROUNDS [MIN_MOVES]");
  const std::size_t a_bytes = parse_size(argv[1]), b_bytes = parse_size(argv[2]);
  const int rounds = std::atoi(argv[3]);
  const int min_moves = argc > 4 ? std::atoi(argv[4]) : 0;
  void* a = dmalloc(a_bytes);  // first: the oldest allocation
  fill(a, a_bytes, 0xa11ce);
  // The pointer array A's kernels read the buffer's address from.
  const std::uint32_t** where = nullptr;
  CHECK(cudaMalloc(&where, sizeof *where));
  const auto* a_words = static_cast<const std::uint32_t*>(a);
  CHECK(cudaMemcpy(where, &a_words, sizeof a_words, cudaMemcpyHostToDevice));
  CHECK(cudaDeviceSynchronize());
  Watch watch(a, a_bytes);
  watch.look();

  std::atomic<bool> done{false};
  std::atomic<unsigned long long> checks{0}, host_checks{0};
  unsigned long long* bad = nullptr;
  CHECK(cudaMalloc(&bad, sizeof *bad));
  CHECK(cudaMemset(bad, 0, sizeof *bad));
  std::thread launcher([&] {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    while (!done.load()) {
      if (watch.look() > 0) host_checks += 4;  // these checks start with some of it on the host
      for (int i = 0; i < 4; ++i) {
        check_words_at<<<grid_blocks(), 512, 0, s>>>(where, a_bytes / 4, 0xa11ce, bad);
        CHECK(cudaGetLastError());
      }
      CHECK(cudaStreamSynchronize(s));
      checks += 4;
    }
    CHECK(cudaStreamDestroy(s));
  });
  for (int r = 0; r < rounds; ++r) {
    void* b = dmalloc(b_bytes);
    watch.look();  // B's allocation made room
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
    watch.look();
  }
  done = true;
  launcher.join();
  unsigned long long wrong = 0;
  CHECK(cudaMemcpy(&wrong, bad, sizeof wrong, cudaMemcpyDeviceToHost));
  std::printf("result wrong_words=%llu checks=%llu rounds=%d checked_moves=%d host_checks=%llu\n",
              wrong, checks.load(), rounds, watch.moves(), host_checks.load());
  EXPECT(wrong == 0, "thread A's buffer changed while it was read");
  EXPECT(watch.moves() >= min_moves, "the checked buffer was not seen moving as often as asked");
  CHECK(cudaFree(bad));
  CHECK(cudaFree(where));
  dfree(a);
  std::printf("verify ok\n");
  return 0;
}
