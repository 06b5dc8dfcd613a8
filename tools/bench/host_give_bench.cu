// What giving room would cost if the giver demoted into host pieces another process made, against
// pinning its own (docs/design/oversubscription.md, "What a move costs"). Natively, no shim; two
// processes, forked before either initializes CUDA:
//   - the giver (the child) holds TOTAL bytes of device pieces of PIECE, mapped in one
//     reservation and written by a kernel, and demotes them as the spill target does (the new
//     host piece mapped at a scratch range and granted to the device, the copy, then the
//     address remapped to it), twice: into host pieces it pins itself (cuMemCreate at the host
//     NUMA location), and, with a fresh device set, into pieces the taker made and sent
//     (cuMemImportFromShareableHandle); each step timed, the set checked by a kernel after each;
//   - the taker (the parent) times pinning the same pieces, plain and with POSIX-FD handles
//     (whether the handle type changes what pinning costs), exports each and sends the fds over a
//     socket pair, then maps the pieces itself and checks every word the giver copied into them.
//
//   host_give_bench [TOTAL [PIECE]]   (defaults 2GiB 64MiB)
//
// Output: one line per measurement ("give ..."), then a table. Exit 0, 1 on a driver error or a bad
// word, 77 without a GPU.
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "oversub_common.h"

using namespace oversub;

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Setup {
  CUdevice dev = 0;
  CUmemAllocationProp device_prop{}, host_prop{};
  CUmemAccessDesc access{};
};

Setup setup(bool fd_handles) {
  CHECK(cudaFree(nullptr));
  Setup s;
  CU(cuCtxGetDevice(&s.dev));
  int numa = -1;
  if (cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, s.dev) != CUDA_SUCCESS)
    numa = -1;
  s.device_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  s.device_prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  s.device_prop.location.id = s.dev;
  s.host_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  s.host_prop.location.type =
      numa >= 0 ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_HOST;
  s.host_prop.location.id = numa >= 0 ? numa : 0;
  if (fd_handles) s.host_prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  s.access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  s.access.location.id = s.dev;
  s.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return s;
}

// One fd per message (SCM_RIGHTS), or a byte alone (fd < 0).
void send_fd(int sock, int fd, char tag) {
  char control[CMSG_SPACE(sizeof(int))] = {};
  iovec io{&tag, 1};
  msghdr m{};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  if (fd >= 0) {
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    cmsghdr* h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(h), &fd, sizeof fd);
  }
  if (::sendmsg(sock, &m, 0) != 1) {
    std::printf("FAIL: sendmsg\n");
    std::exit(1);
  }
}
char recv_fd(int sock, int* fd) {
  char tag = 0;
  char control[CMSG_SPACE(sizeof(int))] = {};
  iovec io{&tag, 1};
  msghdr m{};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  if (::recvmsg(sock, &m, 0) != 1) {
    std::printf("FAIL: recvmsg\n");
    std::exit(1);
  }
  *fd = -1;
  if (cmsghdr* h = CMSG_FIRSTHDR(&m); h != nullptr && h->cmsg_type == SCM_RIGHTS)
    std::memcpy(fd, CMSG_DATA(h), sizeof *fd);
  return tag;
}

// Every word of [p, p + bytes) against `seed`'s pattern: the bad words.
unsigned long long bad_words(CUdeviceptr p, std::size_t bytes, std::uint32_t seed) {
  unsigned long long* bad = nullptr;
  CHECK(cudaMalloc(&bad, sizeof *bad));
  CHECK(cudaMemset(bad, 0, sizeof *bad));
  check_async(reinterpret_cast<void*>(p), bytes, seed, bad);
  unsigned long long out = 0;
  CHECK(cudaMemcpy(&out, bad, sizeof out, cudaMemcpyDeviceToHost));
  CHECK(cudaFree(bad));
  return out;
}

// Time per step of one demotion pass, summed over the pieces, in ms.
struct Steps {
  double acquire = 0, map_scratch = 0, copy = 0, remap = 0;
  double total() const { return acquire + map_scratch + copy + remap; }
};

// The giver: a device set of n pieces at `va`, filled with `seed`, demoted piece by piece into
// host pieces `acquire(i)` returns; the set is checked, then released.
template <class Acquire>
Steps demote_set(const Setup& s, CUdeviceptr va, CUdeviceptr scratch, std::size_t n,
                 std::size_t piece, std::uint32_t seed, Acquire acquire) {
  std::vector<CUmemGenericAllocationHandle> dev(n), host(n);
  for (std::size_t i = 0; i < n; ++i) {
    CU(cuMemCreate(&dev[i], piece, &s.device_prop, 0));
    CU(cuMemMap(va + i * piece, piece, 0, dev[i], 0));
  }
  CU(cuMemSetAccess(va, n * piece, &s.access, 1));
  fill(reinterpret_cast<void*>(va), n * piece, seed);
  CHECK(cudaDeviceSynchronize());
  Steps t;
  for (std::size_t i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    host[i] = acquire(i);
    t.acquire += ms_since(t0);
    t0 = Clock::now();
    CU(cuMemMap(scratch, piece, 0, host[i], 0));
    CU(cuMemSetAccess(scratch, piece, &s.access, 1));
    t.map_scratch += ms_since(t0);
    t0 = Clock::now();
    CU(cuMemcpyDtoD(scratch, va + i * piece, piece));
    CU(cuCtxSynchronize());
    t.copy += ms_since(t0);
    t0 = Clock::now();
    CU(cuMemUnmap(scratch, piece));
    CU(cuMemUnmap(va + i * piece, piece));
    CU(cuMemRelease(dev[i]));
    CU(cuMemMap(va + i * piece, piece, 0, host[i], 0));
    CU(cuMemSetAccess(va + i * piece, piece, &s.access, 1));
    t.remap += ms_since(t0);
  }
  const unsigned long long bad = bad_words(va, n * piece, seed);
  if (bad != 0) {
    std::printf("FAIL: %llu bad words after demoting\n", bad);
    std::exit(1);
  }
  CU(cuMemUnmap(va, n * piece));
  for (auto h : host) CU(cuMemRelease(h));
  return t;
}

void print(const char* name, const Steps& t, std::size_t bytes) {
  std::printf("give %s gbps=%.2f acquire_ms=%.1f map_scratch_ms=%.1f copy_ms=%.1f remap_ms=%.1f\n",
              name, double(bytes) / t.total() / 1e6, t.acquire, t.map_scratch, t.copy, t.remap);
}

int giver(int sock, std::size_t total, std::size_t piece) {
  const std::size_t n = total / piece;
  const Setup s = setup(false);
  CUdeviceptr va = 0, scratch = 0;
  CU(cuMemAddressReserve(&va, total, 0, 0, 0));
  CU(cuMemAddressReserve(&scratch, piece, 0, 0, 0));
  const Steps own = demote_set(s, va, scratch, n, piece, 1, [&](std::size_t) {
    CUmemGenericAllocationHandle h = 0;
    CU(cuMemCreate(&h, piece, &s.host_prop, 0));
    return h;
  });
  print("own", own, total);
  send_fd(sock, -1, 'o');  // the taker pins now, not while this one did
  std::vector<int> fds(n);
  for (std::size_t i = 0; i < n; ++i)
    if (recv_fd(sock, &fds[i]) != 'f' || fds[i] < 0) {
      std::printf("FAIL: no fd for piece %zu\n", i);
      return 1;
    }
  const Steps imported = demote_set(s, va, scratch, n, piece, 2, [&](std::size_t i) {
    CUmemGenericAllocationHandle h = 0;
    CU(cuMemImportFromShareableHandle(&h,
                                      reinterpret_cast<void*>(static_cast<std::uintptr_t>(fds[i])),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    ::close(fds[i]);
    return h;
  });
  print("imported", imported, total);
  std::printf(
      "\n| host pieces | GB/s | acquire ms | map scratch ms | copy ms | remap ms |\n|---|---|---|---|---|---|\n");
  for (const auto& [name, t] :
       {std::pair{"pinned by the giver", own}, std::pair{"the taker's, imported", imported}})
    std::printf("| %s | %.2f | %.1f | %.1f | %.1f | %.1f |\n", name,
                double(total) / t.total() / 1e6, t.acquire, t.map_scratch, t.copy, t.remap);
  std::fflush(stdout);
  send_fd(sock, -1, 'd');
  CU(cuMemAddressFree(va, total));
  CU(cuMemAddressFree(scratch, piece));
  return 0;
}

int taker(int sock, std::size_t total, std::size_t piece) {
  const std::size_t n = total / piece;
  int fd = -1;
  if (recv_fd(sock, &fd) != 'o') return 1;
  const Setup s = setup(true);
  CUmemAllocationProp plain = s.host_prop;
  plain.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  std::vector<CUmemGenericAllocationHandle> h(n);
  auto t0 = Clock::now();
  for (auto& x : h) CU(cuMemCreate(&x, piece, &plain, 0));
  const double plain_ms = ms_since(t0);
  for (auto x : h) CU(cuMemRelease(x));
  t0 = Clock::now();
  for (auto& x : h) CU(cuMemCreate(&x, piece, &s.host_prop, 0));
  const double fd_ms = ms_since(t0);
  t0 = Clock::now();
  std::vector<int> fds(n);
  for (std::size_t i = 0; i < n; ++i)
    CU(cuMemExportToShareableHandle(&fds[i], h[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  const double export_ms = ms_since(t0);
  std::printf("give pin plain gbps=%.2f posix_fd gbps=%.2f export_ms=%.1f\n",
              double(total) / plain_ms / 1e6, double(total) / fd_ms / 1e6, export_ms);
  std::fflush(stdout);
  for (int f : fds) {
    send_fd(sock, f, 'f');
    ::close(f);
  }
  if (recv_fd(sock, &fd) != 'd') return 1;
  // What the giver copied in, read through this process's own mapping of the same pieces.
  CUdeviceptr va = 0;
  CU(cuMemAddressReserve(&va, total, 0, 0, 0));
  for (std::size_t i = 0; i < n; ++i) CU(cuMemMap(va + i * piece, piece, 0, h[i], 0));
  CU(cuMemSetAccess(va, total, &s.access, 1));
  const unsigned long long bad = bad_words(va, total, 2);
  std::printf("give taker read what the giver demoted: %llu bad words\n", bad);
  CU(cuMemUnmap(va, total));
  CU(cuMemAddressFree(va, total));
  for (auto x : h) CU(cuMemRelease(x));
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t total = argc > 1 ? parse_size(argv[1]) : 2 * kGiB;
  const std::size_t piece = argc > 2 ? parse_size(argv[2]) : 64 * kMiB;
  if (piece == 0 || piece % (2 * kMiB) != 0 || total < piece) {
    std::fprintf(
        stderr,
        "usage: host_give_bench [TOTAL [PIECE]] (PIECE a multiple of 2MiB, TOTAL at least PIECE)\n");
    return 2;
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
  std::fflush(stdout);
  // Forked before either process initializes CUDA (a child cannot use it after the parent did).
  const pid_t pid = ::fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    ::close(sv[0]);
    require_gpu();
    std::exit(giver(sv[1], total / piece * piece, piece));
  }
  ::close(sv[1]);
  require_gpu();
  const int rc = taker(sv[0], total / piece * piece, piece);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const int child = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return rc != 0 ? rc : child;
}
