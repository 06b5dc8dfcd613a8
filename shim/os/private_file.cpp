#include "os/private_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>

namespace allocshim::os {
namespace {

// Longest chain of symbolic links followed on the way, as the kernel's own limit (MAXSYMLINKS).
constexpr int kMaxLinks = 40;

std::string failure(const std::string& path, const char* what, int err) {
  return path + ": " + what + " (" + std::strerror(err) + ")";
}

// Closes the descriptor it holds when it goes.
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  void reset(int f) {
    if (fd >= 0) ::close(fd);
    fd = f;
  }
  int release() {
    const int f = fd;
    fd = -1;
    return f;
  }
};

void split(const std::string& text, std::deque<std::string>& out, bool front) {
  std::deque<std::string> parts;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t slash = text.find('/', at);
    const std::size_t end = slash == std::string::npos ? text.size() : slash;
    if (end > at) parts.push_back(text.substr(at, end - at));
    if (slash == std::string::npos) break;
    at = slash + 1;
  }
  if (front)
    out.insert(out.begin(), parts.begin(), parts.end());
  else
    out.insert(out.end(), parts.begin(), parts.end());
}

// A random name beside the file, made and opened with O_EXCL by the caller.
std::string temp_name(const std::string& name) {
  unsigned char r[6] = {};
  if (::getrandom(r, sizeof r, 0) != static_cast<ssize_t>(sizeof r)) {
    const unsigned long v =
        static_cast<unsigned long>(::getpid()) ^ static_cast<unsigned long>(::time(nullptr));
    std::memcpy(r, &v, sizeof r < sizeof v ? sizeof r : sizeof v);
  }
  char hex[16];
  std::snprintf(hex, sizeof hex, "%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2], r[3], r[4], r[5]);
  return "." + name + "." + hex;
}

}  // namespace

int open_parent(const std::string& path, std::string& name, std::string& error) {
  std::deque<std::string> todo;
  split(path, todo, false);
  if (todo.empty() || path.back() == '/' || todo.back() == "." || todo.back() == "..") {
    error = path + ": not a file name; nothing written";
    return -1;
  }
  name = todo.back();
  todo.pop_back();
  Fd dir(::open(path[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (dir.fd < 0) {
    error = failure(path, "cannot open its first directory", errno);
    return -1;
  }
  std::string walked = path[0] == '/' ? "" : ".";
  int links = 0;
  while (!todo.empty()) {
    const std::string part = todo.front();
    todo.pop_front();
    if (part == ".") continue;
    walked += "/" + part;
    Fd next(::openat(dir.fd, part.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    struct stat st;
    if (next.fd < 0 || ::fstat(next.fd, &st) != 0) {
      error = failure(path, ("cannot open " + walked).c_str(), errno);
      return -1;
    }
    if (S_ISDIR(st.st_mode)) {
      dir.reset(next.release());
      continue;
    }
    if (!S_ISLNK(st.st_mode)) {
      error = path + ": " + walked + " is not a directory; nothing written";
      return -1;
    }
    // A link is followed only where no other user can have made it: its owner is the one who
    // created it, and only root can make one that another user owns.
    if (st.st_uid != 0 && st.st_uid != ::geteuid()) {
      error = path + ": " + walked + " is a symbolic link of uid " + std::to_string(st.st_uid) +
              " (neither root nor this process's uid " + std::to_string(::geteuid()) +
              "); not followed, nothing written";
      return -1;
    }
    if (++links > kMaxLinks) {
      error = failure(path, "too many symbolic links on the way", ELOOP);
      return -1;
    }
    char target[4096];
    const ssize_t n = ::readlinkat(next.fd, "", target, sizeof target);
    if (n <= 0 || static_cast<std::size_t>(n) >= sizeof target) {
      error =
          failure(path, ("cannot read the link " + walked).c_str(), n < 0 ? errno : ENAMETOOLONG);
      return -1;
    }
    const std::string to(target, static_cast<std::size_t>(n));
    if (to[0] == '/') {
      dir.reset(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (dir.fd < 0) {
        error = failure(path, "cannot open /", errno);
        return -1;
      }
    }
    split(to, todo, true);
  }
  return dir.release();
}

namespace {

// A new file beside `name`, renamed over it: rename(2) replaces the name, whatever it named, and
// never writes through it.
PrivateFile replace(int dir, const std::string& path, const std::string& name) {
  PrivateFile f;
  for (int attempt = 0; attempt < 4 && f.fd < 0; ++attempt) {
    const std::string temp = temp_name(name);
    const int fd =
        ::openat(dir, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      f.error = failure(path, "cannot create a new file beside it", errno);
      return f;
    }
    if (::renameat(dir, temp.c_str(), dir, name.c_str()) != 0) {
      f.error = failure(path, "cannot replace it", errno);
      ::unlinkat(dir, temp.c_str(), 0);
      ::close(fd);
      return f;
    }
    f.fd = fd;
  }
  if (f.fd < 0 && f.error.empty())
    f.error = path + ": cannot make a new name beside it; nothing written";
  return f;
}

}  // namespace

PrivateFile create_private(const std::string& path) {
  PrivateFile f;
  std::string name;
  Fd dir(open_parent(path, name, f.error));
  if (dir.fd < 0) return f;
  // Twice at most: a file that appears between the check and O_EXCL is judged like any other.
  for (int attempt = 0; attempt < 2 && f.fd < 0; ++attempt) {
    struct stat st;
    if (::fstatat(dir.fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) {
        f.error = failure(path, "cannot look at it", errno);
        return f;
      }
      f.fd = ::openat(dir.fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                      0600);
      if (f.fd < 0 && errno != EEXIST) {
        f.error = failure(path, "cannot create it", errno);
        return f;
      }
      continue;
    }
    if (S_ISLNK(st.st_mode)) {
      f.error = path + ": is a symbolic link; not followed, nothing written";
      return f;
    }
    if (!S_ISREG(st.st_mode)) {
      f.error = path + ": is not a regular file; nothing written";
      return f;
    }
    if (st.st_uid != ::geteuid()) {
      f.error = path + ": belongs to uid " + std::to_string(st.st_uid) +
                ", not to this process's uid " + std::to_string(::geteuid()) + "; nothing written";
      return f;
    }
    f = replace(dir.fd, path, name);
    if (f.fd < 0) return f;
  }
  if (f.fd < 0) {
    f.error = path + ": created by another process meanwhile; nothing written";
    return f;
  }
  // The umask may have taken bits off 0600; group and others never get any.
  if (::fchmod(f.fd, 0600) != 0) f.error = failure(path, "cannot set mode 0600", errno);
  return f;
}

bool write_all(int fd, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t w = ::write(fd, p, bytes);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = EIO;
      return false;
    }
    p += w;
    bytes -= static_cast<std::size_t>(w);
  }
  return true;
}

}  // namespace allocshim::os
