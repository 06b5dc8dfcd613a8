// What the migration policy (placement/migration.h) needs of a backend whose memory can move between
// device and host at the same address: the list of what may move, with where it is now and how it
// was used, and the mechanism that moves it. The spill target (backends/host.h) is the one
// implementation; the core reaches it through Backend::movable(), never by its concrete type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "base/types.h"

namespace allocshim {

struct UseRecord;

struct MovableAllocation {
  DevPtr base = 0;
  std::size_t device_bytes = 0;    // mapped to device memory now
  std::size_t host_bytes = 0;      // mapped to host memory now
  std::uint64_t seq = 0;           // allocation order (lower: older)
  const UseRecord* use = nullptr;  // what submissions said of it (placement/use_tracker.h)
  // Filled by the policy (placement/migration.h) from `use` when it lists them: uses per epoch (x16) as
  // of the last epoch, and as an epoch ending now would count them; the last epoch it was used
  // in; shares per epoch. A snapshot, so that sorting by them sees values that do not change
  // under it (launches on other threads update the record).
  std::uint64_t rate = 0, rate_now = 0, last_epoch = 0, share_rate = 0;
};

// Where moves are accounted (the budget, core/budget.h). The policy claims the room of each piece
// a promotion moves, gives back what did not move, and reports every move.
class MoveLedger {
 public:
  // Device room for promoting up to `bytes` more on `device`: what the mechanism may move there.
  virtual std::size_t claim_promotion(int device, std::size_t bytes) = 0;
  // Device room no longer taken: a claim nothing moved into, or what a demotion moved out.
  virtual void release_device(int device, std::size_t bytes) = 0;
  virtual void on_moved(int device, DevPtr at, std::size_t bytes, bool to_device,
                        std::uint64_t ns) = 0;
  virtual void on_move_failed(int device, Result r) = 0;

 protected:
  ~MoveLedger() = default;
};

class Movable {
 public:
  // The allocations of `device` that may move (one shared with another process may not: its
  // importer maps the pieces it was sent).
  virtual void movable(int device, std::vector<MovableAllocation>& out) const = 0;
  virtual std::size_t host_bytes(int device) const = 0;
  // The bytes of pinned host pieces it keeps per device after promotions for later demotions
  // (its host reserve's bound before any turn-taking widens it; 0: none).
  virtual std::size_t host_reserve() const = 0;
  virtual std::size_t device_bytes(int device) const = 0;
  // The mechanism. Called at a safe point with the launch gate closed; each synchronizes the
  // context once more before reading a piece. promote: moves host pieces of the allocations at
  // `bases`, in that order, to the device, at most `max_bytes`, each only once `room` said yes
  // to its size (the policy claimed the room for it: a room given up by another process comes
  // free while the pieces before it move). demote: moves device pieces of them to the host until
  // at least `want_bytes` moved. Both move whole pieces, stop, losing nothing, at the first
  // refusal, and say what they did: the mechanism accounts for nothing (the policy reports the
  // moves to its ledger).
  struct Moves {
    struct Piece {
      DevPtr at = 0;
      std::size_t bytes = 0;
      std::uint64_t ns = 0;  // how long its move took
    };
    std::vector<Piece> pieces;
    std::size_t bytes = 0;
    Result failed = res::ok;  // the driver's refusal that stopped it (ok: none)
  };
  using Room = std::function<bool(std::size_t bytes)>;
  virtual Moves promote(int device, const std::vector<DevPtr>& bases, std::size_t max_bytes,
                        const Room& room) = 0;
  virtual Moves demote(int device, const std::vector<DevPtr>& bases, std::size_t want_bytes) = 0;
  // A demotion of up to `bytes` is expected on `device` once this process is idle (another one
  // asked for room, or gave room this one took over, and will ask for it; 0: none any more): the
  // host memory it needs is prepared meanwhile, within the host reserve's bound, so that the
  // demotion only copies. Whether and how much is the policy's: the mechanism reads the one value
  // the budget holds (Budget::expected_demotion) and has it forgotten when it lapses.
  virtual void expect_demotion(int device, std::size_t bytes) = 0;

  // Host pieces passed between processes of a shared budget (node_pieces.h). What a demotion on
  // `device` could take now without pinning (the host reserve and the pieces pinned ahead).
  virtual std::size_t host_spare(int device) const = 0;
  // Gives up to `max_bytes` of the host reserve's pieces away: each exported as a descriptor (the
  // caller's to send and close), no longer this process's. Returns the bytes given.
  struct Given {
    std::size_t bytes;
    int fd;
  };
  virtual std::size_t give_host(int device, std::size_t max_bytes, std::vector<Given>& out) = 0;
  // Takes a host piece of `bytes` another process gave as descriptor `fd` (closed here whatever
  // happens) into the host reserve; false if the driver refuses it or the reserve has no room.
  virtual bool adopt_host(int device, std::size_t bytes, int fd) = 0;

 protected:
  ~Movable() = default;
};

}  // namespace allocshim
