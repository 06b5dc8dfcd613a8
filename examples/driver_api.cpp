// driver_api: a program that uses the CUDA driver API directly and links libcuda (-lcuda), so its
// calls reach the shim through exported symbols rather than through the runtime's resolver.
// It allocates with cuMemAlloc, cuMemAllocPitch and cuMemAllocAsync, checks the data with driver
// copies, and checks the answers of cuMemGetInfo, cuPointerGetAttribute and cuMemGetAddressRange:
// for every allocation the range must start at the pointer the program got and cover what it asked
// for, also when queried through an interior pointer. That is what callers (NCCL, IPC, frameworks)
// rely on; a sub-allocating backend must give the same.
//
// Exit status: 0 pass, 1 failure, 77 no GPU or driver.
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

const char* name_of(CUresult r) {
  const char* name = nullptr;
  return cuGetErrorName(r, &name) == CUDA_SUCCESS && name ? name : "unknown CUresult";
}

#define CHECK(call)                                                                             \
  do {                                                                                          \
    const CUresult err_ = (call);                                                               \
    if (err_ != CUDA_SUCCESS) {                                                                 \
      std::printf("FAIL: %s returned %s at %s:%d\n", #call, name_of(err_), __FILE__, __LINE__); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

int failures = 0;
void expect(bool ok, const char* what, unsigned long long got, unsigned long long want) {
  if (!ok) {
    std::printf("FAIL: %s: got 0x%llx, expected 0x%llx\n", what, got, want);
    ++failures;
  }
}

// The range queries, asked through the base pointer and through an interior one. With `exact`, the
// range must start at `ptr` (what cuMemAlloc gives natively); otherwise it need only cover
// [ptr, ptr + bytes): the driver does not promise which range a pool allocation reports.
void check_range(CUdeviceptr ptr, std::size_t bytes, bool exact) {
  for (const std::size_t offset : {std::size_t{0}, bytes / 2, bytes - 1}) {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    CHECK(cuMemGetAddressRange(&base, &size, ptr + offset));
    if (exact) {
      expect(base == ptr, "cuMemGetAddressRange base", base, ptr);
      expect(size >= bytes, "cuMemGetAddressRange size >= requested", size, bytes);
    } else {
      expect(base <= ptr && base + size >= ptr + bytes, "cuMemGetAddressRange covers the block",
             base, ptr);
    }

    CUdeviceptr start = 0;
    std::size_t range = 0;
    CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr + offset));
    CHECK(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr + offset));
    expect(start == base, "RANGE_START_ADDR == cuMemGetAddressRange base", start, base);
    expect(range == size, "RANGE_SIZE == cuMemGetAddressRange size", range, size);

    unsigned int type = 0;
    CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr + offset));
    expect(type == CU_MEMORYTYPE_DEVICE, "MEMORY_TYPE", type, CU_MEMORYTYPE_DEVICE);
  }
}

// Fills `words` 32-bit words with a value derived from `seed` and reads them back.
void check_data(CUdeviceptr ptr, std::size_t words, unsigned int seed, CUstream stream) {
  std::vector<unsigned int> host(words, 0);
  CHECK(cuMemsetD32Async(ptr, seed, words, stream));
  CHECK(cuMemcpyDtoHAsync(host.data(), ptr, words * sizeof(unsigned int), stream));
  CHECK(cuStreamSynchronize(stream));
  for (std::size_t i = 0; i < words; ++i)
    if (host[i] != seed) {
      expect(false, "data read back", host[i], seed);
      return;
    }
}

}  // namespace

int main() {
  if (const CUresult e = cuInit(0); e != CUDA_SUCCESS) {
    std::printf("SKIPPED: no GPU/driver: cuInit returned %s\n", name_of(e));
    return 77;
  }
  int count = 0;
  if (cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
    std::printf("SKIPPED: no GPU/driver: no device\n");
    return 77;
  }
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CUstream stream = nullptr;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  long allocations = 0, frees = 0;
  std::size_t requested = 0;

  // cuMemAlloc: odd, sub-page, one 2 MiB granule plus a bit.
  std::vector<std::pair<CUdeviceptr, std::size_t>> blocks;
  for (const std::size_t bytes :
       {std::size_t{1000}, std::size_t{1} << 20, (std::size_t{2} << 20) + 12}) {
    CUdeviceptr p = 0;
    CHECK(cuMemAlloc(&p, bytes));
    ++allocations;
    requested += bytes;
    blocks.emplace_back(p, bytes);
  }
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    check_range(blocks[i].first, blocks[i].second, true);
    check_data(blocks[i].first, blocks[i].second / 4, 0xa110c000u + static_cast<unsigned>(i),
               stream);
  }
  // Distinct live blocks must not overlap.
  for (std::size_t i = 0; i < blocks.size(); ++i)
    for (std::size_t j = i + 1; j < blocks.size(); ++j) {
      const bool disjoint = blocks[i].first + blocks[i].second <= blocks[j].first ||
                            blocks[j].first + blocks[j].second <= blocks[i].first;
      expect(disjoint, "live blocks are disjoint", blocks[i].first, blocks[j].first);
    }

  // cuMemAllocPitch: rows of 1000 bytes; a round trip through a 2D copy only survives if
  // pitch >= width, and the range must cover pitch * height.
  {
    const std::size_t width = 1000, height = 37;
    CUdeviceptr p = 0;
    std::size_t pitch = 0;
    CHECK(cuMemAllocPitch(&p, &pitch, width, height, 4));
    ++allocations;
    requested += width * height;
    expect(pitch >= width, "pitch >= width", pitch, width);
    check_range(p, pitch * height, true);
    std::vector<unsigned char> in(width * height), out(width * height, 0);
    for (std::size_t i = 0; i < in.size(); ++i)
      in[i] = static_cast<unsigned char>(i * 7 + i / width);
    CUDA_MEMCPY2D copy = {};
    copy.srcMemoryType = CU_MEMORYTYPE_HOST;
    copy.srcHost = in.data();
    copy.srcPitch = width;
    copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    copy.dstDevice = p;
    copy.dstPitch = pitch;
    copy.WidthInBytes = width;
    copy.Height = height;
    CHECK(cuMemcpy2D(&copy));
    CUDA_MEMCPY2D back = {};
    back.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    back.srcDevice = p;
    back.srcPitch = pitch;
    back.dstMemoryType = CU_MEMORYTYPE_HOST;
    back.dstHost = out.data();
    back.dstPitch = width;
    back.WidthInBytes = width;
    back.Height = height;
    CHECK(cuMemcpy2D(&back));
    expect(in == out, "pitched round trip matches", in == out, 1);
    CHECK(cuMemFree(p));
    ++frees;
  }

  // cuMemAllocAsync / cuMemFreeAsync, ordered on a non-blocking stream.
  int pools = 0;
  CHECK(cuDeviceGetAttribute(&pools, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev));
  if (pools) {
    for (int i = 0; i < 4; ++i) {
      const std::size_t bytes = (std::size_t{256} << 10) * (i + 1);
      CUdeviceptr p = 0;
      CHECK(cuMemAllocAsync(&p, bytes, stream));
      ++allocations;
      requested += bytes;
      check_data(p, bytes / 4, 0xa5a50000u + static_cast<unsigned>(i), stream);
      CHECK(cuStreamSynchronize(stream));
      check_range(p, bytes, false);
      CHECK(cuMemFreeAsync(p, stream));
      ++frees;
    }
    CHECK(cuStreamSynchronize(stream));
  } else {
    std::printf("note: memory pools not supported, cuMemAllocAsync part skipped\n");
  }

  // cuMemGetInfo while the three cuMemAlloc blocks are live. Under a budget the shim reports the
  // budget, so only consistency is checked, not the card's numbers.
  std::size_t free_bytes = 0, total_bytes = 0;
  CHECK(cuMemGetInfo(&free_bytes, &total_bytes));
  expect(total_bytes > 0 && free_bytes <= total_bytes, "cuMemGetInfo free <= total", free_bytes,
         total_bytes);
  std::printf("cuMemGetInfo: free %zu MiB of %zu MiB\n", free_bytes >> 20, total_bytes >> 20);

  for (const auto& [p, bytes] : blocks) {
    CHECK(cuMemFree(p));
    ++frees;
  }
  CHECK(cuStreamDestroy(stream));
  CHECK(cuDevicePrimaryCtxRelease(dev));

  std::printf("allocations: %ld\n", allocations);
  std::printf("frees: %ld\n", frees);
  std::printf("bytes: %zu\n", requested);
  if (failures) {
    std::printf("FAIL: driver_api: %d check(s) failed\n", failures);
    return 1;
  }
  std::printf("PASS: driver_api\n");
  return 0;
}
