// Finding the files symbolization reads, without ever waiting on one. A trace names module paths
// that other users may control, and libdwfl's own searches open candidates with a blocking
// open(): a FIFO planted where a library or its debug file may be would hang the command.
#pragma once

#include <elfutils/libdwfl.h>

#include <string>
#include <vector>

namespace allocshim::analysis {

// A read-only descriptor of `path` if it is a regular file; -1 for anything else (a FIFO, a
// device, a directory), found without waiting on it.
int open_regular(const std::string& path);

// The build-id of an open ELF file as raw bytes; empty when it has none or is not ELF.
std::string fd_build_id(int fd);

// What a module's separate debug file search needs (a module's user data, see below).
struct DebugSearch {
  std::vector<std::string> dirs;  // libdwfl's debuginfo_path entries: "", relative or absolute
  bool debuginfod = false;        // DEBUGINFOD_URLS is set: libdwfl may ask the server too
};

// A Dwfl_Callbacks::find_debuginfo that opens local candidates itself, in libdwfl's order (by
// build-id under each absolute entry, then by .gnu_debuglink beside the module, in each relative
// entry and under each absolute one), and keeps only a regular file whose build-id is the
// module's. The module's user data must point to a DebugSearch. Only with debuginfod, and only
// when no local candidate was refused, does libdwfl's standard search run after it.
int find_debuginfo(Dwfl_Module* mod, void** userdata, const char* modname, Dwarf_Addr base,
                   const char* file_name, const char* debuglink_file, GElf_Word debuglink_crc,
                   char** debuginfo_file_name);

}  // namespace allocshim::analysis
