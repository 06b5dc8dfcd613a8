// peer_test: peer access between two GPUs on memory the shim serves (issue #4).
//
//   peer_test runtime   peer access enabled with cudaDeviceEnablePeerAccess (the static runtime
//                       reaches the driver's cuCtxEnablePeerAccess through cuGetProcAddress)
//   peer_test driver    peer access enabled with cuCtxEnablePeerAccess, linked with -lcuda
//   ... host          (second argument) the blocks are host memory (the host backend): a pointer
//                       query may call them host memory
//
// Native peer access covers cudaMalloc memory only: VMM mappings need cuMemSetAccess and pool
// memory cuMemPoolSetAccess for every device that touches them, so a pooling backend must extend
// what the program enabled to its own regions and pools. A block the peer cannot reach faults the
// kernel (cudaErrorIllegalAddress): the test fails at the step that says which.
//
// The order covers each way access can be granted:
//   1. device 0 gets blocks (256 B, 1 MiB, 64 MiB): its region or pool exists before peer access;
//   2. device 1 is given access to device 0, device 0 access to device 1: device 1 has nothing
//      allocated yet, so its region or pool is made after the grant;
//   3. device 0 gets more blocks, on memory mapped after the grant, and device 1 its first ones;
//   4. kernels on each device write patterns into the other's blocks and read them back on both,
//      cudaMemcpyPeer copies blocks both ways; cudaPointerGetAttributes names each block's device;
//   5. everything but the first 256-byte and 1 MiB blocks is freed and larger blocks take its place
//      (cached memory reused, chunks remapped elsewhere), and step 4 runs again.
// Prints "allocations: N" / "frees: N" for the GPU harness and nothing that differs between runs,
// so a native run prints the same. Exit status: 0 pass, 1 fail, 77 fewer than two GPUs with peer
// access, or no GPU/driver.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gpu_common.h"

namespace {

using gpu_test::check_words;
using gpu_test::fill_words;
using gpu_test::kMiB;
using gpu_test::step;  // named in every failure: which access path broke
int allocations = 0, frees = 0, failures = 0;
bool host_backed = false;  // "host" argument: blocks are host memory mapped into the devices

struct Buf {
  void* p;
  std::size_t bytes;
  int device;
};

Buf alloc(int device, std::size_t bytes) {
  CHECK(cudaSetDevice(device));
  void* p = nullptr;
  CHECK(cudaMalloc(&p, bytes));
  ++allocations;
  return {p, bytes, device};
}

void release(const Buf& b) {
  CHECK(cudaSetDevice(b.device));
  CHECK(cudaFree(b.p));
  ++frees;
}

// A word on each device for the check kernels' mismatch counts.
unsigned long long* counter[2] = {};

// Writes the pattern into `b` from a kernel on `on` (local or across the link).
void fill_from(int on, const Buf& b, std::uint32_t seed) {
  CHECK(cudaSetDevice(on));
  fill_words<<<264, 256>>>(static_cast<std::uint32_t*>(b.p), b.bytes / 4, seed);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
}

// Mismatching words of `b` as a kernel on `on` reads them.
unsigned long long bad_from(int on, const Buf& b, std::uint32_t seed) {
  CHECK(cudaSetDevice(on));
  // Right after the grant device 1 has no memory yet (so that its region or pool is made after
  // it): its kernel counts into device 0's word, across the link. Zeroed and read with copies,
  // which find the word's device by its address.
  unsigned long long* const c = counter[on] ? counter[on] : counter[1 - on];
  const unsigned long long zero = 0;
  CHECK(cudaMemcpy(c, &zero, sizeof zero, cudaMemcpyHostToDevice));
  check_words<<<264, 256>>>(static_cast<const std::uint32_t*>(b.p), b.bytes / 4, seed, c);
  CHECK(cudaGetLastError());
  unsigned long long host = 0;
  CHECK(cudaMemcpy(&host, c, sizeof host, cudaMemcpyDeviceToHost));
  return host;
}

void expect_pattern(int on, const Buf& b, std::uint32_t seed, const char* what) {
  const unsigned long long n = bad_from(on, b, seed);
  if (n != 0) {
    std::printf(
        "FAIL: %s: %zu-byte block of device %d read on device %d after %s: %llu of %zu "
        "words wrong\n",
        step, b.bytes, b.device, on, what, n, b.bytes / 4);
    ++failures;
  }
}

// The other device writes, both read; then the owner writes and the other reads.
void cross_check(const Buf& b, std::uint32_t seed) {
  const int other = 1 - b.device;
  fill_from(other, b, seed);
  expect_pattern(b.device, b, seed, "a remote write");
  expect_pattern(other, b, seed, "a remote write");
  fill_from(b.device, b, seed ^ 0x5a5a5a5au);
  expect_pattern(other, b, seed ^ 0x5a5a5a5au, "a local write");
}

// a (device 0) -> b (device 1) and back, each verified on the receiving device.
void copy_check(const Buf& a, const Buf& b, std::uint32_t seed) {
  fill_from(a.device, a, seed);
  CHECK(cudaMemcpyPeer(b.p, b.device, a.p, a.device, a.bytes));
  CHECK(cudaDeviceSynchronize());
  expect_pattern(b.device, b, seed, "cudaMemcpyPeer");
  fill_from(b.device, b, seed + 1);
  CHECK(cudaMemcpyPeer(a.p, a.device, b.p, b.device, a.bytes));
  CHECK(cudaDeviceSynchronize());
  expect_pattern(a.device, a, seed + 1, "cudaMemcpyPeer");
}

void check_attributes(const Buf& b) {
  cudaPointerAttributes attr;
  std::memset(&attr, 0, sizeof attr);
  CHECK(cudaPointerGetAttributes(&attr, b.p));
  // Managed memory reports the device current at allocation, as device memory reports its own.
  // Host-backed memory (`host_backed`: the host backend serves cudaMalloc) is what the driver says
  // it is, pinned host memory, whose device field means nothing (docs/oversubscription.md).
  const bool typed = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  const bool host = host_backed && attr.type == cudaMemoryTypeHost;
  if (!host && (attr.device != b.device || !typed)) {
    std::printf(
        "FAIL: %s: cudaPointerGetAttributes of a %zu-byte block of device %d: device %d, "
        "type %d\n",
        step, b.bytes, b.device, attr.device, static_cast<int>(attr.type));
    ++failures;
  }
}

// `from` gets access to `to`'s memory.
void enable_peer(int from, int to, bool driver_api) {
  CHECK(cudaSetDevice(from));
  if (!driver_api) {
    CHECK(cudaDeviceEnablePeerAccess(to, 0));
    return;
  }
  CHECK(cudaFree(nullptr));  // the runtime's primary context is current on this thread
  CUdevice dev = 0;
  CUcontext peer = nullptr;
  CU_CHECK(cuDeviceGet(&dev, to));
  CU_CHECK(cuDevicePrimaryCtxRetain(&peer, dev));  // the runtime's context of `to`, kept to the end
  CU_CHECK(cuCtxEnablePeerAccess(peer, 0));
}

void check_all(const std::vector<Buf>& on0, const std::vector<Buf>& on1, std::uint32_t round) {
  for (const Buf& b : on0) check_attributes(b);
  for (const Buf& b : on1) check_attributes(b);
  std::uint32_t seed = round << 16;
  for (const Buf& b : on0) cross_check(b, ++seed);
  for (const Buf& b : on1) cross_check(b, ++seed);
  // Pairs of equal size across the devices.
  for (const Buf& a : on0)
    for (const Buf& b : on1)
      if (a.bytes == b.bytes) copy_check(a, b, seed += 2);
}

}  // namespace

int main(int argc, char** argv) {
  step = "start";
  const bool driver_api = argc > 1 && std::strcmp(argv[1], "driver") == 0;
  host_backed = argc > 2 && std::strcmp(argv[2], "host") == 0;
  if ((argc > 1 && !driver_api && std::strcmp(argv[1], "runtime") != 0) ||
      (argc > 2 && !host_backed)) {
    std::printf("usage: %s [runtime|driver [host]]\n", argv[0]);
    return 2;
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no GPU/driver: %s\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "no device");
    return 77;
  }
  if (count < 2) {
    std::printf("SKIPPED: peer access needs two GPUs, this machine has %d\n", count);
    return 77;
  }
  int one_to_zero = 0, zero_to_one = 0;
  CHECK(cudaDeviceCanAccessPeer(&one_to_zero, 1, 0));
  CHECK(cudaDeviceCanAccessPeer(&zero_to_one, 0, 1));
  if (!one_to_zero || !zero_to_one) {
    std::printf("SKIPPED: devices 0 and 1 cannot access each other's memory (1->0 %d, 0->1 %d)\n",
                one_to_zero, zero_to_one);
    return 77;
  }
  const std::size_t sizes[] = {256, 1 * kMiB, 64 * kMiB};

  step = "blocks of device 0 made before peer access";
  std::vector<Buf> on0, on1;
  for (std::size_t s : sizes) on0.push_back(alloc(0, s));
  counter[0] = static_cast<unsigned long long*>(alloc(0, sizeof(unsigned long long)).p);
  for (std::size_t i = 0; i < on0.size(); ++i)
    fill_from(0, on0[i], 0x100u + static_cast<unsigned>(i));

  step = driver_api ? "cuCtxEnablePeerAccess" : "cudaDeviceEnablePeerAccess";
  enable_peer(1, 0, driver_api);  // device 0's memory exists already
  enable_peer(0, 1, driver_api);  // device 1 has none yet

  step = "the blocks made before, read on device 1 right after the grant";
  for (std::size_t i = 0; i < on0.size(); ++i)
    expect_pattern(1, on0[i], 0x100u + static_cast<unsigned>(i), "a local write before the grant");

  step = "blocks made after peer access";
  for (std::size_t s : sizes) on0.push_back(alloc(0, s));
  for (std::size_t s : sizes) on1.push_back(alloc(1, s));
  counter[1] = static_cast<unsigned long long*>(alloc(1, sizeof(unsigned long long)).p);
  check_all(on0, on1, 1);

  step = "blocks reallocated after frees";
  // Keep the first 256 B and 1 MiB of device 0 (live next to the new ones); the rest goes back
  // and larger blocks take its place: cached memory and chunks remapped at new addresses.
  std::vector<Buf> kept0(on0.begin(), on0.begin() + 2);
  for (std::size_t i = 2; i < on0.size(); ++i) release(on0[i]);
  for (const Buf& b : on1) release(b);
  on0 = kept0;
  on1.clear();
  for (std::size_t s : {std::size_t{256}, 1 * kMiB, 96 * kMiB, 160 * kMiB}) {
    on0.push_back(alloc(0, s));
    on1.push_back(alloc(1, s));
  }
  check_all(on0, on1, 2);

  step = "frees";
  for (const Buf& b : on0) release(b);
  for (const Buf& b : on1) release(b);
  for (int d = 0; d < 2; ++d) release({counter[d], sizeof(unsigned long long), d});
  for (int d = 0; d < 2; ++d) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaDeviceSynchronize());
  }

  std::printf("peer access enabled through %s\n",
              driver_api ? "cuCtxEnablePeerAccess" : "cudaDeviceEnablePeerAccess");
  std::printf("allocations: %d\nfrees: %d\n", allocations, frees);
  if (failures != 0) {
    std::printf("summary: %d checks failed\n", failures);
    return 1;
  }
  std::printf(
      "summary: every block read and written across devices 0 and 1, before and after reuse\n");
  return 0;
}
