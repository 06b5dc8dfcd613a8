#include "ipc/wire.h"

#include <cstdio>

namespace allocshim::ipc::wire {

bool valid(const Header& h, Type type) {
  return h.magic == kMagic && h.version == kVersion && h.type == type;
}

std::string socket_name(uid_t uid, pid_t pid, std::uint64_t nonce) {
  char buf[96];
  const int n = std::snprintf(buf, sizeof buf, "%callocshim-ipc.%u.%d.%016llx", '\0',
                              static_cast<unsigned>(uid), static_cast<int>(pid),
                              static_cast<unsigned long long>(nonce));
  return std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
}

}  // namespace allocshim::ipc::wire
