#include "core/node_region.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

namespace allocshim::node {
namespace {

// flock(2) waits are bounded too: a member stuck while holding it (it holds it only to create,
// join or unlink the file) must not hang a process that is starting.
constexpr unsigned kFlockTimeoutMs = 2000;

bool flock_bounded(int fd, int op) {
  for (unsigned waited = 0;; ++waited) {
    if (::flock(fd, op | LOCK_NB) == 0) return true;
    if (errno != EWOULDBLOCK && errno != EINTR) return false;
    if (waited >= kFlockTimeoutMs) return false;
    const timespec ms{0, 1000000};
    ::nanosleep(&ms, nullptr);
  }
}

struct flock slot_lock(std::size_t i, short type) {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = kSlotLockBase + static_cast<off_t>(i);
  l.l_len = 1;
  return l;
}

std::string why(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

}  // namespace

bool Region::join(const std::string& path, mode_t mode, gid_t group, std::string& error) {
  leave();
  path_ = path;
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0) {
      error = why(("cannot open " + path).c_str());
      return false;
    }
    if (!flock_bounded(fd, LOCK_EX)) {
      error = why(("cannot lock " + path).c_str());
      ::close(fd);
      return false;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      error = why(("cannot stat " + path).c_str());
      ::close(fd);
      return false;
    }
    if (st.st_nlink == 0) {  // the last member unlinked it between our open and our flock
      ::close(fd);
      continue;
    }
    // A region someone else could write is a region someone else controls: for a per-user or
    // per-group share, only the expected owner and group may hold it.
    const bool world = (mode & S_IWOTH) != 0;
    if (!world && (st.st_uid != ::geteuid() || (st.st_mode & S_IWOTH) != 0 ||
                   (group != static_cast<gid_t>(-1) && st.st_gid != group))) {
      error = path + " belongs to another user or group, or is writable by others: not joining it";
      ::close(fd);
      return false;
    }
    if (st.st_size == 0) {
      // New: give it the mode asked for whatever the umask, and the group.
      if (group != static_cast<gid_t>(-1) && ::fchown(fd, static_cast<uid_t>(-1), group) != 0) {
        error = why(("cannot give " + path + " to its group").c_str());
        ::close(fd);
        return false;
      }
      if (::fchmod(fd, mode) != 0 || ::ftruncate(fd, sizeof(Layout)) != 0) {
        error = why(("cannot size " + path).c_str());
        ::close(fd);
        return false;
      }
    }
    const bool ok = open_locked(fd, error);
    ::flock(fd, LOCK_UN);
    if (!ok) {
      if (map_) ::munmap(map_, sizeof(Layout));
      map_ = nullptr;
      ::close(fd);
      return false;
    }
    fd_ = fd;
    return true;
  }
  error = path + " keeps being replaced: not joining it";
  return false;
}

// With the file flocked: maps it, initialises it if nobody did, claims a slot.
bool Region::open_locked(int fd, std::string& error) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size != static_cast<off_t>(sizeof(Layout))) {
    error = path_ + ": not an allocshim budget region of this version (size differs)";
    return false;
  }
  void* p = ::mmap(nullptr, sizeof(Layout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    error = why("cannot map the budget region");
    return false;
  }
  map_ = static_cast<Layout*>(p);
  if (map_->magic.load(std::memory_order_acquire) != kMagic) {
    // Never initialised, or its creator died before finishing (it held the flock, so nobody
    // joined it since): initialise it now.
    new (map_) Layout{};
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&map_->mutex, &a);
    pthread_mutexattr_destroy(&a);
    map_->version = kLayoutVersion;
    map_->size = sizeof(Layout);
    map_->magic.store(kMagic, std::memory_order_release);
  } else if (map_->version != kLayoutVersion || map_->size != sizeof(Layout)) {
    error = "the budget region has another layout (another allocshim version)";
    return false;
  }
  // A slot is ours when we hold its lock; a slot whose lock nobody holds is free or its owner is
  // dead (then its leases are reclaimed below, under the mutex).
  for (std::size_t i = 0; i < kSlots; ++i) {
    struct flock l = slot_lock(i, F_WRLCK);
    if (::fcntl(fd, F_OFD_SETLK, &l) == 0) {
      slot_ = static_cast<int>(i);
      break;
    }
    if (errno == EINVAL) {
      error = "the kernel has no open file description locks (Linux 3.15 or later is needed)";
      return false;
    }
  }
  if (slot_ < 0) {
    error = "every slot of the budget region is taken by a live process";
    return false;
  }
  fd_ = fd;
  if (!lock(kFlockTimeoutMs)) {
    error = "the budget region's mutex is held by a process that does not let it go";
    struct flock l = slot_lock(static_cast<std::size_t>(slot_), F_UNLCK);
    ::fcntl(fd, F_OFD_SETLK, &l);
    slot_ = -1;
    fd_ = -1;
    return false;
  }
  reclaim(nullptr);
  Slot& s = mine();
  for (std::size_t e = 0; e < kEntries; ++e) {
    s.lease[e].store(0, std::memory_order_relaxed);
    s.want[e].store(0, std::memory_order_relaxed);
  }
  s.asked.store(0, std::memory_order_relaxed);
  s.attached.store(0, std::memory_order_relaxed);
  s.pid.store(static_cast<std::int32_t>(::getpid()), std::memory_order_relaxed);
  s.in_use.store(1, std::memory_order_release);
  unlock();
  return true;
}

void Region::leave() {
  if (!map_) return;
  if (slot_ >= 0 && lock(kFlockTimeoutMs)) {
    Slot& s = mine();
    for (std::size_t e = 0; e < kEntries; ++e) s.lease[e].store(0, std::memory_order_relaxed);
    s.attached.store(0, std::memory_order_relaxed);
    s.in_use.store(0, std::memory_order_release);
    unlock();
  }
  // If the mutex could not be taken, the slot stays in_use: its lock goes with our descriptor
  // below, and the next member reclaims it as a dead one's.
  if (slot_ >= 0) {
    struct flock l = slot_lock(static_cast<std::size_t>(slot_), F_UNLCK);
    ::fcntl(fd_, F_OFD_SETLK, &l);
  }
  // The last member out removes the file: no live slot lock anywhere (one query over every slot
  // byte), checked under the flock a joiner takes before claiming a slot.
  if (flock_bounded(fd_, LOCK_EX)) {
    struct flock l {};
    l.l_type = F_WRLCK;
    l.l_whence = SEEK_SET;
    l.l_start = kSlotLockBase;
    l.l_len = static_cast<off_t>(kSlots);
    if (::fcntl(fd_, F_OFD_GETLK, &l) == 0 && l.l_type == F_UNLCK) ::unlink(path_.c_str());
    ::flock(fd_, LOCK_UN);
  }
  ::munmap(map_, sizeof(Layout));
  ::close(fd_);
  map_ = nullptr;
  fd_ = -1;
  slot_ = -1;
}

void Region::forget_after_fork() {
  if (!map_) return;
  ::munmap(map_, sizeof(Layout));
  ::close(fd_);  // the lock stays with the parent, which holds the same open file description
  map_ = nullptr;
  fd_ = -1;
  slot_ = -1;
}

bool Region::lock(unsigned timeout_ms) {
  timespec deadline{};
  ::clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += timeout_ms / 1000;
  deadline.tv_nsec += static_cast<long>(timeout_ms % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    ++deadline.tv_sec;
    deadline.tv_nsec -= 1000000000L;
  }
  int r;
  while ((r = pthread_mutex_timedlock(&map_->mutex, &deadline)) == EINTR) {
  }
  if (r == EOWNERDEAD) {
    // Its holder died inside a slow path. Each field stands alone; the dead member's slot is
    // reclaimed like any dead member's.
    pthread_mutex_consistent(&map_->mutex);
    return true;
  }
  return r == 0;
}

void Region::unlock() { pthread_mutex_unlock(&map_->mutex); }

bool Region::alive(std::size_t i) const {
  struct flock l = slot_lock(i, F_WRLCK);
  if (::fcntl(fd_, F_OFD_GETLK, &l) != 0) return true;  // cannot tell: keep it
  return l.l_type != F_UNLCK;
}

std::uint64_t Region::reclaim(std::uint64_t* processes) {
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < kSlots; ++i) {
    if (static_cast<int>(i) == slot_) continue;
    Slot& s = map_->slots[i];
    if (s.in_use.load(std::memory_order_acquire) == 0 || alive(i)) continue;
    for (std::size_t e = 0; e < kEntries; ++e) {
      bytes += s.lease[e].exchange(0, std::memory_order_relaxed);
      s.want[e].store(0, std::memory_order_relaxed);
    }
    s.asked.store(0, std::memory_order_relaxed);
    s.attached.store(0, std::memory_order_relaxed);
    s.in_use.store(0, std::memory_order_release);
    if (processes) ++*processes;
  }
  return bytes;
}

int Region::attach(const Uuid& uuid, std::uint64_t limit) {
  int found = -1, free_entry = -1;
  for (std::size_t e = 0; e < kEntries && found < 0; ++e) {
    Entry& x = map_->entries[e];
    if (x.used.load(std::memory_order_acquire) == 0) {
      if (free_entry < 0) free_entry = static_cast<int>(e);
    } else if (std::memcmp(x.uuid, uuid.bytes, sizeof x.uuid) == 0) {
      found = static_cast<int>(e);
    }
  }
  if (found < 0) {
    if (free_entry < 0) return -1;
    found = free_entry;
    Entry& x = map_->entries[found];
    std::memcpy(x.uuid, uuid.bytes, sizeof x.uuid);
    x.used.store(1, std::memory_order_release);
  }
  const std::uint64_t bit = std::uint64_t{1} << found;
  bool others = false;
  for (std::size_t i = 0; i < kSlots && !others; ++i)
    others = static_cast<int>(i) != slot_ && map_->slots[i].in_use.load(std::memory_order_acquire) &&
             (map_->slots[i].attached.load(std::memory_order_relaxed) & bit) != 0;
  if (!others) map_->entries[found].limit.store(limit, std::memory_order_relaxed);
  mine().attached.fetch_or(bit, std::memory_order_relaxed);
  return found;
}

}  // namespace allocshim::node
