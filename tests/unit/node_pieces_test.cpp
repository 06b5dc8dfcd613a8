// The channel that passes host pieces between members of a shared budget (core/node_pieces.h):
// who may connect, what each side believes, and that no descriptor leaks on any path.
#include "core/node_pieces.h"

#include <dirent.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fork_child.h"
#include "os/unix_socket.h"

namespace allocshim::node {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

int open_fds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

// A memfd of `bytes` whose first byte is `tag`: a stand-in for an exported host piece.
int piece(std::uint64_t bytes, char tag) {
  const int fd = ::memfd_create("piece", MFD_CLOEXEC);
  if (fd >= 0 && (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 || ::pwrite(fd, &tag, 1, 0) != 1)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

char tag_of(int fd) {
  char c = 0;
  return ::pread(fd, &c, 1, 0) == 1 ? c : '\0';
}

// A taker never connects to a listener that is not the member it asked for: another process (here
// this one) holding the member's name gets no hello, and so never the pieces.
TEST(PieceChannel, ATakerRefusesAListenerThatIsNotTheMember) {
  const pid_t member = 1;  // some other process: this one squats its name
  const int squatter = os::listen_on(PieceChannel::name(::geteuid(), member));
  ASSERT_GE(squatter, 0);
  PieceChannel taker;
  taker.connect(3, member);
  EXPECT_FALSE(taker.connected(3));
  EXPECT_EQ(taker.offer(3, [](std::uint64_t, std::vector<GivenPiece>&) { ADD_FAILURE() << "asked to give"; }), 0u);
  ::close(squatter);
}

// The whole exchange between two processes: the child takes room over and connects, the parent
// (the giver) tells it what it lacks, the child sends that much and no more, and the parent takes
// the pieces it was sent, descriptors intact.
TEST(PieceChannel, AGiverGetsWhatItSaysItLacks) {
  PieceChannel giver;
  ASSERT_TRUE(giver.listen());
  const pid_t parent = ::getpid();
  const pid_t child = testing::fork_child([parent] {
    PieceChannel taker;
    taker.connect(2, parent);
    if (!taker.connected(2)) return 1;
    std::uint64_t sent = 0, asked = 0;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    char tag = 'a';
    while (sent < 192 * kMiB && std::chrono::steady_clock::now() < end) {
      sent += taker.offer(2, [&](std::uint64_t bytes, std::vector<GivenPiece>& out) {
        asked = bytes;
        for (std::uint64_t b = 0; b < bytes; b += 64 * kMiB) out.push_back(GivenPiece{64 * kMiB, piece(64 * kMiB, tag++)});
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (sent != 192 * kMiB || asked != 192 * kMiB) return 2;
    // Nothing more is given once the lack is met.
    if (taker.offer(2, [](std::uint64_t, std::vector<GivenPiece>&) {}) != 0) return 3;
    taker.disconnect(2);
    return 0;
  });
  ASSERT_GT(child, 0);
  std::vector<GivenPiece> got;
  const auto take = [&](const GivenPiece& p) { got.push_back(p); };
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (got.size() < 3 && std::chrono::steady_clock::now() < end) giver.receive(2, 192 * kMiB, 100, take);
  EXPECT_EQ(testing::wait_child(child), 0);
  ASSERT_EQ(got.size(), 3u);
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].bytes, 64 * kMiB);
    EXPECT_EQ(tag_of(got[i].fd), static_cast<char>('a' + i));
    ::close(got[i].fd);
  }
}

// A peer that breaks the protocol (pieces before its hello, a count that is not the descriptors
// attached) loses its connection, and the descriptors it sent are closed, not kept.
TEST(PieceChannel, AGiverDropsAPeerThatBreaksTheProtocolAndClosesWhatItSent) {
  for (const bool hello_first : {false, true}) {
    SCOPED_TRACE(hello_first ? "count without descriptors" : "pieces before hello");
    PieceChannel giver;
    ASSERT_TRUE(giver.listen());
    const int before = open_fds();
    const int fd = os::connect_to(PieceChannel::name(::geteuid(), ::getpid()), ::geteuid(), 1000, ::getpid());
    ASSERT_GE(fd, 0);
    PieceChannel::Message m;
    if (hello_first) {
      m.entry = 1;
      ASSERT_TRUE(os::send_message(fd, &m, sizeof m));
    }
    m.type = PieceChannel::Type::pieces;
    m.entry = 1;
    m.count = hello_first ? 3 : 1;  // hello first: one descriptor short
    m.sizes[0] = m.sizes[1] = m.sizes[2] = 64 * kMiB;
    int fds[2] = {piece(64 * kMiB, 'x'), piece(64 * kMiB, 'y')};
    ASSERT_TRUE(os::send_message(fd, &m, sizeof m, fds, hello_first ? 2 : 1));
    os::close_all(fds, 2);
    std::size_t taken = 0;
    giver.receive(1, 64 * kMiB, 0, [&](const GivenPiece& p) {
      ++taken;
      ::close(p.fd);
    });
    EXPECT_EQ(taken, 0u);
    EXPECT_EQ(giver.takers(1), 0u);
    char c;
    EXPECT_EQ(::recv(fd, &c, 1, 0), 0) << "the giver closed the connection";
    ::close(fd);
    EXPECT_EQ(open_fds(), before);
  }
}

}  // namespace
}  // namespace allocshim::node
