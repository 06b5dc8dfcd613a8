#include "base/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>

namespace allocshim::log {
namespace {
std::atomic<int> g_level{static_cast<int>(Level::warn)};
}

void set_level(Level level) { g_level.store(static_cast<int>(level), std::memory_order_relaxed); }

bool enabled(Level level) {
  return static_cast<int>(level) <= g_level.load(std::memory_order_relaxed);
}

void write(Level level, const char* fmt, ...) {
  if (!enabled(level)) return;
  char buf[1024];
  int n = std::snprintf(buf, sizeof buf, "allocshim: ");
  va_list ap;
  va_start(ap, fmt);
  const int m = std::vsnprintf(buf + n, sizeof buf - static_cast<std::size_t>(n) - 1, fmt, ap);
  va_end(ap);
  n = m < 0 ? n
            : (n + m < static_cast<int>(sizeof buf) - 1 ? n + m : static_cast<int>(sizeof buf) - 2);
  buf[n++] = '\n';
  ssize_t ignored = ::write(2, buf, static_cast<std::size_t>(n));
  (void)ignored;
}

}  // namespace allocshim::log
