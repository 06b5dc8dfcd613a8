// Membership of the region (node/node_region.h): the file created complete, checked before it is
// joined, a slot claimed and started afresh; the slot given back, and the file removed by the last
// member out. node_region.cpp keeps the region lock and what every operation shares.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "node/node_region.h"
#include "os/file_io.h"

namespace allocshim::node {
namespace {

using os::pwrite_full;

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

void Region::forget_after_fork() {
  if (fd_ < 0) return;
  ::close(fd_);  // the locks stay with the parent, which holds the same open file description
  fd_ = -1;
  slot_ = -1;
  attached_ = 0;
}

}  // namespace allocshim::node
