#include "node/node_pieces.h"

#include <errno.h>
#include <poll.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <cstdio>

#include "os/unix_socket.h"
#include "base/clock.h"

namespace allocshim::node {
namespace {

// Sends and receives are bounded: a stuck peer delays a safe point this long at most.
constexpr int kIoTimeoutMs = 100;
// A taker's sends: the program's thread waits this long at most for a giver's full queue.
constexpr int kTakerIoMs = 5;
// What one receive() does at most beyond its wait: accept this many connections and read this
// many messages, within this long, so that a flood is met a bounded amount at a time.
constexpr int kAcceptsPerCall = 32;
constexpr int kMessagesPerCall = 64;
constexpr std::uint64_t kSlackNs = 5'000'000;

bool valid(const PieceChannel::Message& m, PieceChannel::Type type) {
  return m.magic == PieceChannel::kMagic && m.version == PieceChannel::kVersion && m.type == type &&
         m.entry < 64 && m.count <= kPiecesPerMessage;
}

int ms_until(std::uint64_t deadline_ns) {
  const std::uint64_t now = clock::now_ns();
  return now >= deadline_ns ? 0 : static_cast<int>((deadline_ns - now + 999999) / 1000000);
}

}  // namespace

std::string PieceChannel::name(uid_t uid, pid_t pid, std::uint64_t channel) {
  char buf[80];
  const int n = std::snprintf(buf, sizeof buf, "%callocshim-node.%u.%d.%016llx", '\0',
                              static_cast<unsigned>(uid), static_cast<int>(pid),
                              static_cast<unsigned long long>(channel));
  return std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
}

bool PieceChannel::listen() {
  std::lock_guard lock(mutex_);
  // A name taken already (by chance, or by a process that guessed it) gets another number.
  for (int attempt = 0; attempt < 4 && listener_ < 0; ++attempt) {
    const std::uint64_t channel = os::random_name_part();
    listener_ = os::listen_on(name(geteuid(), getpid(), channel));
    if (listener_ >= 0) channel_ = channel;
  }
  return listener_ >= 0;
}

std::uint64_t PieceChannel::channel() const {
  std::lock_guard lock(mutex_);
  return listener_ >= 0 ? channel_ : 0;
}

void PieceChannel::close() {
  std::lock_guard lock(mutex_);
  if (listener_ >= 0) ::close(listener_);
  listener_ = -1;
  channel_ = 0;
  for (auto* v : {&givers_, &takers_}) {
    for (const Conn& c : *v) ::close(c.fd);
    v->clear();
  }
}

void PieceChannel::drop_closed(std::vector<Conn>& v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](const Conn& c) { return c.fd < 0; }), v.end());
}

void PieceChannel::connect(int entry, pid_t pid, std::uint64_t channel) {
  if (pid <= 0 || pid == getpid() || channel == 0) return;
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock) return;
  for (const Conn& c : givers_)
    if (c.entry == entry && c.pid == pid) return;
  const int fd =
      os::connect_to(name(geteuid(), pid, channel), geteuid(), kTakerIoMs, pid, kConnectMs);
  if (fd < 0) return;  // no listener, or someone else's: no pieces pass
  Message hello;
  hello.type = Type::hello;
  hello.entry = static_cast<std::uint32_t>(entry);
  if (!os::send_message(fd, &hello, sizeof hello)) {
    ::close(fd);
    return;
  }
  givers_.push_back(Conn{fd, entry, pid, 0, false, 0});
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
  return std::any_of(givers_.begin(), givers_.end(),
                     [&](const Conn& c) { return c.entry == entry; });
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
    // Pieces come only after a lack was told, and only up to it: a peer that was never asked, or
    // sends more than it was asked for, is dropped with everything it sent.
    ok = valid(m, Type::pieces) && m.entry == static_cast<std::uint32_t>(c.entry) &&
         m.count == nfds && c.told;
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; ok && i < nfds; ++i) {
      ok = m.sizes[i] > 0 && m.sizes[i] <= c.room - std::min(c.room, bytes);
      bytes += ok ? m.sizes[i] : 0;
    }
    for (std::size_t i = 0; ok && i < nfds; ++i) {
      take(GivenPiece{m.sizes[i], fds[i]});
      ++*taken;
    }
    if (ok) c.room -= bytes;
  }
  if (!ok) os::close_all(fds, nfds);
  return ok;
}

void PieceChannel::accept_takers(const std::vector<pid_t>& members, std::uint64_t deadline_ns) {
  for (int i = 0; i < kAcceptsPerCall && clock::now_ns() < deadline_ns; ++i) {
    bool refused = false;
    pid_t peer = 0;
    const int fd = os::accept_from(listener_, geteuid(), kIoTimeoutMs, &refused, &peer);
    if (fd < 0) {
      if (!refused) return;  // none pending
      continue;
    }
    // Only members of the region, and no more connections than the cap: the rest are closed at once.
    const bool member = std::find(members.begin(), members.end(), peer) != members.end();
    if (!member || takers_.size() >= kMaxTakers) {
      ::close(fd);
      continue;
    }
    takers_.push_back(Conn{fd, -1, peer, 0, false, 0});
  }
}

std::size_t PieceChannel::receive(int entry, std::uint64_t lack, int wait_ms,
                                  const std::vector<pid_t>& members, const Take& take) {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock || listener_ < 0) return 0;
  const std::uint64_t start = clock::now_ns();
  const std::uint64_t busy_until = start + kSlackNs;  // what accepting and reading may take
  const std::uint64_t deadline = start + std::uint64_t(std::max(wait_ms, 0)) * 1000000u + kSlackNs;
  accept_takers(members, busy_until);
  std::size_t taken = 0;
  int messages = 0;
  // Reads the messages waiting, after waiting until `until` for the first; bounded in count.
  const auto read_all = [&](std::uint64_t until) {
    std::vector<pollfd> fds;
    for (const Conn& c : takers_) fds.push_back(pollfd{c.fd, POLLIN, 0});
    if (fds.empty()) return;
    int r;
    do {
      r = ::poll(fds.data(), fds.size(), ms_until(until));
    } while (r < 0 && errno == EINTR && clock::now_ns() < until);
    if (r <= 0) return;
    for (Conn& c : takers_)
      while (c.fd >= 0 && messages < kMessagesPerCall && clock::now_ns() < deadline &&
             os::readable(c.fd)) {
        ++messages;
        if (!read_from_taker(c, take, &taken)) {
          ::close(c.fd);
          c.fd = -1;
        }
      }
    drop_closed(takers_);
  };
  read_all(start);
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
    // What it may send grows with each lack told: pieces sent for an earlier one may still be on
    // their way, and count against what it was told in all.
    if (lack > c.lack) c.room += lack - c.lack;
    c.told = true;
    c.lack = lack;
  }
  if (taken == 0 && waiting && wait_ms > 0 && lack > 0) read_all(deadline);
  drop_closed(takers_);
  return taken;
}

std::size_t PieceChannel::takers(int entry) {
  std::lock_guard lock(mutex_);
  return static_cast<std::size_t>(std::count_if(takers_.begin(), takers_.end(),
                                                [&](const Conn& c) { return c.entry == entry; }));
}

}  // namespace allocshim::node
