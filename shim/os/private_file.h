// Files the shim writes (the trace, the statistics). Their names come from the environment or the
// policy and often point into a directory other users can write (/tmp), and the shim may run as
// root: a name another user prepared must never make the shim write somewhere else.
#pragma once

#include <cstddef>
#include <string>

namespace allocshim::os {

struct PrivateFile {
  int fd = -1;        // open for writing (close-on-exec), or -1
  std::string error;  // why fd is -1, or (fd >= 0) a problem worth reporting, e.g. the mode
};

// Opens (O_PATH) the directory that holds `path`'s last component, which goes to `name`. The path
// is walked one component at a time without following links, and a symbolic link on the way is
// followed only when root or this process's user owns it: one another user planted (in /tmp, say)
// is refused, and no component can be swapped for a link between check and use. -1 and `error`
// on refusal or failure.
int open_parent(const std::string& path, std::string& name, std::string& error);

// Creates `path` afresh with mode 0600 and opens it for writing. A file of this user already there
// (an earlier run's) is replaced by a new one renamed over it, so the old file's other names and
// open descriptors never see the data. Refused: a symbolic link (never followed), anything that is
// not a regular file, a file another user owns, and a path through another user's symbolic link
// (open_parent).
PrivateFile create_private(const std::string& path);

// Writes all of [data, data + bytes) to `fd`; false with errno set on failure.
bool write_all(int fd, const void* data, std::size_t bytes);

}  // namespace allocshim::os
