#include "core/node_pieces.h"

#include <errno.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "os/unix_socket.h"

namespace allocshim::node {
namespace {

// Sends and receives are bounded: a stuck peer delays a safe point this long at most.
constexpr int kIoTimeoutMs = 100;

bool valid(const PieceChannel::Message& m, PieceChannel::Type type) {
  return m.magic == PieceChannel::kMagic && m.version == PieceChannel::kVersion && m.type == type &&
         m.entry < 64 && m.count <= kPiecesPerMessage;
}

}  // namespace

std::string PieceChannel::name(uid_t uid, pid_t pid) {
  char buf[64];
  const int n = std::snprintf(buf, sizeof buf, "%callocshim-node.%u.%d", '\0', static_cast<unsigned>(uid),
                              static_cast<int>(pid));
  return std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
}

bool PieceChannel::listen() {
  std::lock_guard lock(mutex_);
  if (listener_ < 0) listener_ = os::listen_on(name(geteuid(), getpid()));
  return listener_ >= 0;
}

void PieceChannel::close() {
  std::lock_guard lock(mutex_);
  if (listener_ >= 0) ::close(listener_);
  listener_ = -1;
  for (auto* v : {&givers_, &takers_}) {
    for (const Conn& c : *v) ::close(c.fd);
    v->clear();
  }
}

void PieceChannel::drop_closed(std::vector<Conn>& v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](const Conn& c) { return c.fd < 0; }), v.end());
}

void PieceChannel::connect(int entry, pid_t pid) {
  if (pid <= 0 || pid == getpid()) return;
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock) return;
  for (const Conn& c : givers_)
    if (c.entry == entry && c.pid == pid) return;
  const int fd = os::connect_to(name(geteuid(), pid), geteuid(), kIoTimeoutMs, pid);
  if (fd < 0) return;  // no listener, or someone else's: no pieces pass
  Message hello;
  hello.type = Type::hello;
  hello.entry = static_cast<std::uint32_t>(entry);
  if (!os::send_message(fd, &hello, sizeof hello)) {
    ::close(fd);
    return;
  }
  givers_.push_back(Conn{fd, entry, pid, 0, false});
}

std::uint64_t PieceChannel::offer(int entry, const Give& give) {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock) return 0;
  std::uint64_t sent = 0;
  std::vector<GivenPiece> pieces;
  for (Conn& c : givers_) {
    if (c.entry != entry) continue;
    // The giver's latest lack replaces what it said before.
    while (c.fd >= 0 && os::readable(c.fd)) {
      Message m;
      if (os::recv_message(c.fd, &m, sizeof m) != 1 || !valid(m, Type::lack) ||
          m.entry != static_cast<std::uint32_t>(entry)) {
        ::close(c.fd);
        c.fd = -1;
        break;
      }
      c.lack = m.bytes;
    }
    while (c.fd >= 0 && c.lack > 0) {
      pieces.clear();
      give(c.lack, pieces);
      if (pieces.empty()) break;
      for (std::size_t i = 0; i < pieces.size(); i += kPiecesPerMessage) {
        const std::size_t n = std::min(kPiecesPerMessage, pieces.size() - i);
        Message m;
        m.type = Type::pieces;
        m.entry = static_cast<std::uint32_t>(entry);
        m.count = static_cast<std::uint32_t>(n);
        int fds[kPiecesPerMessage];
        std::uint64_t bytes = 0;
        for (std::size_t k = 0; k < n; ++k) {
          m.sizes[k] = pieces[i + k].bytes;
          fds[k] = pieces[i + k].fd;
          bytes += pieces[i + k].bytes;
        }
        // Sent or not, this process's copies of the descriptors go: the pieces were given up.
        const bool ok = c.fd >= 0 && os::send_message(c.fd, &m, sizeof m, fds, n);
        os::close_all(fds, n);
        if (!ok) {
          if (c.fd >= 0) ::close(c.fd);
          c.fd = -1;
          continue;
        }
        sent += bytes;
        c.lack -= std::min(c.lack, bytes);
      }
    }
  }
  drop_closed(givers_);
  return sent;
}

void PieceChannel::disconnect(int entry) {
  std::lock_guard lock(mutex_);
  for (Conn& c : givers_)
    if (c.entry == entry) {
      ::close(c.fd);
      c.fd = -1;
    }
  drop_closed(givers_);
}

bool PieceChannel::connected(int entry) {
  std::lock_guard lock(mutex_);
  return std::any_of(givers_.begin(), givers_.end(), [&](const Conn& c) { return c.entry == entry; });
}

bool PieceChannel::read_from_taker(Conn& c, const Take& take, std::size_t* taken) {
  Message m;
  int fds[os::kMaxMessageFds];
  std::size_t nfds = 0;
  const long n = os::recv_any(c.fd, &m, sizeof m, fds, kPiecesPerMessage, &nfds);
  bool ok = n == static_cast<long>(sizeof m);
  if (ok && c.entry < 0) {
    // The first message says which GPU; nothing else comes before it.
    ok = valid(m, Type::hello) && nfds == 0;
    if (ok) c.entry = static_cast<int>(m.entry);
  } else if (ok) {
    ok = valid(m, Type::pieces) && m.entry == static_cast<std::uint32_t>(c.entry) && m.count == nfds;
    for (std::size_t i = 0; ok && i < nfds; ++i) ok = m.sizes[i] > 0;
    for (std::size_t i = 0; ok && i < nfds; ++i) {
      take(GivenPiece{m.sizes[i], fds[i]});
      ++*taken;
    }
  }
  if (!ok) os::close_all(fds, nfds);
  return ok;
}

std::size_t PieceChannel::receive(int entry, std::uint64_t lack, int wait_ms, const Take& take) {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock || listener_ < 0) return 0;
  for (;;) {
    bool refused = false;
    const int fd = os::accept_from(listener_, geteuid(), kIoTimeoutMs, &refused);
    if (fd >= 0) takers_.push_back(Conn{fd, -1, 0, 0, false});
    else if (!refused) break;
  }
  std::size_t taken = 0;
  // Reads every message waiting, after waiting up to `timeout_ms` for the first.
  const auto read_all = [&](int timeout_ms) {
    std::vector<pollfd> fds;
    for (const Conn& c : takers_) fds.push_back(pollfd{c.fd, POLLIN, 0});
    if (fds.empty()) return;
    int r;
    do {
      r = ::poll(fds.data(), fds.size(), timeout_ms);
    } while (r < 0 && errno == EINTR);
    if (r <= 0) return;
    for (Conn& c : takers_)
      while (c.fd >= 0 && os::readable(c.fd))
        if (!read_from_taker(c, take, &taken)) {
          ::close(c.fd);
          c.fd = -1;
        }
    drop_closed(takers_);
  };
  read_all(0);
  bool waiting = false;
  for (Conn& c : takers_) {
    if (c.entry != entry) continue;
    waiting = true;
    // Told again only when it grows or ends: a smaller lack would race the pieces on their way.
    if (c.told && lack <= c.lack && (lack > 0 || c.lack == 0)) continue;
    Message m;
    m.type = Type::lack;
    m.entry = static_cast<std::uint32_t>(entry);
    m.bytes = lack;
    if (!os::send_message(c.fd, &m, sizeof m)) {
      ::close(c.fd);
      c.fd = -1;
      continue;
    }
    c.told = true;
    c.lack = lack;
  }
  if (taken == 0 && waiting && wait_ms > 0 && lack > 0) read_all(wait_ms);
  drop_closed(takers_);
  return taken;
}

std::size_t PieceChannel::takers(int entry) {
  std::lock_guard lock(mutex_);
  return static_cast<std::size_t>(
      std::count_if(takers_.begin(), takers_.end(), [&](const Conn& c) { return c.entry == entry; }));
}

}  // namespace allocshim::node
