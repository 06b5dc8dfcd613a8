#include "node/node_region.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "os/env.h"
#include "os/file_io.h"

namespace allocshim::node {
namespace {

using os::pread_full;

constexpr long kFirstPauseNs = 20000, kMaxPauseNs = 1000000;
// What every operation reads: the header, the entries and the slots; the leases and requests
// are read one GPU's column or one word at a time.
constexpr std::size_t kHeadBytes = offsetof(Layout, lease);

std::uint64_t monotonic_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::uint64_t>(t.tv_sec) * 1000000000u + static_cast<std::uint64_t>(t.tv_nsec);
}

std::uint64_t add_sat(std::uint64_t a, std::uint64_t b) {
  return a + b < a ? ~std::uint64_t{0} : a + b;
}

}  // namespace

std::string share_dir() {
  const char* dir = os::env("ALLOCSHIM_SHARE_DIR");
  return dir && *dir ? dir : "/dev/shm";
}

std::string region_prefix() { return "allocshim-budget-v" + std::to_string(kLayoutVersion) + "-"; }

std::string compute_region_prefix() {
  return "allocshim-compute-v" + std::to_string(kLayoutVersion) + "-";
}

bool Region::try_lock() const {
  struct flock l = byte_lock(kRegionLockByte, 1, F_WRLCK);
  return ::fcntl(fd_, F_OFD_SETLK, &l) == 0;
}

bool Region::lock(unsigned timeout_ms) const {
  if (try_lock()) return true;
  const std::uint64_t deadline = monotonic_ns() + std::uint64_t{timeout_ms} * 1000000u;
  for (long pause = kFirstPauseNs;; pause = std::min(pause * 2, kMaxPauseNs)) {
    if (errno != EAGAIN && errno != EACCES && errno != EINTR) return false;
    const std::uint64_t now = monotonic_ns();
    if (now >= deadline) return false;
    const timespec t{0, static_cast<long>(std::min<std::uint64_t>(static_cast<std::uint64_t>(pause),
                                                                  deadline - now))};
    ::nanosleep(&t, nullptr);
    if (try_lock()) return true;
  }
}

void Region::unlock() const {
  struct flock l = byte_lock(kRegionLockByte, 1, F_UNLCK);
  ::fcntl(fd_, F_OFD_SETLK, &l);
}

bool Region::valid() const {
  const Header& h = copy_->header;
  return h.magic == kMagic && h.version == kLayoutVersion && h.size == sizeof(Layout) &&
         h.slots == kSlots && h.entries == kEntries;
}

bool Region::load(int e) {
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || st.st_nlink == 0 ||
      st.st_size != static_cast<off_t>(sizeof(Layout)))
    return false;
  if (!pread_full(fd_, copy_.get(), kHeadBytes, 0) || !valid()) return false;
  if (e == kAll) return pread_full(fd_, copy_->lease, sizeof(Layout) - kHeadBytes, kHeadBytes);
  return e < 0 || get(copy_->lease[e]);
}

bool Region::alive(std::size_t i) const {
  struct flock l = byte_lock(kSlotLockBase + static_cast<off_t>(i), 1, F_WRLCK);
  if (::fcntl(fd_, F_OFD_GETLK, &l) != 0) return true;  // cannot tell: keep it
  return l.l_type != F_UNLCK;
}

bool Region::any_member() const {
  struct flock l = byte_lock(kSlotLockBase, static_cast<off_t>(kSlots), F_WRLCK);
  if (::fcntl(fd_, F_OFD_GETLK, &l) != 0) return true;
  return l.l_type != F_UNLCK;
}

// Zeroes every slot whose owner is gone. Only slots that say they are used are asked about (one
// fcntl each); the leases are read whole only when one is found, which is rare.
void Region::reclaim() {
  Layout& r = *copy_;
  bool dead[kSlots] = {};
  bool any = false;
  for (std::size_t i = 0; i < kSlots; ++i) {
    const Slot& s = r.slots[i];
    if (static_cast<int>(i) == slot_ || (s.in_use == 0 && s.attached == 0 && s.asked == 0))
      continue;
    dead[i] = !alive(i);
    any = any || dead[i];
  }
  if (!any) return;
  if (!pread_full(fd_, r.lease, sizeof(Layout) - kHeadBytes, kHeadBytes)) {
    write_failed_ = true;
    return;
  }
  for (std::size_t i = 0; i < kSlots; ++i) {
    if (!dead[i]) continue;
    // Counted as at most the GPU's limit: a lease past it (another process's scribble) is no
    // count of bytes anyone held, and an entry not in use holds nothing.
    std::uint64_t held = 0;
    for (std::size_t e = 0; e < kEntries; ++e) {
      const std::uint64_t most = r.entries[e].used != 0 ? r.entries[e].limit : 0;
      held = add_sat(held, std::min(r.lease[e][i], most));
      r.lease[e][i] = 0;
    }
    if (r.slots[i].in_use != 0) ++dead_processes;
    dead_bytes = add_sat(dead_bytes, held);
    std::memset(&r.slots[i], 0, sizeof(Slot));
    std::memset(r.want[i], 0, sizeof r.want[i]);
    std::memset(r.usage[i], 0, sizeof r.usage[i]);
    for (std::size_t e = 0; e < kEntries; ++e) {
      r.demand[e][i] = Demand{};
      write_failed_ |= !put(r.demand[e][i]);
    }
    write_failed_ |= !put(r.slots[i]);
    write_failed_ |= !put(r.want[i]);
    write_failed_ |= !put(r.usage[i]);
  }
  write_failed_ |= !put(r.lease);
}

Status Region::begin(int e, unsigned timeout_ms) {
  if (fd_ < 0 || slot_ < 0) return Status::closed;
  if (!lock(timeout_ms)) return Status::busy;
  write_failed_ = false;
  if (!load(e)) return end(false);
  // This slot is ours (we hold its lock): whatever others wrote into our part is put right.
  Slot& s = copy_->slots[slot_];
  const std::uint32_t uid = static_cast<std::uint32_t>(::geteuid());
  if (s.in_use != 1 || s.attached != attached_ || s.channel != channel_ || s.uid != uid) {
    s.in_use = 1;
    s.attached = attached_;
    s.channel = channel_;
    s.uid = uid;
    s.pid = static_cast<std::int32_t>(::getpid());
    write_failed_ |= !put(s);
  }
  if (e >= 0 && copy_->lease[e][slot_] != mine_[e]) {
    copy_->lease[e][slot_] = mine_[e];
    write_failed_ |= !put(copy_->lease[e][slot_]);
  }
  reclaim();
  return Status::ok;
}

Status Region::begin_entry(int e, unsigned timeout_ms) {
  if (fd_ < 0) return Status::closed;
  if (e < 0 || static_cast<std::size_t>(e) >= kEntries ||
      (attached_ & (std::uint64_t{1} << e)) == 0)
    return Status::damaged;
  const Status st = begin(e, timeout_ms);
  if (st != Status::ok) return st;
  const Entry& x = copy_->entries[e];
  if (x.used == 0 || std::memcmp(x.uuid, uuids_[e].bytes, sizeof x.uuid) != 0) return end(false);
  return Status::ok;
}

Status Region::end(bool ok) {
  unlock();
  return ok && !write_failed_ ? Status::ok : Status::damaged;
}

void Region::swap(Region& o) noexcept {
  std::swap(path_, o.path_);
  std::swap(fd_, o.fd_);
  std::swap(slot_, o.slot_);
  std::swap(attached_, o.attached_);
  std::swap(uuids_, o.uuids_);
  std::swap(mine_, o.mine_);
  std::swap(channel_, o.channel_);
  std::swap(write_failed_, o.write_failed_);
  std::swap(copy_, o.copy_);
  std::swap(dead_processes, o.dead_processes);
  std::swap(dead_bytes, o.dead_bytes);
}

}  // namespace allocshim::node
