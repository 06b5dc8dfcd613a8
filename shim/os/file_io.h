// Whole reads and writes at an offset, for files other processes share (the budget regions): a
// short count means the file ended early or failed, never a partial value used as whole.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace allocshim::os {

// Reads `len` bytes at `off`, retrying after signals; false on an error or an early end.
bool pread_full(int fd, void* buf, std::size_t len, off_t off);
// Writes `len` bytes at `off`, retrying after signals; false on an error.
bool pwrite_full(int fd, const void* buf, std::size_t len, off_t off);

}  // namespace allocshim::os
