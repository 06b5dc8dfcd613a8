// What moving memory between device and host at the same address costs, step by step
// (docs/design/oversubscription.md, "What a move costs"). Natively, no shim: one VA range of TOTAL bytes
// mapped in pieces of PIECE, every word written by a kernel, then moved to host pieces made
// beforehand (a demotion whose host memory comes from the reserve) and back to device pieces made
// on the way (a promotion), twice, verified by a kernel after every move, with each sequence:
//
//   serial   the spill target's sequence until this benchmark (one piece at a time): map the new
//            piece at a scratch range, grant access, cuMemcpyDtoD, cuCtxSynchronize, unmap the
//            scratch, unmap the old piece, map the new one, grant access;
//   batched  pieces in batches of up to BATCH bytes: each new piece mapped at its own slot of a
//            scratch range, one grant over the slots, every copy issued, one cuCtxSynchronize, then
//            every old piece unmapped and every new one mapped, one grant over the range, the slots
//            unmapped;
//   ranges   batched, with each run of old pieces and the scratch slots unmapped by one call each
//            (whether the driver takes a range over several mappings, and what it saves);
//   swap     one piece at a time; a demotion maps the old (device) piece at the scratch range
//            instead, remaps the address to the new host piece and copies from the scratch, so
//            host memory is mapped and granted once, not twice (a promotion as serial).
//   pipelined  swap with the copy queued on a stream (cuMemcpyDtoDAsync) and waited for only once
//            the next piece is remapped, two halves of the scratch range in turn; each old device
//            piece released once its copy is done, as the spill target does (a promotion as serial).
//
//   move_bench [TOTAL [BATCH]]   (defaults 2GiB 512MiB)
//
// Output: per case a line "move dir=D piece=P seq=S gbps=G ms=T" with the time per step, then a
// table. Exit 0, 1 on a driver error or a bad word, 77 without a GPU.
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "oversub_common.h"

using namespace oversub;

namespace {

using Clock = std::chrono::steady_clock;

// Time spent in each step of a sequence, summed over the pieces.
enum Step {
  kCreate,
  kMapScratch,
  kAccessScratch,
  kCopy,
  kSync,
  kUnmapScratch,
  kUnmapOld,
  kMapNew,
  kAccessNew,
  kRelease,
  kSteps
};
const char* const kStepNames[kSteps] = {"create",     "map_scratch",   "access_scratch", "copy",
                                        "sync",       "unmap_scratch", "unmap_old",      "map_new",
                                        "access_new", "release"};

struct Timer {
  double ms[kSteps] = {};
  Clock::time_point t = Clock::now();
  void lap(Step s) {
    const auto now = Clock::now();
    ms[s] += std::chrono::duration<double, std::milli>(now - t).count();
    t = now;
  }
};

struct Setup {
  CUdevice dev;
  CUmemAllocationProp device_prop{}, host_prop{};
  CUmemAccessDesc access{};
};

CUmemGenericAllocationHandle create(const CUmemAllocationProp& prop, std::size_t bytes) {
  CUmemGenericAllocationHandle h;
  CU(cuMemCreate(&h, bytes, &prop, 0));
  return h;
}

// Moves every piece of [base, base + n * piece) from `from` to new memory: `to` holds the new
// handles already made (a reserve) or is empty (made on the way with `make`). Returns the old ones.
std::vector<CUmemGenericAllocationHandle> move_all(
    const Setup& s, CUdeviceptr base, CUdeviceptr scratch, std::size_t piece,
    std::vector<CUmemGenericAllocationHandle> to, const CUmemAllocationProp& make, int seq,
    std::size_t batch, std::vector<CUmemGenericAllocationHandle>& from, Timer& t) {
  const std::size_t n = from.size();
  const bool creating = to.empty();
  CU(cuCtxSynchronize());
  t.lap(kSync);
  std::vector<CUmemGenericAllocationHandle> old(n);
  // A swap demotion's mappings for piece i: its old device piece at `at_scratch` too, its address
  // remapped to the new host piece; the copy from `at_scratch` is the caller's.
  const auto swap_map = [&](std::size_t i, CUdeviceptr at_scratch) {
    const CUdeviceptr at = base + i * piece;
    CU(cuMemMap(at_scratch, piece, 0, from[i], 0));
    t.lap(kMapScratch);
    CU(cuMemSetAccess(at_scratch, piece, &s.access, 1));
    t.lap(kAccessScratch);
    CU(cuMemUnmap(at, piece));
    t.lap(kUnmapOld);
    CU(cuMemMap(at, piece, 0, to[i], 0));
    t.lap(kMapNew);
    CU(cuMemSetAccess(at, piece, &s.access, 1));
    t.lap(kAccessNew);
  };
  if ((seq == 4 || seq == 5) && !creating) {
    // Case 5: the copies queued in a context of their own (whether a grant waits for them there).
    CUcontext mine = nullptr, other = nullptr;
    CU(cuCtxGetCurrent(&mine));
    if (seq == 5) {
      CU(cuCtxCreate(&other, nullptr, 0, s.dev));
      CU(cuCtxSetCurrent(mine));
    }
    const auto in_copy_ctx = [&](auto&& fn) {
      if (other != nullptr) CU(cuCtxSetCurrent(other));
      fn();
      if (other != nullptr) CU(cuCtxSetCurrent(mine));
    };
    CUstream stream = nullptr;
    in_copy_ctx([&] { CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING)); });
    // Waits for the copy of piece i, then unmaps its scratch half and releases its old piece.
    const auto land = [&](std::size_t i) {
      in_copy_ctx([&] { CU(cuStreamSynchronize(stream)); });
      t.lap(kSync);
      CU(cuMemUnmap(scratch + (i % 2) * piece, piece));
      t.lap(kUnmapScratch);
      CU(cuMemRelease(from[i]));
      t.lap(kRelease);
      from[i] = to[i];
    };
    for (std::size_t i = 0; i < n; ++i) {
      const CUdeviceptr at = base + i * piece;
      const CUdeviceptr half = scratch + (i % 2) * piece;
      swap_map(i, half);
      if (i > 0) land(i - 1);
      in_copy_ctx([&] { CU(cuMemcpyDtoDAsync(at, half, piece, stream)); });
      t.lap(kCopy);
    }
    if (n > 0) land(n - 1);
    in_copy_ctx([&] { CU(cuStreamDestroy(stream)); });
    if (other != nullptr) CU(cuCtxDestroy(other));
    return old;  // released already: all zero
  }
  if (seq == 3 && !creating) {
    for (std::size_t i = 0; i < n; ++i) {
      const CUdeviceptr at = base + i * piece;
      swap_map(i, scratch);
      CU(cuMemcpyDtoD(at, scratch, piece));
      t.lap(kCopy);
      CU(cuCtxSynchronize());
      t.lap(kSync);
      CU(cuMemUnmap(scratch, piece));
      t.lap(kUnmapScratch);
      old[i] = from[i];
      from[i] = to[i];
    }
    return old;
  }
  if (seq == 0 || seq >= 3) {
    for (std::size_t i = 0; i < n; ++i) {
      const CUdeviceptr at = base + i * piece;
      CUmemGenericAllocationHandle fresh = creating ? create(make, piece) : to[i];
      t.lap(kCreate);
      CU(cuMemMap(scratch, piece, 0, fresh, 0));
      t.lap(kMapScratch);
      CU(cuMemSetAccess(scratch, piece, &s.access, 1));
      t.lap(kAccessScratch);
      CU(cuMemcpyDtoD(scratch, at, piece));
      t.lap(kCopy);
      CU(cuCtxSynchronize());
      t.lap(kSync);
      CU(cuMemUnmap(scratch, piece));
      t.lap(kUnmapScratch);
      CU(cuMemUnmap(at, piece));
      t.lap(kUnmapOld);
      CU(cuMemMap(at, piece, 0, fresh, 0));
      t.lap(kMapNew);
      CU(cuMemSetAccess(at, piece, &s.access, 1));
      t.lap(kAccessNew);
      old[i] = from[i];
      from[i] = fresh;
    }
    return old;
  }
  const std::size_t per = std::max<std::size_t>(1, batch / piece);
  std::vector<CUmemGenericAllocationHandle> fresh(per);
  for (std::size_t first = 0; first < n; first += per) {
    const std::size_t k = std::min(per, n - first);
    for (std::size_t j = 0; j < k; ++j) {
      fresh[j] = creating ? create(make, piece) : to[first + j];
      t.lap(kCreate);
      CU(cuMemMap(scratch + j * piece, piece, 0, fresh[j], 0));
      t.lap(kMapScratch);
    }
    CU(cuMemSetAccess(scratch, k * piece, &s.access, 1));
    t.lap(kAccessScratch);
    for (std::size_t j = 0; j < k; ++j)
      CU(cuMemcpyDtoD(scratch + j * piece, base + (first + j) * piece, piece));
    t.lap(kCopy);
    CU(cuCtxSynchronize());
    t.lap(kSync);
    bool one_call = seq == 2;
    if (one_call) {
      const CUresult r = cuMemUnmap(base + first * piece, k * piece);
      if (r != CUDA_SUCCESS) {
        std::printf("ranges: cuMemUnmap over %zu mappings refused (%d): one call a piece\n", k,
                    int(r));
        one_call = false;
      }
      t.lap(kUnmapOld);
    }
    for (std::size_t j = 0; j < k; ++j) {
      const CUdeviceptr at = base + (first + j) * piece;
      if (!one_call) CU(cuMemUnmap(at, piece));
      t.lap(kUnmapOld);
      CU(cuMemMap(at, piece, 0, fresh[j], 0));
      t.lap(kMapNew);
    }
    CU(cuMemSetAccess(base + first * piece, k * piece, &s.access, 1));
    t.lap(kAccessNew);
    if (!one_call || cuMemUnmap(scratch, k * piece) != CUDA_SUCCESS)
      for (std::size_t j = 0; j < k; ++j) CU(cuMemUnmap(scratch + j * piece, piece));
    t.lap(kUnmapScratch);
    for (std::size_t j = 0; j < k; ++j) {
      old[first + j] = from[first + j];
      from[first + j] = fresh[j];
    }
  }
  return old;
}

void verify(CUdeviceptr base, std::size_t bytes, std::uint32_t seed, const char* what) {
  unsigned long long* bad = nullptr;
  CHECK(cudaMallocManaged(&bad, sizeof *bad));
  *bad = 0;
  gpu_test::check_words<<<grid_blocks(), 512>>>(reinterpret_cast<const std::uint32_t*>(base),
                                                bytes / 4, seed, bad);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  const unsigned long long n = *bad;
  CHECK(cudaFree(bad));
  EXPECT(n == 0, "%s: %llu bad words", what, n);
}

struct Case {
  std::size_t piece;
  int seq;  // 0 serial, 1 batched, 2 ranges, 3 swap, 4 pipelined, 5 pipelined, copies in a context of their own
};
const char* const kSeqNames[] = {"serial", "batched",   "ranges",
                                 "swap",   "pipelined", "pipelined-ctx"};

}  // namespace

int main(int argc, char** argv) {
  require_gpu();
  const std::size_t total = argc > 1 ? parse_size(argv[1]) : 2 * kGiB;
  const std::size_t batch = argc > 2 ? parse_size(argv[2]) : 512 * kMiB;
  EXPECT(total >= 64 * kMiB && total % (64 * kMiB) == 0, "TOTAL must be a multiple of 64MiB");
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  Setup s;
  CU(cuCtxGetDevice(&s.dev));
  int numa = 0;
  if (cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, s.dev) != CUDA_SUCCESS ||
      numa < 0)
    numa = 0;
  s.device_prop.type = s.host_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  s.device_prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, s.dev};
  // MOVE_BENCH_HOST=host: host pieces located at CU_MEM_LOCATION_TYPE_HOST rather than the GPU's
  // NUMA node (whether granting access to them costs the same).
  const char* where = std::getenv("MOVE_BENCH_HOST");
  const bool plain_host = where != nullptr && std::string(where) == "host";
  s.host_prop.location = plain_host ? CUmemLocation{CU_MEM_LOCATION_TYPE_HOST, 0}
                                    : CUmemLocation{CU_MEM_LOCATION_TYPE_HOST_NUMA, numa};
  s.access.location = {CU_MEM_LOCATION_TYPE_DEVICE, s.dev};
  s.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

  CUdeviceptr base = 0, scratch = 0;
  CU(cuMemAddressReserve(&base, total, 0, 0, 0));
  CU(cuMemAddressReserve(&scratch, std::max(batch, 128 * kMiB), 0, 0, 0));
  std::printf("move_bench: %zu MiB per case, batches of %zu MiB, host pieces at %s %d\n",
              total >> 20, batch >> 20, plain_host ? "the host" : "NUMA node", numa);

  struct Row {
    std::string name;
    double gbps[2];
  };
  std::vector<Row> rows;
  std::uint32_t seed = 1;
  for (const Case c :
       {Case{64 * kMiB, 0}, Case{64 * kMiB, 3}, Case{64 * kMiB, 4}, Case{64 * kMiB, 5},
        Case{64 * kMiB, 1}, Case{64 * kMiB, 2}, Case{2 * kMiB, 0}, Case{2 * kMiB, 3},
        Case{2 * kMiB, 1}, Case{2 * kMiB, 2}}) {
    const std::size_t bytes = c.piece == 2 * kMiB ? std::min(total, 512 * kMiB) : total;
    const std::size_t n = bytes / c.piece;
    std::vector<CUmemGenericAllocationHandle> on_dev(n), reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      on_dev[i] = create(s.device_prop, c.piece);
      CU(cuMemMap(base + i * c.piece, c.piece, 0, on_dev[i], 0));
      reserve[i] = create(s.host_prop, c.piece);  // pinned ahead: the reserve's pieces
    }
    CU(cuMemSetAccess(base, bytes, &s.access, 1));
    fill(reinterpret_cast<void*>(base), bytes, ++seed);
    CHECK(cudaDeviceSynchronize());
    const char* seq = kSeqNames[c.seq];
    double gbps[2] = {};
    for (int round = 0; round < 2; ++round) {
      for (int dir = 0; dir < 2; ++dir) {  // 0: demote into the reserve, 1: promote, creating
        Timer t;
        const auto t0 = Clock::now();
        std::vector<CUmemGenericAllocationHandle> old =
            move_all(s, base, scratch, c.piece,
                     dir == 0 ? reserve : std::vector<CUmemGenericAllocationHandle>{},
                     s.device_prop, c.seq, batch, on_dev, t);
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        verify(base, bytes, seed, dir == 0 ? "after demotion" : "after promotion");
        if (dir == 0) {
          reserve.clear();
          for (auto h : old)
            if (h != 0) CU(cuMemRelease(h));  // the old device pieces, unless released on the way
        } else {
          reserve = old;  // the host pieces, kept for the next demotion
        }
        gbps[dir] = double(bytes) / ms / 1e6;
        std::printf("move dir=%s piece=%zuMiB seq=%s round=%d gbps=%.2f ms=%.1f",
                    dir == 0 ? "demote" : "promote", c.piece >> 20, seq, round, gbps[dir], ms);
        for (int k = 0; k < kSteps; ++k) std::printf(" %s=%.1f", kStepNames[k], t.ms[k]);
        std::printf("\n");
        std::fflush(stdout);
      }
    }
    rows.push_back({std::to_string(c.piece >> 20) + " MiB pieces, " + seq, {gbps[0], gbps[1]}});
    for (std::size_t i = 0; i < n; ++i) {
      CU(cuMemUnmap(base + i * c.piece, c.piece));
      CU(cuMemRelease(on_dev[i]));
      CU(cuMemRelease(reserve[i]));
    }
  }
  // The copy alone, for the bound: device to host-located VMM memory and back, one call each.
  {
    const std::size_t bytes = std::min(total, kGiB);
    CUdeviceptr a = 0, b = 0;
    CU(cuMemAddressReserve(&a, bytes, 0, 0, 0));
    CU(cuMemAddressReserve(&b, bytes, 0, 0, 0));
    auto ha = create(s.device_prop, bytes), hb = create(s.host_prop, bytes);
    CU(cuMemMap(a, bytes, 0, ha, 0));
    CU(cuMemMap(b, bytes, 0, hb, 0));
    CU(cuMemSetAccess(a, bytes, &s.access, 1));
    CU(cuMemSetAccess(b, bytes, &s.access, 1));
    double ms[2];
    for (int dir = 0; dir < 2; ++dir) {
      CU(cuCtxSynchronize());
      const auto t0 = Clock::now();
      CU(dir == 0 ? cuMemcpyDtoD(b, a, bytes) : cuMemcpyDtoD(a, b, bytes));
      CU(cuCtxSynchronize());
      ms[dir] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    }
    std::printf("copy only: device->host %.1f GB/s, host->device %.1f GB/s (%zu MiB)\n",
                bytes / ms[0] / 1e6, bytes / ms[1] / 1e6, bytes >> 20);
    rows.push_back({"copy alone (one cuMemcpyDtoD)", {bytes / ms[0] / 1e6, bytes / ms[1] / 1e6}});
    CU(cuMemUnmap(a, bytes));
    CU(cuMemUnmap(b, bytes));
    CU(cuMemRelease(ha));
    CU(cuMemRelease(hb));
    CU(cuMemAddressFree(a, bytes));
    CU(cuMemAddressFree(b, bytes));
  }
  CU(cuMemAddressFree(scratch, std::max(batch, 128 * kMiB)));
  CU(cuMemAddressFree(base, total));
  std::printf(
      "\n| sequence | demote GB/s (host piece ready) | promote GB/s (device piece made) |\n|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %.2f | %.2f |\n", r.name.c_str(), r.gbps[0], r.gbps[1]);
  return 0;
}
