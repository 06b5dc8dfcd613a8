// How much of the host's memory is available, as the kernel estimates it (/proc/meminfo).
#pragma once

#include <cstdint>

namespace allocshim::os {

// MemAvailable and MemTotal in bytes; false where they cannot be read (no /proc). Reads the file
// without allocating: callable from any thread the shim runs.
bool host_memory(std::uint64_t* available, std::uint64_t* total);

}  // namespace allocshim::os
