// Host pieces passed between the members of a shared budget (docs/design/oversubscription.md,
// "Passing host pieces"): a process taking room over sends the pinned host pieces its promotions
// free to the member demoting for it, which demotes into them instead of pinning its own (pinning
// is what a demotion costs; importing a piece costs almost nothing).
//
// Each member listens on an abstract socket named from its uid and pid (os/unix_socket.h). A taker
// connects to the members it asked for room and checks that the peer is the member's process
// (uid and pid), so that a process squatting the name never gets the pieces, which hold the
// taker's data; it says which GPU (region entry) it takes room on. A giver accepts only peers of its
// own uid, tells each taker how many bytes of host pieces its demotion lacks, and takes what comes
// back as descriptors. Only processes of one user pass pieces: one of a group or node budget run by
// another user pins its own.
//
//   taker: Hello{entry}                        giver: Lack{entry, bytes}
//   taker: Pieces{entry, count, sizes}, count descriptors attached (as many as the lack allows)
//
// Nothing a peer sends is trusted beyond its size: a message of the wrong length, magic, version or
// type, or with the wrong number of descriptors, ends that connection; a piece the driver refuses to
// import is closed. Slow path only (safe points that move memory); never blocks longer than a
// caller's wait, and a lock another thread holds makes a call do nothing rather than wait.
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

  // Listens under this process's name; false if it cannot (another process holds the name: then
  // nobody passes this process pieces, and its demotions pin their own).
  bool listen();
  // Closes every socket (at exit).
  void close();
  // In a forked child (single-threaded; the parent may have held the lock at fork): closes the
  // child's copies of the sockets; the parent's stay.
  void forget_after_fork() {
    new (&mutex_) std::mutex;
    close();
  }

  // Taker side. Connects to member `pid` about region entry `entry`, unless connected already.
  void connect(int entry, pid_t pid);
  // Reads what the givers of `entry` lack, and for each lack calls `give(bytes, pieces)`, which
  // fills `pieces` with up to `bytes` of host pieces; sends them. Returns the bytes sent.
  using Give = std::function<void(std::uint64_t bytes, std::vector<GivenPiece>& pieces)>;
  std::uint64_t offer(int entry, const Give& give);
  // Ends the connections about `entry` (the take-over is over).
  void disconnect(int entry);
  bool connected(int entry);

  // Giver side. Accepts pending takers, tells those of `entry` that its demotion lacks `lack`
  // bytes of host pieces (once per change), then hands every piece they sent to `take` (which owns
  // its descriptor), waiting up to `wait_ms` for some if none came and a taker of `entry` is
  // connected. Returns the pieces taken.
  using Take = std::function<void(const GivenPiece& piece)>;
  std::size_t receive(int entry, std::uint64_t lack, int wait_ms, const Take& take);
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
  // The abstract socket name of process `pid` of `uid`.
  static std::string name(uid_t uid, pid_t pid);

 private:
  struct Conn {
    int fd = -1;
    int entry = -1;      // -1: a taker that has not said hello
    pid_t pid = 0;       // taker side: the giver's
    std::uint64_t lack = 0;  // taker side: bytes the giver still wants; giver side: the lack told
    bool told = false;   // giver side: a lack was told
  };
  // Reads one message from `c`; false ends the connection. Pieces go to `take`.
  bool read_from_taker(Conn& c, const Take& take, std::size_t* taken);
  void drop_closed(std::vector<Conn>& v);

  mutable std::mutex mutex_;
  int listener_ = -1;
  std::vector<Conn> givers_;  // connections this process made, to givers
  std::vector<Conn> takers_;  // connections accepted, from takers
};

}  // namespace allocshim::node
