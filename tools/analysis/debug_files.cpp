// Finding the files symbolization reads (see debug_files.h).
#include "analysis/debug_files.h"

#include <elfutils/libdwelf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace allocshim::analysis {

int open_regular(const std::string& path) {
  // O_NONBLOCK keeps the open of a FIFO from waiting for a writer; it is cleared once the file is
  // known to be regular, where it changes nothing anyway.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || fcntl(fd, F_SETFL, 0) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string fd_build_id(int fd) {
  std::string out;
  elf_version(EV_CURRENT);
  if (Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr)) {
    const void* bits = nullptr;
    const ssize_t n = dwelf_elf_gnu_build_id(elf, &bits);
    if (n > 0) out.assign(static_cast<const char*>(bits), static_cast<std::size_t>(n));
    elf_end(elf);
  }
  return out;
}

namespace {

std::string hex_bytes(const unsigned char* bits, int n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < n; ++i) {
    out += kDigits[bits[i] >> 4];
    out += kDigits[bits[i] & 15];
  }
  return out;
}

// The places libdwfl's standard search looks, in its order.
std::vector<std::string> debug_candidates(const DebugSearch& search,
                                          const std::string& build_id_hex, const char* file_name,
                                          const char* debuglink) {
  std::vector<std::string> out;
  if (build_id_hex.size() > 2)
    for (const std::string& dir : search.dirs)
      if (!dir.empty() && dir[0] == '/')
        out.push_back(dir + "/.build-id/" + build_id_hex.substr(0, 2) + "/" +
                      build_id_hex.substr(2) + ".debug");
  if (!file_name || file_name[0] != '/') return out;
  const std::string file = file_name;
  const std::string dir_of_file = file.substr(0, file.rfind('/'));
  const std::string link =
      debuglink && *debuglink ? debuglink : file.substr(file.rfind('/') + 1) + ".debug";
  for (const std::string& dir : search.dirs) {
    if (dir.empty()) {
      out.push_back(dir_of_file + "/" + link);
    } else if (dir[0] != '/') {
      out.push_back(dir_of_file + "/" + dir + "/" + link);
    } else {
      out.push_back(dir + dir_of_file + "/" + link);
      out.push_back(dir + "/" + link);
    }
  }
  return out;
}

}  // namespace

int find_debuginfo(Dwfl_Module* mod, void** userdata, const char* modname, Dwarf_Addr base,
                   const char* file_name, const char* debuglink_file, GElf_Word debuglink_crc,
                   char** debuginfo_file_name) {
  const auto* search = static_cast<const DebugSearch*>(userdata ? *userdata : nullptr);
  if (!search) return -1;
  const unsigned char* bits = nullptr;
  GElf_Addr vaddr = 0;
  const int n = dwfl_module_build_id(mod, &bits, &vaddr);
  const std::string want =
      n > 0 ? std::string(reinterpret_cast<const char*>(bits), static_cast<std::size_t>(n)) : "";
  bool refused = false;
  for (const std::string& path :
       debug_candidates(*search, n > 0 ? hex_bytes(bits, n) : "", file_name, debuglink_file)) {
    // The module's own file is not its separate debug file.
    if (file_name && path == file_name) continue;
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) continue;
    const int fd = open_regular(path);
    if (fd < 0) {
      refused = true;
      continue;
    }
    if (!want.empty() && fd_build_id(fd) != want) {
      close(fd);
      continue;
    }
    *debuginfo_file_name = strdup(path.c_str());
    return fd;
  }
  if (search->debuginfod && !refused)
    return dwfl_standard_find_debuginfo(mod, userdata, modname, base, file_name, debuglink_file,
                                        debuglink_crc, debuginfo_file_name);
  return -1;
}

}  // namespace allocshim::analysis
