#include "node/node_region.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <utility>

#include "os/env.h"
#include "os/file_io.h"

namespace allocshim::node {
namespace {

using os::pread_full;
using os::pwrite_full;

constexpr long kFirstPauseNs = 20000, kMaxPauseNs = 1000000;
// What every operation reads: the header, the entries and the slots; the leases and requests
// are read one GPU's column or one word at a time.
constexpr std::size_t kHeadBytes = offsetof(Layout, lease);

struct flock byte_lock(off_t start, off_t len, short type) {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = start;
  l.l_len = len;
  return l;
}

std::uint64_t monotonic_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::uint64_t>(t.tv_sec) * 1000000000u + static_cast<std::uint64_t>(t.tv_nsec);
}

std::uint64_t add_sat(std::uint64_t a, std::uint64_t b) {
  return a + b < a ? ~std::uint64_t{0} : a + b;
}

std::string why(const std::string& what) { return what + ": " + std::strerror(errno); }

void fresh(Layout& l) {
  std::memset(&l, 0, sizeof l);
  l.header.magic = kMagic;
  l.header.version = kLayoutVersion;
  l.header.size = sizeof(Layout);
  l.header.slots = kSlots;
  l.header.entries = kEntries;
}

// Why the file open at `fd` is not one this shim made for `scope` (empty: nothing says so).
std::string foreign(const std::string& path, const Region::Scope& scope, int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return why("cannot stat " + path);
  if (!S_ISREG(st.st_mode)) return path + " is not a regular file";
  // A region is created with one name (linked once, complete): a second name is someone else's
  // hard link, perhaps to a file that is not a region at all. Nothing in it is changed.
  if (st.st_nlink > 1)
    return path + " has " + std::to_string(st.st_nlink) +
           " names (hard links): not a region this shim made; not touching it";
  // A region someone else could write is a region someone else controls: only the scope's
  // owner (a per-user region) or group (a per-group one), and no one beyond the mode, may.
  if (scope.per_user && st.st_uid != ::geteuid())
    return path + " belongs to uid " + std::to_string(st.st_uid) + ", not this user (uid " +
           std::to_string(::geteuid()) + ")";
  if (scope.group != static_cast<gid_t>(-1) && st.st_gid != scope.group)
    return path + " belongs to group " + std::to_string(st.st_gid) + ", not " +
           std::to_string(scope.group);
  // The mode is never changed: a region has the mode it was created with, and a file with
  // another is not one this shim made for the scope.
  const mode_t want = scope.mode & 0666, have = st.st_mode & 0666;
  if ((have & ~want) != 0) {
    char m[8];
    std::snprintf(m, sizeof m, "%03o", static_cast<unsigned>(have));
    return path + " has mode " + m + ", open to users outside its scope";
  }
  return {};
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

// Creates the file complete or not at all: an unnamed file (O_TMPFILE; else one named after this
// process) given its group, mode and contents, then linked at `path`. Losing the race to another
// creator is success: the caller opens theirs.
bool Region::create(const std::string& path, const Scope& scope, std::string& error) {
  const std::size_t cut = path.rfind('/');
  const std::string dir = cut == std::string::npos ? "." : cut == 0 ? "/" : path.substr(0, cut);
  const mode_t mode = scope.mode & 0666;
  std::string temp;
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, mode);
  if (fd < 0 && errno != ENOENT && errno != EACCES) {  // a file system without O_TMPFILE
    temp = path + ".new-" + std::to_string(::getpid());
    fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  }
  if (fd < 0) {
    error = why("cannot create " + path);
    return false;
  }
  bool ok = true;
  if (scope.group != static_cast<gid_t>(-1) &&
      ::fchown(fd, static_cast<uid_t>(-1), scope.group) != 0) {
    error = why("cannot give " + path + " to group " + std::to_string(scope.group));
    ok = false;
  } else if (::fchmod(fd, mode) != 0) {  // the mode asked for, whatever the umask
    error = why("cannot set the mode of " + path);
    ok = false;
  } else {
    fresh(*copy_);
    if (!pwrite_full(fd, copy_.get(), sizeof(Layout), 0)) {
      error = why("cannot write " + path);
      ok = false;
    }
  }
  if (ok) {
    int r;
    if (temp.empty()) {
      const std::string self = "/proc/self/fd/" + std::to_string(fd);
      r = ::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW);
    } else {
      r = ::link(temp.c_str(), path.c_str());
    }
    if (r != 0 && errno != EEXIST) {
      error = why("cannot create " + path);
      ok = false;
    }
  }
  if (!temp.empty()) ::unlink(temp.c_str());
  ::close(fd);
  return ok;
}

bool Region::join(const std::string& path, const Scope& scope, unsigned timeout_ms,
                  std::string& error) {
  leave();
  path_ = path;
  if (!copy_) copy_.reset(new (std::nothrow) Layout);
  if (!copy_) {
    error = "no memory for the budget region's copy";
    return false;
  }
  for (int attempt = 0; attempt < 8; ++attempt)
    if (const Attempt a = try_join(path, scope, timeout_ms, error); a != Attempt::again)
      return a == Attempt::joined;
  error = path + " keeps being replaced: not joining it";
  return false;
}

Region::Attempt Region::try_join(const std::string& path, const Scope& scope, unsigned timeout_ms,
                                 std::string& error) {
  const int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT)
    return create(path, scope, error) ? Attempt::again : Attempt::failed;
  if (fd < 0) {
    error = errno == ELOOP ? path + " is a symbolic link: not following it"
                           : why("cannot open " + path);
    return Attempt::failed;
  }
  fd_ = fd;
  const auto fail = [&](std::string text) {
    error = std::move(text);
    ::close(fd_);
    fd_ = -1;
    return Attempt::failed;
  };
  if (std::string refused = foreign(path, scope, fd); !refused.empty())
    return fail(std::move(refused));
  if (!lock(timeout_ms))
    return fail(
        errno == EINVAL
            ? std::string("the kernel has no open file description locks (Linux 3.15 or later)")
            : path + ": its lock is held by a process that does not release it");
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_nlink == 0) {  // the last member removed it meanwhile
    unlock();
    ::close(fd_);
    fd_ = -1;
    return Attempt::again;
  }
  // Only a file that proves to be a region (its size and header) is joined; anything else is
  // left as it is, never rebuilt: the shim creates regions complete, so it made no other file.
  if (!load(kAll)) {
    unlock();
    return fail(path + " is not a budget region (wrong size or header): not touching it" +
                (any_member() ? "" : "; remove it to share this budget again"));
  }
  for (std::size_t i = 0; i < kSlots && slot_ < 0; ++i) {
    struct flock l = byte_lock(kSlotLockBase + static_cast<off_t>(i), 1, F_WRLCK);
    if (::fcntl(fd, F_OFD_SETLK, &l) == 0) slot_ = static_cast<int>(i);
  }
  if (slot_ < 0) {
    unlock();
    return fail("every slot of " + path + " is taken by a live process");
  }
  const bool ok = fresh_slot();
  unlock();
  if (!ok) {
    const std::string text = why("cannot write " + path);
    leave();
    error = text;
    return Attempt::failed;
  }
  return Attempt::joined;
}

bool Region::fresh_slot() {
  attached_ = 0;
  std::fill(std::begin(mine_), std::end(mine_), 0);
  channel_ = 0;
  reclaim();
  Layout& r = *copy_;
  Slot& s = r.slots[slot_];
  std::memset(&s, 0, sizeof s);
  s.in_use = 1;
  s.pid = static_cast<std::int32_t>(::getpid());
  s.uid = static_cast<std::uint32_t>(::geteuid());
  struct stat ns {};
  s.pid_ns = ::stat("/proc/self/ns/pid", &ns) == 0 ? static_cast<std::uint64_t>(ns.st_ino) : 0;
  std::memset(r.want[slot_], 0, sizeof r.want[slot_]);
  std::memset(r.usage[slot_], 0, sizeof r.usage[slot_]);
  bool ok = true;
  for (std::size_t e = 0; e < kEntries; ++e) {
    r.lease[e][slot_] = 0;
    r.demand[e][slot_] = Demand{};
    ok = put(r.demand[e][slot_]) && ok;
  }
  return put(r.lease) && put(r.want[slot_]) && put(r.usage[slot_]) && put(s) && ok;
}

void Region::leave(unsigned timeout_ms) {
  if (fd_ < 0) return;
  const struct flock mine = byte_lock(kSlotLockBase + slot_, 1, F_UNLCK);
  if (slot_ >= 0 && lock(timeout_ms)) {
    if (load(kHead)) {
      Layout& r = *copy_;
      for (std::size_t e = 0; e < kEntries; ++e)
        if ((attached_ >> e) & 1) {
          r.lease[e][slot_] = 0;
          put(r.lease[e][slot_]);
          r.demand[e][slot_] = Demand{};
          put(r.demand[e][slot_]);
        }
      std::memset(r.want[slot_], 0, sizeof r.want[slot_]);
      std::memset(r.usage[slot_], 0, sizeof r.usage[slot_]);
      std::memset(&r.slots[slot_], 0, sizeof(Slot));
      put(r.want[slot_]);
      put(r.usage[slot_]);
      put(r.slots[slot_]);
    }
    struct flock l = mine;
    ::fcntl(fd_, F_OFD_SETLK, &l);
    // The last member out removes the file, if the name still is this file: no live slot lock
    // anywhere, checked under the region lock a joiner takes before it claims a slot.
    struct stat a {
    }, b{};
    if (!any_member() && ::fstat(fd_, &a) == 0 && ::lstat(path_.c_str(), &b) == 0 &&
        a.st_dev == b.st_dev && a.st_ino == b.st_ino)
      ::unlink(path_.c_str());
    unlock();
  } else if (slot_ >= 0) {
    // Without the lock the slot stays as it is: the next member reclaims it as a dead one's.
    struct flock l = mine;
    ::fcntl(fd_, F_OFD_SETLK, &l);
  }
  ::close(fd_);
  fd_ = -1;
  slot_ = -1;
  attached_ = 0;
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

void Region::forget_after_fork() {
  if (fd_ < 0) return;
  ::close(fd_);  // the locks stay with the parent, which holds the same open file description
  fd_ = -1;
  slot_ = -1;
  attached_ = 0;
}

}  // namespace allocshim::node
