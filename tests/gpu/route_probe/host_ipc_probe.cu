// Can host-located VMM memory be exported as a POSIX fd and imported by another process? For device,
// HOST_NUMA and HOST locations, with and without POSIX-FD handles: cuMemCreate, what
// cuMemGetAddressRange answers on the mapping, retain + export, and a child process (forked before
// cuInit) that imports the fd, reads what the parent wrote and writes back. Results:
// tests/gpu/results/h100-2026-11-25-reset-route.md.
#include <cuda.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <cstring>
#include <vector>

#define R(call)                                           \
  ([&] {                                                  \
    CUresult r_ = (call);                                 \
    const char* n_ = nullptr;                             \
    cuGetErrorName(r_, &n_);                              \
    std::printf("  %-72s -> %s\n", #call, n_ ? n_ : "?"); \
    std::fflush(stdout);                                  \
    return r_;                                            \
  }())

static void send_fd(int sock, int fd, int tag) {
  char c[CMSG_SPACE(sizeof(int))] = {};
  iovec io{&tag, sizeof tag};
  msghdr m{};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  if (fd >= 0) {
    m.msg_control = c;
    m.msg_controllen = sizeof c;
    cmsghdr* h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(h), &fd, sizeof fd);
  }
  sendmsg(sock, &m, 0);
}
static int recv_fd(int sock, int* tag) {
  char c[CMSG_SPACE(sizeof(int))] = {};
  iovec io{tag, sizeof *tag};
  msghdr m{};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  m.msg_control = c;
  m.msg_controllen = sizeof c;
  if (recvmsg(sock, &m, 0) <= 0) return -2;
  cmsghdr* h = CMSG_FIRSTHDR(&m);
  int fd = -1;
  if (h) std::memcpy(&fd, CMSG_DATA(h), sizeof fd);
  return fd;
}
const size_t kChunk = 2 << 20;

static void child(int sock) {
  cuInit(0);
  CUcontext ctx;
  cuDevicePrimaryCtxRetain(&ctx, 0);
  cuCtxSetCurrent(ctx);
  for (;;) {
    int tag = 0;
    int fd = recv_fd(sock, &tag);
    if (fd == -2 || tag < 0) break;
    std::printf(" child, case %d, fd %d:\n", tag, fd);
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr v = 0;
    int ok = 0;
    if (fd >= 0 &&
        R(cuMemImportFromShareableHandle(
            &h, (void*)(long)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) == CUDA_SUCCESS) {
      R(cuMemAddressReserve(&v, kChunk, 0, 0, 0));
      R(cuMemMap(v, kChunk, 0, h, 0));
      CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
      R(cuMemSetAccess(v, kChunk, &acc, 1));
      std::vector<unsigned> b(kChunk / 4);
      if (R(cuMemcpyDtoH(b.data(), v, kChunk)) == CUDA_SUCCESS) {
        std::printf("  child reads %x (want 5eed0000+case)\n", b[777]);
        ok = b[777] == 0x5eed0000u + (unsigned)tag;
      }
      R(cuMemsetD32(v, 0xc0de0000u + tag, kChunk / 4));
      cuCtxSynchronize();
      cuMemUnmap(v, kChunk);
      cuMemRelease(h);
      cuMemAddressFree(v, kChunk);
    }
    if (fd >= 0) close(fd);
    if (write(sock, &ok, sizeof ok) != static_cast<ssize_t>(sizeof ok)) _exit(1);
  }
  _exit(0);
}

int main() {
  int sv[2];
  socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv);
  pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    child(sv[1]);
  }
  close(sv[1]);
  cuInit(0);
  CUcontext ctx;
  cuDevicePrimaryCtxRetain(&ctx, 0);
  cuCtxSetCurrent(ctx);
  int numa = -9, numa_vmm = -9, posix = -9;
  cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0);
  cuDeviceGetAttribute(&numa_vmm, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                       0);
  cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0);
  int drv = 0;
  cuDriverGetVersion(&drv);
  std::printf("driver %d host_numa_id %d host_numa_vmm %d posix_fd %d\n", drv, numa, numa_vmm,
              posix);
  struct Case {
    const char* name;
    CUmemLocationType t;
    int id;
    unsigned types;
  } cases[] = {
      {"DEVICE posix", CU_MEM_LOCATION_TYPE_DEVICE, 0, 1},
      {"HOST_NUMA id=attr posix", CU_MEM_LOCATION_TYPE_HOST_NUMA, numa, 1},
      {"HOST_NUMA id=0 posix", CU_MEM_LOCATION_TYPE_HOST_NUMA, 0, 1},
      {"HOST posix", CU_MEM_LOCATION_TYPE_HOST, 0, 1},
      {"HOST plain", CU_MEM_LOCATION_TYPE_HOST, 0, 0},
      {"HOST_NUMA id=0 plain", CU_MEM_LOCATION_TYPE_HOST_NUMA, 0, 0},
  };
  int tag = 0;
  for (const Case& c : cases) {
    ++tag;
    std::printf("case %d: %s\n", tag, c.name);
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = c.t;
    prop.location.id = c.id;
    prop.requestedHandleTypes = (CUmemAllocationHandleType)c.types;
    size_t g = 0;
    R(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    std::printf("  granularity %zu\n", g);
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr v = 0;
    int fd = -1;
    if (R(cuMemCreate(&h, kChunk, &prop, 0)) == CUDA_SUCCESS) {
      R(cuMemAddressReserve(&v, 2 * kChunk, 0, 0, 0));
      R(cuMemMap(v + kChunk, kChunk, 0, h, 0));
      CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
      R(cuMemSetAccess(v + kChunk, kChunk, &acc, 1));
      R(cuMemsetD32(v + kChunk, 0x5eed0000u + tag, kChunk / 4));
      cuCtxSynchronize();
      CUdeviceptr base = 0;
      size_t size = 0;
      CUresult r = R(cuMemGetAddressRange(&base, &size, v + kChunk + 4096));
      std::printf("  range of v+chunk+4096 (v=%llx): r=%d base=+%lld size=%zu\n",
                  (unsigned long long)v, r, (long long)(base - v), size);
      CUmemGenericAllocationHandle h2 = 0;
      if (R(cuMemRetainAllocationHandle(&h2, (void*)(v + kChunk + 4096))) == CUDA_SUCCESS) {
        std::printf("  retained same handle: %s\n", h2 == h ? "yes" : "no");
        R(cuMemExportToShareableHandle(&fd, h2, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        cuMemRelease(h2);
      }
      CUmemAllocationProp back = {};
      R(cuMemGetAllocationPropertiesFromHandle(&back, h));
      std::printf("  props: loc type %d id %d handle types %d\n", back.location.type,
                  back.location.id, back.requestedHandleTypes);
    }
    send_fd(sv[0], fd, tag);
    int ok = 0;
    if (read(sv[0], &ok, sizeof ok) != static_cast<ssize_t>(sizeof ok)) ok = 0;
    if (fd >= 0) close(fd);
    if (v) {
      std::vector<unsigned> b(kChunk / 4);
      cuMemcpyDtoH(b.data(), v + kChunk, kChunk);
      std::printf("  RESULT %s: child %s, parent reads %x (child wrote c0de0000+case)\n", c.name,
                  ok ? "read it" : "failed", b[777]);
      cuMemUnmap(v + kChunk, kChunk);
      cuMemRelease(h);
      cuMemAddressFree(v, 2 * kChunk);
    } else
      std::printf("  RESULT %s: create failed\n", c.name);
  }
  send_fd(sv[0], -1, -1);
  int st = 0;
  waitpid(pid, &st, 0);
  return 0;
}
