#include "os/unix_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <iterator>

namespace allocshim::os {
namespace {

socklen_t make_address(const std::string& name, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  // name[0] is '\0' (the abstract namespace); the length, not a terminator, ends the name.
  const std::size_t n = name.size() < sizeof addr->sun_path ? name.size() : sizeof addr->sun_path;
  std::memcpy(addr->sun_path, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n);
}

void set_timeouts(int fd, int timeout_ms) {
  timeval tv{};
  tv.tv_sec = timeout_ms / 1000;
  tv.tv_usec = (timeout_ms % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

bool peer_is(int fd, uid_t uid, pid_t pid, pid_t* peer_pid = nullptr, bool or_root = false) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred) return false;
  if (peer_pid != nullptr) *peer_pid = cred.pid;
  return (cred.uid == uid || (or_root && cred.uid == 0)) && (pid <= 0 || cred.pid == pid);
}

bool set_blocking(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0;
}

}  // namespace

std::uint64_t random_name_part() {
  std::uint64_t v = 0;
  if (getrandom(&v, sizeof v, 0) == static_cast<ssize_t>(sizeof v) && v != 0) return v;
  v = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return (v ^ (static_cast<std::uint64_t>(getpid()) << 32)) | 1;
}

int listen_on(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_un addr;
  const socklen_t len = make_address(name, &addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 64) != 0) {
    const int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

int connect_to(const std::string& name, uid_t uid, int timeout_ms, pid_t pid, int connect_ms) {
  // Non-blocking: a connect to a listener whose backlog is full (another process may fill it on
  // purpose) fails with EAGAIN at once instead of sleeping in the kernel, and is retried here
  // within `connect_ms`.
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_un addr;
  const socklen_t len = make_address(name, &addr);
  const int wait_ms = connect_ms >= 0 ? connect_ms : timeout_ms;
  int r;
  for (int waited_ms = 0;; ++waited_ms) {
    do {
      r = connect(fd, reinterpret_cast<sockaddr*>(&addr), len);
    } while (r != 0 && errno == EINTR);
    if (r == 0 || (errno != EAGAIN && errno != EINPROGRESS) || waited_ms >= wait_ms) break;
    const timespec pause{0, 1000000};
    nanosleep(&pause, nullptr);
  }
  // The listener proves who it is too: another user, or another process squatting the name,
  // cannot stand in for it.
  if (r != 0 || !peer_is(fd, uid, pid) || !set_blocking(fd)) {
    close(fd);
    return -1;
  }
  set_timeouts(fd, timeout_ms);
  return fd;
}

int accept_from(int listener, uid_t uid, int timeout_ms, bool* refused, pid_t* peer_pid,
                bool or_root) {
  *refused = false;
  int fd;
  do {
    fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return -1;
  if (!peer_is(fd, uid, 0, peer_pid, or_root)) {
    *refused = true;
    close(fd);
    return -1;
  }
  // Blocking with a bound: the reader reads only after poll() said there is a message, and a
  // stuck peer cannot hold it in a send for longer than this.
  set_blocking(fd);
  set_timeouts(fd, timeout_ms);
  return fd;
}

bool readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  int r;
  do {
    r = poll(&p, 1, timeout_ms);
  } while (r < 0 && errno == EINTR);
  return r > 0;
}

bool send_message(int fd, const void* data, std::size_t bytes, const int* fds, std::size_t nfds) {
  if (nfds > kMaxMessageFds) return false;
  iovec iov{const_cast<void*>(data), bytes};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxMessageFds)];
  if (nfds > 0) {
    std::memset(control, 0, sizeof control);
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  ssize_t n;
  do {
    n = sendmsg(fd, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(bytes);
}

long recv_any(int fd, void* data, std::size_t bytes, int* fds, std::size_t max_fds,
              std::size_t* nfds) {
  *nfds = 0;
  // One byte more than expected: a longer message shows up as a wrong length, not as a clean read.
  alignas(8) unsigned char buf[kMaxMessageBytes + 8];
  if (bytes > kMaxMessageBytes || max_fds > kMaxMessageFds) return -1;
  iovec iov{buf, bytes + 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  // Room for more fds than allowed, so that extra ones arrive (and are closed) rather than being
  // silently dropped with MSG_CTRUNC.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * (kMaxMessageFds + 8))];
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return -1;

  int got[kMaxMessageFds + 8];
  std::size_t ngot = 0;
  bool bad_control = false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
      bad_control = true;
      continue;
    }
    const std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < k; ++i) {
      int v;
      std::memcpy(&v, CMSG_DATA(c) + i * sizeof(int), sizeof v);
      if (ngot < std::size(got))
        got[ngot++] = v;
      else
        close(v);
    }
  }
  // An empty message means the peer closed the connection, unless it carries descriptors: a peer
  // can send those with no bytes, and they are ours to close either way.
  if (n == 0) {
    close_all(got, ngot);
    return ngot == 0 && !bad_control ? 0 : -1;
  }
  const bool ok = !bad_control && (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == 0 &&
                  static_cast<std::size_t>(n) <= bytes && ngot <= max_fds;
  if (!ok) {
    close_all(got, ngot);
    return -1;
  }
  std::memcpy(data, buf, static_cast<std::size_t>(n));
  if (ngot > 0) std::memcpy(fds, got, ngot * sizeof(int));
  *nfds = ngot;
  return static_cast<long>(n);
}

int recv_message(int fd, void* data, std::size_t bytes, int* fds, std::size_t want_fds) {
  int got[kMaxMessageFds];
  std::size_t ngot = 0;
  const long n = recv_any(fd, data, bytes, got, want_fds, &ngot);
  if (n <= 0) return static_cast<int>(n);
  if (static_cast<std::size_t>(n) != bytes || ngot != want_fds) {
    close_all(got, ngot);
    return -1;
  }
  if (ngot > 0) std::memcpy(fds, got, ngot * sizeof(int));
  return 1;
}

void close_all(const int* fds, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (fds[i] >= 0) close(fds[i]);
}

}  // namespace allocshim::os
