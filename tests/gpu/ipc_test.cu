// ipc_test: CUDA IPC of memory the shim serves, between real processes on a GPU (docs/ipc.md).
//
//   ipc_test pair       the parent exports a block that does not start its backend's chunk (a
//                       second block beside a first), a child (exec'd, under the shim as well)
//                       opens it, checks the parent's bytes and writes its own; interprocess events
//                       order the work both ways; the parent checks the child's bytes and that the
//                       first block is untouched.
//   ipc_test many [N]   N importers (default 8) at once, each checks and rewrites its own slice.
//   ipc_test orphan     a child exports two blocks and frees one while the parent has it open, then
//                       exits; the parent's mapping must stay valid (read, write, read), and
//                       opening the other handle after the exporter is gone must fail cleanly.
//   ipc_test no-shim    an importer without the shim gets an error (not a crash, not a mapping)
//                       for a shim handle. SKIPPED when the handle is a native one.
// Prints "allocations: N" / "frees: N" (the parent's own) for the GPU harness. Exit status: 0 pass,
// 1 fail, 77 no GPU/driver (or nothing to test).
#include "ipc_common.h"

#include <thread>

using namespace ipc_gpu;

namespace {

constexpr std::size_t kFirst = 1u << 20;          // the first block: 1 MiB
constexpr std::size_t kBlock = (1u << 20) + 512;  // the exported one, right after it
constexpr unsigned kSeedFirst = 0x11, kSeedParent = 0x22, kSeedChild = 0x33;

// Byte i of a pattern is seed + (base + i) * 7: `base` lets a slice be checked against the pattern
// of the whole block it lies in.
__global__ void fill_kernel(unsigned char* p, std::size_t n, unsigned seed) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    p[i] = static_cast<unsigned char>(seed + i * 7);
}

__global__ void check_kernel(const unsigned char* p, std::size_t n, unsigned seed, std::size_t base,
                             unsigned long long* bad) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    if (p[i] != static_cast<unsigned char>(seed + (base + i) * 7)) atomicAdd(bad, 1ull);
}

void fill(void* p, std::size_t n, unsigned seed, cudaStream_t s) {
  fill_kernel<<<256, 256, 0, s>>>(static_cast<unsigned char*>(p), n, seed);
  CHECK(cudaGetLastError());
}

// Mismatches of [p, p + n) against `seed`, counted on `s` (synchronized).
unsigned long long count_bad(const void* p, std::size_t n, unsigned seed, cudaStream_t s,
                             unsigned long long* bad) {
  CHECK(cudaMemsetAsync(bad, 0, sizeof *bad, s));
  check_kernel<<<256, 256, 0, s>>>(static_cast<const unsigned char*>(p), n, seed, 0, bad);
  CHECK(cudaGetLastError());
  unsigned long long host = 0;
  CHECK(cudaMemcpyAsync(&host, bad, sizeof host, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  return host;
}

cudaEvent_t ipc_event() {
  cudaEvent_t e;
  CHECK(cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming));
  return e;
}

// ---- pair and many: the parent exports, children import ----------------------------------------

// Child of `pair` / `many`: opens the block and the two events, waits for the parent's fill
// (event 1), checks and rewrites [offset, offset + bytes) of the block, records event 2, tells the
// parent, and closes once the parent says it is done.
int child_import(char** argv) {
  const auto mem = from_hex<cudaIpcMemHandle_t>(argv[0]);
  const auto ready = from_hex<cudaIpcEventHandle_t>(argv[1]);
  const auto done = from_hex<cudaIpcEventHandle_t>(argv[2]);
  const std::size_t offset = std::strtoull(argv[3], nullptr, 10);
  const std::size_t bytes = std::strtoull(argv[4], nullptr, 10);
  const unsigned seed = static_cast<unsigned>(std::strtoul(argv[5], nullptr, 10));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned long long* bad;
  CHECK(cudaMalloc(&bad, sizeof *bad));
  void* p = nullptr;
  CHECK(cudaIpcOpenMemHandle(&p, mem, cudaIpcMemLazyEnablePeerAccess));
  cudaEvent_t e_ready, e_done;
  CHECK(cudaIpcOpenEventHandle(&e_ready, ready));
  CHECK(cudaIpcOpenEventHandle(&e_done, done));
  CHECK(cudaStreamWaitEvent(s, e_ready, 0));
  // The parent's pattern counts from the block's start, so a mapping at the wrong offset shows.
  // Only our slice is checked: other importers may be rewriting theirs.
  unsigned char* mine = static_cast<unsigned char*>(p) + offset;
  CHECK(cudaMemsetAsync(bad, 0, sizeof *bad, s));
  check_kernel<<<256, 256, 0, s>>>(mine, bytes, kSeedParent, offset, bad);
  CHECK(cudaGetLastError());
  // Our slice gets a pattern of its own, counted from the slice's start.
  fill(mine, bytes, seed, s);
  CHECK(cudaEventRecord(e_done, s));
  to_parent('R');
  unsigned long long host = 0;
  CHECK(cudaMemcpyAsync(&host, bad, sizeof host, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(from_parent() == 'D', "parent did not finish");
  CHECK(cudaIpcCloseMemHandle(p));
  CHECK(cudaFree(bad));
  std::printf("child %d: slice at %zu: %llu bytes differed from the parent's pattern\n",
              static_cast<int>(getpid()), offset, host);
  return host == 0 ? 0 : 3;
}

int run_import(int importers) {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned char *first, *block;
  unsigned long long* bad;
  const std::size_t slice = kBlock / importers / 256 * 256;
  CHECK(cudaMalloc(&first, kFirst));
  CHECK(cudaMalloc(&block, kBlock));
  CHECK(cudaMalloc(&bad, sizeof *bad));
  fill(first, kFirst, kSeedFirst, s);
  fill(block, kBlock, kSeedParent, s);
  cudaEvent_t ready = ipc_event();
  std::vector<cudaEvent_t> done(importers);
  for (auto& e : done) e = ipc_event();
  CHECK(cudaEventRecord(ready, s));
  cudaIpcMemHandle_t mem;
  CHECK(cudaIpcGetMemHandle(&mem, block));
  cudaIpcEventHandle_t ready_h;
  CHECK(cudaIpcGetEventHandle(&ready_h, ready));
  std::printf("block %p after %p; handle %.16s...\n", static_cast<void*>(block),
              static_cast<void*>(first), to_hex(mem).c_str());

  std::vector<Child> children;
  for (int i = 0; i < importers; ++i) {
    cudaIpcEventHandle_t done_h;
    CHECK(cudaIpcGetEventHandle(&done_h, done[i]));
    children.push_back(
        spawn({"child-import", to_hex(mem), to_hex(ready_h), to_hex(done_h),
               std::to_string(i * slice), std::to_string(slice), std::to_string(kSeedChild + i)}));
  }
  for (Child& c : children) EXPECT(c.recv() == 'R', "child %d did not report", c.pid);
  for (int i = 0; i < importers; ++i) CHECK(cudaStreamWaitEvent(s, done[i], 0));
  unsigned long long wrong = 0;
  for (int i = 0; i < importers; ++i) {
    const unsigned long long b = count_bad(block + i * slice, slice, kSeedChild + i, s, bad);
    if (b != 0) std::printf("slice %d: %llu bytes are not the child's\n", i, b);
    wrong += b;
  }
  const unsigned long long first_bad = count_bad(first, kFirst, kSeedFirst, s, bad);
  for (Child& c : children) c.send('D');
  int failed_children = 0;
  for (Child& c : children) failed_children += c.wait() != 0;
  for (cudaEvent_t e : done) CHECK(cudaEventDestroy(e));
  CHECK(cudaEventDestroy(ready));
  CHECK(cudaFree(bad));
  CHECK(cudaFree(block));
  CHECK(cudaFree(first));
  std::printf("allocations: 3\nfrees: 3\n");
  std::printf("summary: %d importer(s), %llu wrong bytes, first block %s, %d child failure(s)\n",
              importers, wrong, first_bad == 0 ? "intact" : "CHANGED", failed_children);
  return wrong == 0 && first_bad == 0 && failed_children == 0 ? 0 : 1;
}

// ---- orphan: the exporter exits while the parent has its memory open ---------------------------

int child_export() {
  unsigned char *first, *kept, *other;
  CHECK(cudaMalloc(&first, kFirst));
  CHECK(cudaMalloc(&kept, kBlock));
  CHECK(cudaMalloc(&other, kBlock));
  fill(kept, kBlock, kSeedParent, nullptr);
  fill(other, kBlock, kSeedFirst, nullptr);
  CHECK(cudaDeviceSynchronize());
  cudaIpcMemHandle_t h1, h2;
  CHECK(cudaIpcGetMemHandle(&h1, kept));
  CHECK(cudaIpcGetMemHandle(&h2, other));
  to_parent(to_hex(h1) + " " + to_hex(h2));
  EXPECT(from_parent() == 'O', "parent did not open");
  // Freed while the parent has it open (the shim keeps it), then the whole process goes.
  CHECK(cudaFree(kept));
  return 0;
}

int run_orphan() {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned long long* bad;
  CHECK(cudaMalloc(&bad, sizeof *bad));
  Child exporter = spawn({"child-export"});
  const std::string line = exporter.recv_line();
  EXPECT(line.size() == 257, "bad handle line from the exporter");
  const auto h1 = from_hex<cudaIpcMemHandle_t>(line.substr(0, 128).c_str());
  const auto h2 = from_hex<cudaIpcMemHandle_t>(line.substr(129, 128).c_str());
  void* p = nullptr;
  CHECK(cudaIpcOpenMemHandle(&p, h1, cudaIpcMemLazyEnablePeerAccess));
  exporter.send('O');
  EXPECT(exporter.wait() == 0, "the exporter failed");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // its teardown is over
  const unsigned long long before = count_bad(p, kBlock, kSeedParent, s, bad);
  fill(p, kBlock, kSeedChild, s);
  const unsigned long long after = count_bad(p, kBlock, kSeedChild, s, bad);
  std::printf("after the exporter exited: %llu bytes changed, %llu after rewriting\n", before,
              after);
  void* q = nullptr;
  const double t0 = now_us();
  const cudaError_t late = cudaIpcOpenMemHandle(&q, h2, cudaIpcMemLazyEnablePeerAccess);
  const double late_us = now_us() - t0;
  std::printf("opening a handle of the exited exporter: %s after %.0f us\n", cudaGetErrorName(late),
              late_us);
  if (late == cudaSuccess) CHECK(cudaIpcCloseMemHandle(q));
  (void)cudaGetLastError();  // the failed open is not sticky; clear it for the checks below
  CHECK(cudaIpcCloseMemHandle(p));
  CHECK(cudaFree(bad));
  std::printf("allocations: 1\nfrees: 1\n");
  const bool ok = before == 0 && after == 0 && late != cudaSuccess && late_us < 5e6;
  std::printf("summary: import %s the exporter's exit, late open %s\n",
              before == 0 && after == 0 ? "outlived" : "DID NOT outlive",
              late != cudaSuccess ? "refused" : "SUCCEEDED");
  return ok ? 0 : 1;
}

// ---- no-shim: an importer without the shim ----------------------------------------------------

int child_open(char** argv) {
  const auto mem = from_hex<cudaIpcMemHandle_t>(argv[0]);
  void* p = nullptr;
  const cudaError_t e = cudaIpcOpenMemHandle(&p, mem, cudaIpcMemLazyEnablePeerAccess);
  std::printf("child without the shim: cudaIpcOpenMemHandle returned %s (%d)\n",
              cudaGetErrorName(e), static_cast<int>(e));
  if (e == cudaSuccess) cudaIpcCloseMemHandle(p);
  return e == cudaSuccess ? 3 : 0;
}

int run_no_shim() {
  unsigned char *first, *block;
  CHECK(cudaMalloc(&first, kFirst));
  CHECK(cudaMalloc(&block, kBlock));
  cudaIpcMemHandle_t mem;
  CHECK(cudaIpcGetMemHandle(&mem, block));
  // A driver handle opens natively anywhere; there is nothing to test then.
  const bool shim_handle = to_hex(mem).rfind("a15c5e1d1cc95e7a", 0) == 0;
  int status = 77;
  if (shim_handle) {
    Child c = spawn({"child-open", to_hex(mem)}, /*without_shim=*/true);
    status = c.wait() == 0 ? 0 : 1;
  }
  CHECK(cudaFree(block));
  CHECK(cudaFree(first));
  std::printf("allocations: 2\nfrees: 2\n");
  if (!shim_handle)
    std::printf("SKIPPED: the handle is the driver's own (native memory)\n");
  else
    std::printf("summary: an importer without the shim %s\n",
                status == 0 ? "was refused" : "WAS NOT refused");
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    std::printf("usage: ipc_test pair | many [N] | orphan | no-shim\n");
    return 1;
  }
  const std::string mode = argv[1];
  if (mode == "child-import" && argc == 8) return child_import(argv + 2);
  if (mode == "child-export") return child_export();
  if (mode == "child-open" && argc == 3) return child_open(argv + 2);
  require_gpu();
  if (mode == "pair") return run_import(1);
  if (mode == "many") return run_import(argc > 2 ? std::atoi(argv[2]) : 8);
  if (mode == "orphan") return run_orphan();
  if (mode == "no-shim") return run_no_shim();
  std::printf("unknown mode %s\n", mode.c_str());
  return 1;
}
