// Byte counts as people read them in the exit summary and the trace reports ("1.5 GiB");
// policy::format_size writes the exact form a policy file takes ("1536MiB").
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace allocshim {

inline std::string human_bytes(std::uint64_t b) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace allocshim
