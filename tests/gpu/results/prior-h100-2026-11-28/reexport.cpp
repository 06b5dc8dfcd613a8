// Probe: can a pinned host allocation imported from a POSIX fd be exported again?
#include <cuda.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <cstring>
static void send_fd(int s, int fd) {
  char c = 'x'; iovec io{&c, 1}; char buf[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{}; m.msg_iov = &io; m.msg_iovlen = 1; m.msg_control = buf; m.msg_controllen = sizeof buf;
  cmsghdr* h = CMSG_FIRSTHDR(&m); h->cmsg_level = SOL_SOCKET; h->cmsg_type = SCM_RIGHTS; h->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(h), &fd, sizeof fd); sendmsg(s, &m, 0);
}
static int recv_fd(int s) {
  char c; iovec io{&c, 1}; char buf[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{}; m.msg_iov = &io; m.msg_iovlen = 1; m.msg_control = buf; m.msg_controllen = sizeof buf;
  if (recvmsg(s, &m, 0) != 1) return -1; int fd; std::memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd); return fd;
}
static CUcontext init() { cuInit(0); CUdevice d; cuDeviceGet(&d, 0); CUcontext c; cuDevicePrimaryCtxRetain(&c, d); cuCtxSetCurrent(c); return c; }
int main() {
  int sv[2]; socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
  pid_t pid = fork();
  if (pid == 0) {
    init();
    int fd = recv_fd(sv[1]);
    CUmemGenericAllocationHandle h; CUresult r = cuMemImportFromShareableHandle(&h, (void*)(long)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    std::printf("child import: %d\n", r);
    int fd2 = -1; r = cuMemExportToShareableHandle(&fd2, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    std::printf("child re-export of the imported handle: %d (fd %d)\n", r, fd2);
    CUmemAllocationProp p{}; r = cuMemGetAllocationPropertiesFromHandle(&p, h);
    std::printf("child props: %d type %d loc %d/%d handles %d\n", r, p.type, p.location.type, p.location.id, p.requestedHandleTypes);
    return 0;
  }
  init();
  CUmemAllocationProp p{}; p.type = CU_MEM_ALLOCATION_TYPE_PINNED; p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA; p.location.id = 0;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t g = 0; cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  CUmemGenericAllocationHandle h; CUresult r = cuMemCreate(&h, 64 << 20, &p, 0);
  std::printf("parent create: %d (gran %zu)\n", r, g);
  int fd = -1; r = cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  std::printf("parent export: %d\n", r);
  // Same process: import and export again.
  CUmemGenericAllocationHandle h2; r = cuMemImportFromShareableHandle(&h2, (void*)(long)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  int fd3 = -1; CUresult r2 = cuMemExportToShareableHandle(&fd3, h2, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  std::printf("parent self import %d, re-export %d\n", r, r2);
  send_fd(sv[0], fd);
  int st; waitpid(pid, &st, 0);
  return 0;
}
