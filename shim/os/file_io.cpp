#include "os/file_io.h"

#include <unistd.h>

#include <cerrno>

namespace allocshim::os {

bool pread_full(int fd, void* buf, std::size_t len, off_t off) {
  auto* p = static_cast<char*>(buf);
  while (len > 0) {
    const ssize_t n = ::pread(fd, p, len, off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;  // an error, or the file ends early (truncated)
    p += n;
    len -= static_cast<std::size_t>(n);
    off += n;
  }
  return true;
}

bool pwrite_full(int fd, const void* buf, std::size_t len, off_t off) {
  const auto* p = static_cast<const char*>(buf);
  while (len > 0) {
    const ssize_t n = ::pwrite(fd, p, len, off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<std::size_t>(n);
    off += n;
  }
  return true;
}

}  // namespace allocshim::os
