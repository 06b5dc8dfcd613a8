// The shared region behind a node budget (docs/oversubscription.md, "One budget per GPU across
// processes"): one file per sharing scope that holds each device's limit and each member process's
// lease of it.
//
// Other processes can write the file (every member of the scope, by design), so nothing in it is
// trusted: it is never mapped (a truncated mapping faults), only read and written with pread and
// pwrite into a copy of this process's own; it holds no pointer, lock or index that is used as
// one; every read checks the file's size and header first, and every value read is used only as a
// number that is compared, summed with saturation or clamped.
//
// Two kinds of open-file-description locks (F_OFD_SETLK) on bytes past the file's end stand in for
// a mutex and for membership; the kernel drops both when their holder dies however it dies
// (SIGKILL included), so neither a dead member nor pid reuse leaves anything to repair:
// - the region lock (one byte): every read-modify-write of the file. It is only ever tried, never
//   waited on in the kernel: a caller that finds it held retries with a CLOCK_MONOTONIC deadline,
//   so a member that does not let it go (or another user holding it) delays others, never hangs them.
// - slot locks (one byte per slot): a process owns slot i while it holds byte kSlotLockBase + i;
//   whoever takes the region lock next returns a dead member's leases to the node.
//
// The file is created complete (an unnamed temporary file, sized and initialised, then linked in
// place), so a process killed while creating it leaves nothing. A file at the name that is not
// such a region (wrong size or header, a second hard link, a mode wider than the scope's) was made
// by something else: it is refused and never changed, so that a name another user prepared cannot
// make a member rewrite or re-mode a file it did not create.
#pragma once

#include <fcntl.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/types.h"
#include "os/file_io.h"

namespace allocshim::node {

inline constexpr std::size_t kSlots = 128;                      // member processes per region
inline constexpr std::size_t kEntries = kMaxDevices;            // distinct GPUs per region
inline constexpr std::uint64_t kMagic = 0x32676465426c6c41ull;  // "AllBedg2"
inline constexpr std::uint32_t kLayoutVersion = 4;
inline constexpr off_t kSlotLockBase = off_t{1} << 30;  // lock bytes, past the file's end
inline constexpr off_t kRegionLockByte = kSlotLockBase - 1;
static_assert(kEntries <= 64, "entry sets are 64-bit masks");
// An open-file-description lock request (F_WRLCK or F_UNLCK) for `len` bytes from `start`.
inline struct flock byte_lock(off_t start, off_t len, short type) {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = start;
  l.l_len = len;
  return l;
}

struct Uuid {
  unsigned char bytes[16] = {};
};

// The file's contents: plain integers, in which every bit pattern is some value.
struct Header {
  std::uint64_t magic;
  std::uint32_t version, size, slots, entries;
  std::uint64_t reserved[5];
};
// One GPU: identified by UUID (ordinals differ between processes with other CUDA_VISIBLE_DEVICES).
struct Entry {
  std::uint32_t used;
  std::uint32_t reserved;
  unsigned char uuid[16];
  std::uint64_t limit;  // set by the first member, while the entry has no other member
};
// One member process.
struct Slot {
  std::uint32_t in_use;
  std::int32_t pid;        // for people reading the region, never for liveness
  std::uint64_t attached;  // bit e: this member uses entry e
  std::uint64_t asked;     // bit e: another member wants room on entry e
  std::uint64_t
      channel;        // the random part of this member's piece channel's name (node_pieces.h), or 0
  std::uint32_t uid;  // the member's effective uid, for views (allocshim top)
  std::uint32_t flags;    // kAsleep: the member sleeps (core/sleep.h), for views
  std::uint64_t wait_ns;  // how long the member waited for room, in all (for views)
  std::uint64_t pid_ns;   // the inode of its PID namespace: `pid` is a number there (for views)
};
inline constexpr std::uint32_t kAsleep = 1;
// What a member uses of one GPU, published for views (allocshim top, node_view.h) at most every
// kPublishNs; no member reads another's.
struct Usage {
  std::uint64_t device;     // bytes backed on the device
  std::uint64_t host;       // bytes of its allocations on the host
  std::uint64_t to_device;  // bytes moved host -> device, in all
  std::uint64_t to_host;    // bytes moved device -> host, in all
};
inline constexpr std::uint64_t kPublishNs = 200000000;
// GPU time slices (node/compute_share.h): whose slice it is on one GPU. Written under the region
// lock only, by the member handing its slice on (or taking one nobody uses).
struct Slice {
  std::int32_t holder;     // the slot whose slice it is (out of range: nobody's)
  std::uint32_t seq;       // changes with every hand-over
  std::uint64_t start_ns;  // CLOCK_MONOTONIC: when the holder may begin
  std::uint64_t round_ns;  // when the round it belongs to began
  std::uint64_t reserved;
};
// What a member wants of one GPU's time; written by that member only, without the lock.
struct Demand {
  std::uint64_t want_ns;    // CLOCK_MONOTONIC of the last time it wanted the GPU (0: never)
  std::uint32_t share;      // its cap, in thousandths
  std::uint32_t priority;   // policy::Compute::Priority
  std::uint64_t used_ns;    // time in its slices, in all (views)
  std::uint64_t waited_ns;  // time its work waited for slices, in all (views)
};
struct Layout {
  Header header;
  Entry entries[kEntries];
  Slot slots[kSlots];
  std::uint64_t lease[kEntries][kSlots];  // by GPU: each member's lease of it
  std::uint64_t want[kSlots][kEntries];   // by member: the bytes others asked it for
  Usage usage[kSlots][kEntries];          // by member: what it uses of each GPU (views only)
  Slice slices[kEntries];                 // by GPU: whose slice of its time it is
  Demand demand[kEntries][kSlots];        // by GPU: what each member wants of its time
};

// Where regions live (ALLOCSHIM_SHARE_DIR, else /dev/shm) and how their names begin; the scope
// ("u<uid>", "g<gid>", "all") ends the name.
std::string share_dir();
std::string region_prefix();
// The same for the regions of GPU time slices (node/compute_share.h): one layout, files apart.
std::string compute_region_prefix();

// What an operation on the region found.
enum class Status {
  ok,
  closed,   // this process is not a member (never joined, or left)
  busy,     // the region lock is held by someone else (try again, or give up at a deadline)
  damaged,  // the file is not a region of this layout any more, or cannot be read or written
};

class Region {
 public:
  Region() = default;
  ~Region() { leave(); }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  // Who may share the file: its permission bits, and the group a per-group region belongs to
  // (-1: none) or whether it must belong to this user.
  struct Scope {
    mode_t mode;
    gid_t group;
    bool per_user;
  };
  // Joins the region at `path` (created when missing) and claims a slot, waiting for the region
  // lock up to `timeout_ms`. False with `error` set (one line) when that is impossible: a file of
  // the wrong owner, group or mode, a symbolic link, a file that is damaged while a member lives,
  // a lock not released, a kernel without OFD locks, every slot taken by a live process.
  bool join(const std::string& path, const Scope& scope, unsigned timeout_ms, std::string& error);
  // Gives the slot back (its leases with it) and removes the file if no member is left, waiting
  // for the region lock up to `timeout_ms`; without it the slot is left for the next member to
  // reclaim as a dead one's.
  void leave(unsigned timeout_ms = kLeaveTimeoutMs);
  static constexpr unsigned kLeaveTimeoutMs = 1000;  // at exit: how long another's lock delays it
  // Exchanges the two regions' memberships (a join or a leave can then wait on a Region of its
  // own while the process's mutex guards only the swap).
  void swap(Region& other) noexcept;
  bool joined() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  int slot() const { return slot_; }

  // The operations below each take the region lock, trying until `timeout_ms` passes (0: once),
  // check the file, first return the leases of members that died to the node (their count and
  // bytes are added to *dead_processes and *dead_bytes), then do their work.

  // Attaches this member to GPU `uuid`: its entry's index in *entry (-1: the table is full) and
  // the limit in force there in *limit (`mine` when this member is the entry's only one).
  Status attach(const Uuid& uuid, std::uint64_t mine, unsigned timeout_ms, int* entry,
                std::uint64_t* limit);
  struct Grow {
    std::uint64_t lease;  // this member's lease after
    std::uint64_t asks;   // members newly asked for room
    // The pids the members asked (this call's ask, newly or again) wrote in their slots, as
    // numbers another process wrote: the first kAskedPids of them.
    static constexpr std::size_t kAskedPids = 8;
    std::int32_t asked_pids[kAskedPids];
    std::uint64_t asked_channels[kAskedPids];  // their slots' channels, as written there
    std::size_t asked = 0;
  };
  // Sets this member's lease of entry `e` to as much of `target` as the limit (never more than
  // `cap`) leaves beside the others' leases, never below `lease`. With `ask`, when that falls short
  // of `need`, asks the other members holding leases there for the difference.
  Status grow(int e, std::uint64_t lease, std::uint64_t need, std::uint64_t target,
              std::uint64_t cap, bool ask, unsigned timeout_ms, Grow* out);
  // Publishes this member's lease of entry `e`.
  Status set_lease(int e, std::uint64_t bytes, unsigned timeout_ms);
  // The room entry `e` leaves this member: min(limit, cap) less the live others' leases.
  Status room(int e, std::uint64_t cap, unsigned timeout_ms, std::uint64_t* room);
  // Takes the request on entry `e` (0: none) and clears it; *pending: the request bits left.
  Status take_request(int e, unsigned timeout_ms, std::uint64_t* want, std::uint64_t* pending);
  // This member's request bits as the file has them now, without the lock (0 when unreadable):
  // a hint only, taken for real by take_request.
  std::uint64_t asked() const;
  // Publishes what this member uses of entry `e` and how long it waited for room, in all, for
  // views. Without the region lock: only this member writes these words.
  void publish(int e, const Usage& usage, std::uint64_t wait_ns, std::uint32_t flags);
  // GPU time slices (node_slices.cpp). Publishes what this member wants of entry `e`'s time,
  // without the region lock (only this member writes its demand).
  void publish_demand(int e, const Demand& demand);
  // Reads entry `e`'s slice and every member's demand of it, without the lock: numbers other
  // processes wrote, to be compared and clamped only. False when the file is no region of this
  // layout any more.
  bool read_slices(int e, Slice* slice, Demand (&demand)[kSlots]) const;
  // Whether a process holds slot `i` (its lock), whatever the file says (true when that cannot be
  // told): a demand written into a slot nobody holds is a dead member's, or a forgery.
  bool slot_held(std::size_t i) const { return fd_ >= 0 && i < kSlots && alive(i); }
  // Hands entry `e`'s slice to slot `to` from `start_ns` on, if its sequence number is still
  // `seen_seq` (*handed: whether it was; someone else handed it on first otherwise).
  Status hand_slice(int e, std::uint32_t seen_seq, int to, std::uint64_t start_ns,
                    std::uint64_t round_ns, unsigned timeout_ms, bool* handed);

  // Publishes this member's piece channel in its slot (kept there from then on).
  Status set_channel(std::uint64_t channel, unsigned timeout_ms);
  // The pids of the other members in use, as the last operation read the file (numbers other
  // processes wrote: a member's claim, never a proof).
  std::vector<pid_t> member_pids() const;

  std::uint64_t dead_processes = 0, dead_bytes = 0;

  // After fork, in the child: forgets the parent's membership without touching it (the parent's
  // locks live on in the open file description the parent keeps; the child closes its reference).
  void forget_after_fork();

 private:
  bool try_lock() const;
  bool lock(unsigned timeout_ms) const;
  void unlock() const;
  // Under the region lock: reads the file's header, entries and slots into copy_ and checks them;
  // with `e` >= 0 also the leases of entry e, with -2 everything.
  bool load(int e);
  bool valid() const;
  // Under the region lock: writes copy_'s bytes of `field` to the file, or reads them from it.
  template <class T>
  bool put(const T& field) {
    return os::pwrite_full(fd_, &field, sizeof field, offset(&field));
  }
  template <class T>
  bool get(T& field) {
    return os::pread_full(fd_, &field, sizeof field, offset(&field));
  }
  off_t offset(const void* field) const {
    return static_cast<const char*>(field) - reinterpret_cast<const char*>(copy_.get());
  }
  // What begin() reads besides the header, entries and slots: nothing (kHead), or every lease and
  // request (kAll); an entry's index reads its leases.
  static constexpr int kHead = -1, kAll = -2;
  bool alive(std::size_t i) const;
  bool any_member() const;
  void reclaim();
  // The steps every operation shares: the lock, the file, this member's slot, dead members.
  Status begin(int e, unsigned timeout_ms);
  Status begin_entry(int e, unsigned timeout_ms);
  Status end(bool ok);
  bool create(const std::string& path, const Scope& scope, std::string& error);
  // One try of join(): `again` when the file was created, or removed, meanwhile.
  enum class Attempt { joined, failed, again };
  Attempt try_join(const std::string& path, const Scope& scope, unsigned timeout_ms,
                   std::string& error);
  // Under the region lock, with a slot just taken: starts this member afresh there, its slot and
  // its leases, requests, usage and demands in the file zeroed; false if a write failed.
  bool fresh_slot();

  std::string path_;
  int fd_ = -1;
  int slot_ = -1;
  std::uint64_t attached_ = 0;  // entries this member attached to, with their UUIDs
  Uuid uuids_[kEntries];
  std::uint64_t mine_[kEntries] = {};  // this member's leases as it last wrote them
  std::uint64_t channel_ = 0;          // this member's channel as it last wrote it
  bool write_failed_ = false;          // a write of the current operation failed
  std::unique_ptr<Layout> copy_;  // this process's copy of the file, read under the region lock
};

}  // namespace allocshim::node
