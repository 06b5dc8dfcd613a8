// The environment as the shim reads it: through secure_getenv, so that a setuid or setgid program
// the shim is preloaded into (/etc/ld.so.preload) never lets its caller pick the shim's files or
// policy.
#pragma once

#include <cstdlib>

namespace allocshim::os {

// The variable's value, or null when it is unset, empty, or the process runs with privileges its
// caller does not have (AT_SECURE).
inline const char* env(const char* name) {
  const char* v = secure_getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

}  // namespace allocshim::os
