// Messages from the shim to stderr. Formatted into a stack buffer and written with one write(2):
// no allocation, no stdio locks (the program may be inside printf when the shim speaks).
#pragma once

namespace allocshim::log {

enum class Level { error, warn, info, debug };

// Messages at or below this level are written (set once at init from the policy / ALLOCSHIM_LOG).
void set_level(Level level);
bool enabled(Level level);

void write(Level level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace allocshim::log
