#include "os/private_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace allocshim::os {
namespace {

std::string failure(const std::string& path, const char* what, int err) {
  return path + ": " + what + " (" + std::strerror(err) + ")";
}

// A new file beside `path`, renamed over it: rename(2) replaces the name, whatever it named, and
// never writes through it.
PrivateFile replace(const std::string& path) {
  PrivateFile f;
  std::string temp = path + ".XXXXXX";
  const int fd = mkostemp(temp.data(), O_CLOEXEC);  // O_CREAT | O_EXCL, mode 0600
  if (fd < 0) {
    f.error = failure(path, "cannot create a new file beside it", errno);
    return f;
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    f.error = failure(path, "cannot replace it", errno);
    ::unlink(temp.c_str());
    ::close(fd);
    return f;
  }
  f.fd = fd;
  return f;
}

}  // namespace

PrivateFile create_private(const std::string& path) {
  PrivateFile f;
  // Twice at most: a file that appears between the check and O_EXCL is judged like any other.
  for (int attempt = 0; attempt < 2 && f.fd < 0; ++attempt) {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno != ENOENT) {
        f.error = failure(path, "cannot look at it", errno);
        return f;
      }
      f.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
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
      f.error = path + ": belongs to uid " + std::to_string(st.st_uid) + ", not to this process's uid " +
                std::to_string(::geteuid()) + "; nothing written";
      return f;
    }
    f = replace(path);
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
