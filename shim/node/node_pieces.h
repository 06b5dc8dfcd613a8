// Host pieces passed between the members of a shared budget (docs/design/oversubscription.md,
// "Passing host pieces"): a process taking room over sends the pinned host pieces its promotions
// free to the member demoting for it, which demotes into them instead of pinning its own (pinning
// is what a demotion costs; importing a piece costs almost nothing).
//
// Each member listens on an abstract socket named from its uid, its pid and a random channel
// number chosen when it binds, which it then publishes in its slot of the region: a name nobody
// can predict is a name nobody can take first. A taker connects to the members it asked for room,
// by the channel their slots give, and checks that the peer is the member's process (uid and pid),
// so that a process holding the name never gets the pieces, which hold the taker's data; it says
// which GPU (region entry) it takes room on. A giver accepts only peers of its own uid whose pid is
// a member of the region, tells each taker how many bytes of host pieces its demotion lacks, and
// takes what comes back as descriptors, up to that lack and no more. Only processes of one user
// pass pieces: one of a group or node budget run by another user pins its own.
//
//   taker: Hello{entry}                        giver: Lack{entry, bytes}
//   taker: Pieces{entry, count, sizes}, count descriptors attached (as many as the lack allows)
//
// Nothing a peer sends is trusted beyond its size: a message of the wrong length, magic, version or
// type, with the wrong number of descriptors, or pieces past the lack told, ends that connection,
// and its descriptors are closed. Connections are capped (kMaxTakers), a call accepts and reads a
// bounded number of them, and every call keeps to its deadline, so a flood of connections or
// messages cannot stretch it; a connect never waits more than kConnectMs for a listener's backlog.
// A process of the same user can join the region as a member (it may write the file), and then
// pass pieces as a member would, within the lack told; it cannot take pieces a taker sends to the
// member it asked, nor make a member hold more descriptors than the caps allow. Slow path only
// (safe points that move memory); a lock another thread holds makes a call do nothing rather than
// wait.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <new>
#include <string>
#include <vector>

namespace allocshim::node {

inline constexpr std::size_t kPiecesPerMessage = 16;
inline constexpr std::size_t kMaxTakers = 16;  // connections a giver keeps; more are refused
inline constexpr int kConnectMs = 2;           // the longest a taker's connect waits

// A host piece on its way: its bytes and a descriptor its owner closes.
struct GivenPiece {
  std::uint64_t bytes = 0;
  int fd = -1;
};

class PieceChannel {
 public:
  PieceChannel() = default;
  ~PieceChannel() { close(); }
  PieceChannel(const PieceChannel&) = delete;
  PieceChannel& operator=(const PieceChannel&) = delete;

  // Listens under a name of this process with a random channel number; false if it cannot
  // (then nobody passes this process pieces, and its demotions pin their own).
  bool listen();
  // The channel number to publish (0: not listening).
  std::uint64_t channel() const;
  // Closes every socket (at exit).
  void close();
  // In a forked child (single-threaded; the parent may have held the lock at fork): closes the
  // child's copies of the sockets; the parent's stay.
  void forget_after_fork() {
    new (&mutex_) std::mutex;
    close();
  }

  // Taker side. Connects to member `pid`, listening on `channel`, about region entry `entry`,
  // unless connected already.
  void connect(int entry, pid_t pid, std::uint64_t channel);
  // Reads what the givers of `entry` lack, and for each lack calls `give(bytes, pieces)`, which
  // fills `pieces` with up to `bytes` of host pieces; sends them. Returns the bytes sent.
  using Give = std::function<void(std::uint64_t bytes, std::vector<GivenPiece>& pieces)>;
  std::uint64_t offer(int entry, const Give& give);
  // Ends the connections about `entry` (the take-over is over).
  void disconnect(int entry);
  bool connected(int entry);

  // Giver side. Accepts pending takers whose pid is one of the `members` (the region's, as this
  // process last read it), tells those of `entry` that its demotion lacks `lack` bytes of host
  // pieces (once per change), then hands every piece they sent within that to `take` (which owns
  // its descriptor), waiting up to `wait_ms` for some if none came and a taker of `entry` is
  // connected. Returns within `wait_ms` plus a few milliseconds, with the pieces taken.
  using Take = std::function<void(const GivenPiece& piece)>;
  std::size_t receive(int entry, std::uint64_t lack, int wait_ms, const std::vector<pid_t>& members,
                      const Take& take);
  // Takers of `entry` connected now (tests).
  std::size_t takers(int entry);

  // The message, public for tests that play a peer.
  enum class Type : std::uint16_t { hello = 1, lack = 2, pieces = 3 };
  struct Message {
    std::uint32_t magic = kMagic;
    std::uint16_t version = kVersion;
    Type type = Type::hello;
    std::uint32_t entry = 0;
    std::uint32_t count = 0;  // pieces: descriptors attached
    std::uint64_t bytes = 0;  // lack: bytes of pieces wanted
    std::uint64_t sizes[kPiecesPerMessage] = {};
  };
  static constexpr std::uint32_t kMagic = 0x50534141;  // "AASP"
  static constexpr std::uint16_t kVersion = 1;
  // The abstract socket name of process `pid` of `uid` on `channel`.
  static std::string name(uid_t uid, pid_t pid, std::uint64_t channel);

 private:
  struct Conn {
    int fd = -1;
    int entry = -1;          // -1: a taker that has not said hello
    pid_t pid = 0;           // taker side: the giver's
    std::uint64_t lack = 0;  // taker side: bytes the giver still wants; giver side: the lack told
    bool told = false;       // giver side: a lack was told
    std::uint64_t room =
        0;  // giver side: bytes of pieces still accepted from it (the lack told, less what came)
  };
  // Reads one message from `c`; false ends the connection. Pieces go to `take`.
  bool read_from_taker(Conn& c, const Take& take, std::size_t* taken);
  void accept_takers(const std::vector<pid_t>& members, std::uint64_t deadline_ns);
  void drop_closed(std::vector<Conn>& v);

  mutable std::mutex mutex_;
  int listener_ = -1;
  std::uint64_t channel_ = 0;
  std::vector<Conn> givers_;  // connections this process made, to givers
  std::vector<Conn> takers_;  // connections accepted, from takers
};

}  // namespace allocshim::node
