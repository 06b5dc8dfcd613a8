// The shared region behind a node budget (docs/oversubscription.md, "One budget per GPU across
// processes"): one file in /dev/shm per sharing scope, mapped by every process of that scope, that
// holds each device's limit and each member process's lease of it.
//
// Membership is a lock, not a pid: a process owns slot i while it holds an open-file-description
// lock (F_OFD_SETLK) on byte kSlotLockBase + i of the file. The kernel drops that lock when the
// process dies however it dies (SIGKILL included), so a dead member is recognised by F_OFD_GETLK
// without trusting pids (which are reused, and differ between pid namespaces sharing /dev/shm).
// Leases of a dead member are reclaimed by the next process that takes the region's mutex.
//
// The mutex is a process-shared robust pthread mutex inside the region: a member killed while
// holding it hands it to the next locker with EOWNERDEAD. It is taken with a timeout, so a wedged
// or hostile member can delay other processes' slow paths, never hang them. Every field is an
// atomic of its own and no field depends on another, so a member dying mid-update leaves nothing
// to repair beyond its own slot (reclaimed whole).
//
// The file is created by the first process (no daemon) and unlinked by the last one that leaves,
// under flock(2) so that a process joining at that moment never joins an unlinked file.
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "policy/types.h"

namespace allocshim::node {

inline constexpr std::size_t kSlots = 128;          // member processes per region
inline constexpr std::size_t kEntries = kMaxDevices;  // distinct GPUs per region
inline constexpr std::uint64_t kMagic = 0x31676465426c6c41ull;  // "AllBedg1"
inline constexpr std::uint32_t kLayoutVersion = 1;
inline constexpr off_t kSlotLockBase = off_t{1} << 30;  // lock bytes, past the file's end

struct Uuid {
  unsigned char bytes[16] = {};
};

// One GPU: identified by UUID (ordinals differ between processes with other CUDA_VISIBLE_DEVICES).
struct alignas(64) Entry {
  std::atomic<std::uint32_t> used{0};
  unsigned char uuid[16] = {};
  std::atomic<std::uint64_t> limit{0};  // set by the first member, while the entry has no lease
};

// One member process. lease[] is written under the mutex (by the member, or by whoever reclaims
// a dead member's slot); want[] and asked by other members asking for room, lock-free.
struct alignas(64) Slot {
  std::atomic<std::uint32_t> in_use{0};
  std::atomic<std::int32_t> pid{0};  // for people reading the region, never for liveness
  std::atomic<std::uint64_t> attached{0};  // bit e: this member uses entry e (under the mutex)
  alignas(64) std::atomic<std::uint64_t> asked{0};  // bit e: someone wants room on entry e
  alignas(64) std::atomic<std::uint64_t> lease[kEntries] = {};
  std::atomic<std::uint64_t> want[kEntries] = {};
};

struct Layout {
  std::atomic<std::uint64_t> magic;
  std::uint32_t version;
  std::uint32_t size;
  pthread_mutex_t mutex;
  Entry entries[kEntries];
  Slot slots[kSlots];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared atomics must not lock");

class Region {
 public:
  Region() = default;
  ~Region() { leave(); }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  // Joins the region at `path` (created when missing, mode `mode`; `group` >= 0 gives it to that
  // group) and claims a slot. False with `error` set when that is impossible: the file belongs to
  // someone it must not (another user, for a per-user region), has another layout, the kernel lacks
  // OFD locks, every slot is taken by a live process.
  bool join(const std::string& path, mode_t mode, gid_t group, std::string& error);
  // Gives the slot back (its leases with it) and unlinks the file if no member is left.
  void leave();
  bool joined() const { return map_ != nullptr; }
  const std::string& path() const { return path_; }

  Layout& layout() { return *map_; }
  const Layout& layout() const { return *map_; }
  Slot& mine() { return map_->slots[slot_]; }
  int slot() const { return slot_; }

  // The mutex, waited for at most `timeout_ms`. False: not taken (timed out, or unrecoverable).
  bool lock(unsigned timeout_ms);
  void unlock();
  // Whether the owner of slot `i` (not this process's) is alive. Under the mutex.
  bool alive(std::size_t i) const;
  // Clears the slots whose owners died; returns the bytes of lease they held. Under the mutex.
  std::uint64_t reclaim(std::uint64_t* processes);
  // Attaches this member to the entry of GPU `uuid` and returns it (-1: the table is full). The
  // first member attached to an entry sets its limit to `limit`; later ones keep it. Under the
  // mutex.
  int attach(const Uuid& uuid, std::uint64_t limit);

  // After fork, in the child: forgets the parent's membership without touching it (the parent's
  // lock lives on in the parent's open file description; the child closes its reference).
  void forget_after_fork();

 private:
  bool open_locked(int fd, std::string& error);

  std::string path_;
  int fd_ = -1;
  Layout* map_ = nullptr;
  int slot_ = -1;
};

}  // namespace allocshim::node
