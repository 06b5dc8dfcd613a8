#include "os/host_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace allocshim::os {
namespace {

// The value in kB of the line `key` ("MemAvailable:"), in bytes; false if absent.
bool field(const char* text, const char* key, std::uint64_t* bytes) {
  const char* p = std::strstr(text, key);
  if (p == nullptr) return false;
  char* end = nullptr;
  const unsigned long long kb = std::strtoull(p + std::strlen(key), &end, 10);
  if (end == p + std::strlen(key)) return false;
  *bytes = static_cast<std::uint64_t>(kb) * 1024;
  return true;
}

}  // namespace

bool host_memory(std::uint64_t* available, std::uint64_t* total) {
  const int fd = ::open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // Both lines are among the first three of the file.
  char buf[512];
  std::size_t used = 0;
  for (ssize_t n; used + 1 < sizeof buf && (n = ::read(fd, buf + used, sizeof buf - 1 - used)) > 0;)
    used += static_cast<std::size_t>(n);
  ::close(fd);
  buf[used] = '\0';
  return field(buf, "MemAvailable:", available) && field(buf, "MemTotal:", total);
}

}  // namespace allocshim::os
