// thrust_sort: an allocation-heavy "real" program. Thrust and CUB algorithms on many arrays of
// varied sizes in a loop: thrust::device_vector (cudaMalloc), thrust::sort and thrust::reduce (which
// allocate their temporary storage internally), cub::DeviceRadixSort and cub::DeviceReduce with
// temporary storage from cudaMalloc. Every result is verified on the host.
//
//   thrust_sort [ARRAYS]                      # natively
//   allocshim run -- thrust_sort [ARRAYS]     # the same program under the shim
//
// Thrust allocates internally, so the program cannot count its own allocations and prints no
// "allocations: N" line: a test compares its stdout with a native run's instead
// (check_stats.py --compare-native). stdout is deterministic (sizes, sums, checksums); the timing
// goes to stderr. Exit status: 0 pass, 1 failure, 77 no GPU or driver.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_reduce.cuh>
#include <cuda_runtime.h>
#include <thrust/device_vector.h>
#include <thrust/functional.h>
#include <thrust/host_vector.h>
#include <thrust/reduce.h>
#include <thrust/sort.h>
#include <thrust/tabulate.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "example_check.h"

namespace {

__host__ __device__ std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Key i of array `a`: a pseudo-random 32-bit value, with duplicates in small arrays' ranges.
struct KeyOf {
  std::uint64_t seed;
  __host__ __device__ std::uint32_t operator()(std::uint64_t i) const {
    return static_cast<std::uint32_t>(mix(seed ^ (i * 0x2545f4914f6cdd1dull)) >> 17);
  }
};

// 64-bit keys for the CUB radix sort.
struct WideKeyOf {
  std::uint64_t seed;
  __host__ __device__ std::uint64_t operator()(std::uint64_t i) const { return mix(seed + i); }
};

struct Widen {
  __host__ __device__ std::uint64_t operator()(std::uint32_t v) const { return v; }
};

std::uint64_t fnv(std::uint64_t h, std::uint64_t v) {
  for (int b = 0; b < 8; ++b) {
    h ^= (v >> (8 * b)) & 0xff;
    h *= 0x100000001b3ull;
  }
  return h;
}

// Log-uniform sizes from 1 Ki to 1 Mi elements, a deterministic sequence.
std::size_t size_of_array(int a) {
  const double lo = 10.0, hi = 20.0;  // log2 bounds
  const double u = static_cast<double>(mix(0x5eedull + a) >> 11) / 9007199254740992.0;
  std::size_t n = static_cast<std::size_t>(std::exp2(lo + u * (hi - lo)));
  return std::max<std::size_t>(n, 1) + static_cast<std::size_t>(a % 7);  // odd sizes too
}

}  // namespace

int main(int argc, char** argv) {
  const int arrays = argc > 1 ? std::atoi(argv[1]) : 300;
  if (arrays <= 0) {
    std::printf("usage: %s [ARRAYS > 0]\n", argv[0]);
    return 2;
  }
  exit_unless_gpu();

  const auto t0 = std::chrono::steady_clock::now();
  std::uint64_t checksum = 0xcbf29ce484222325ull, elements = 0, bytes_sorted = 0;
  long failures = 0;
  std::size_t smallest = ~std::size_t{0}, largest = 0;
  for (int a = 0; a < arrays; ++a) {
    const std::size_t n = size_of_array(a);
    elements += n;
    smallest = std::min(smallest, n);
    largest = std::max(largest, n);

    // 1. thrust: keys generated on the device, sorted, summed (internal temporary allocations).
    thrust::device_vector<std::uint32_t> keys(n);
    thrust::tabulate(keys.begin(), keys.end(), KeyOf{static_cast<std::uint64_t>(a) * 7919u});
    const std::uint64_t sum_before = thrust::transform_reduce(
        keys.begin(), keys.end(), Widen{}, std::uint64_t{0}, thrust::plus<std::uint64_t>());
    thrust::sort(keys.begin(), keys.end());
    const std::uint64_t sum_after = thrust::transform_reduce(
        keys.begin(), keys.end(), Widen{}, std::uint64_t{0}, thrust::plus<std::uint64_t>());
    const std::uint32_t max_key = thrust::reduce(keys.begin(), keys.end(), std::uint32_t{0},
                                                 thrust::maximum<std::uint32_t>());
    thrust::host_vector<std::uint32_t> host = keys;

    std::uint64_t host_sum = 0;
    bool sorted = true;
    for (std::size_t i = 0; i < n; ++i) {
      host_sum += host[i];
      if (i && host[i - 1] > host[i]) sorted = false;
    }
    // The keys are a pure function of (a, i): check the multiset too, by the host's own sum.
    std::uint64_t expect_sum = 0;
    const KeyOf key{static_cast<std::uint64_t>(a) * 7919u};
    for (std::size_t i = 0; i < n; ++i) expect_sum += key(i);
    if (!sorted || host_sum != expect_sum || sum_before != expect_sum || sum_after != expect_sum ||
        max_key != host[n - 1]) {
      std::printf(
          "FAIL: array %d (%zu elements): sorted %d, sums %llu/%llu/%llu expected %llu, "
          "max %u vs %u\n",
          a, n, sorted, (unsigned long long)host_sum, (unsigned long long)sum_before,
          (unsigned long long)sum_after, (unsigned long long)expect_sum, max_key, host[n - 1]);
      ++failures;
    }

    // 2. CUB: radix sort of 64-bit keys, temporary storage from cudaMalloc (the usual pattern:
    // query the size, cudaMalloc, run, cudaFree), then a CUB reduction the same way.
    std::uint64_t *in = nullptr, *out = nullptr, *dsum = nullptr;
    CHECK(cudaMalloc(&in, n * sizeof *in));
    CHECK(cudaMalloc(&out, n * sizeof *out));
    CHECK(cudaMalloc(&dsum, sizeof *dsum));
    {
      thrust::device_ptr<std::uint64_t> p(in);
      thrust::tabulate(p, p + n, WideKeyOf{static_cast<std::uint64_t>(a) << 32});
    }
    std::size_t temp_bytes = 0;
    CHECK(cub::DeviceRadixSort::SortKeys(nullptr, temp_bytes, in, out, static_cast<int>(n)));
    void* temp = nullptr;
    CHECK(cudaMalloc(&temp, temp_bytes));
    CHECK(cub::DeviceRadixSort::SortKeys(temp, temp_bytes, in, out, static_cast<int>(n)));
    CHECK(cudaFree(temp));
    std::size_t reduce_bytes = 0;
    CHECK(cub::DeviceReduce::Sum(nullptr, reduce_bytes, out, dsum, static_cast<int>(n)));
    CHECK(cudaMalloc(&temp, reduce_bytes));
    CHECK(cub::DeviceReduce::Sum(temp, reduce_bytes, out, dsum, static_cast<int>(n)));
    CHECK(cudaFree(temp));

    std::vector<std::uint64_t> wide(n);
    std::uint64_t gpu_sum = 0;
    CHECK(cudaMemcpy(wide.data(), out, n * sizeof *out, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&gpu_sum, dsum, sizeof gpu_sum, cudaMemcpyDeviceToHost));
    CHECK(cudaFree(in));
    CHECK(cudaFree(out));
    CHECK(cudaFree(dsum));

    std::vector<std::uint64_t> ref(n);
    const WideKeyOf wkey{static_cast<std::uint64_t>(a) << 32};
    std::uint64_t ref_sum = 0;  // wraps modulo 2^64, as the device sum does
    for (std::size_t i = 0; i < n; ++i) ref_sum += (ref[i] = wkey(i));
    std::sort(ref.begin(), ref.end());
    if (ref != wide || gpu_sum != ref_sum) {
      std::printf("FAIL: array %d (%zu elements): CUB radix sort or sum differs from the host's\n",
                  a, n);
      ++failures;
    }

    // The checksum: every sorted key of both sorts, position-weighted through FNV-1a.
    for (std::size_t i = 0; i < n; i += 1 + n / 4096) checksum = fnv(checksum, host[i] ^ wide[i]);
    checksum = fnv(checksum, sum_after);
    checksum = fnv(checksum, gpu_sum);
    bytes_sorted += n * (sizeof(std::uint32_t) + sizeof(std::uint64_t));
  }
  CHECK(cudaDeviceSynchronize());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::printf("arrays: %d (%zu to %zu elements)\n", arrays, smallest, largest);
  std::printf("elements: %llu\n", (unsigned long long)elements);
  std::printf("bytes sorted: %llu\n", (unsigned long long)bytes_sorted);
  std::printf("checksum: 0x%016llx\n", (unsigned long long)checksum);
  std::fprintf(stderr, "thrust_sort: total time %.3f s\n", seconds);
  std::fprintf(stderr, "{\"bench\":\"thrust_sort\",\"arrays\":%d,\"seconds\":%.6f}\n", arrays,
               seconds);
  if (failures) {
    std::printf("FAIL: thrust_sort: %ld arrays did not verify\n", failures);
    return 1;
  }
  std::printf("PASS: thrust_sort\n");
  return 0;
}
