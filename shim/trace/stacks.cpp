// The module map (see stacks.h).
#include "trace/stacks.h"

#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <set>

namespace allocshim::trace {
namespace {

struct ScanState {
  std::vector<Module>* found;
};

std::string read_build_id(const dl_phdr_info* info) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const auto* p = reinterpret_cast<const unsigned char*>(info->dlpi_addr + ph.p_vaddr);
    const unsigned char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const unsigned char* name = p + sizeof(ElfW(Nhdr));
      const unsigned char* desc = name + ((note->n_namesz + 3) & ~3u);
      if (desc + note->n_descsz > end) break;
      if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 &&
          std::memcmp(name, "GNU", 4) == 0)
        return std::string(reinterpret_cast<const char*>(desc), note->n_descsz);
      p = desc + ((note->n_descsz + 3) & ~3u);
    }
  }
  return {};
}

int scan_one(dl_phdr_info* info, std::size_t, void* arg) {
  auto* state = static_cast<ScanState*>(arg);
  Module m;
  m.bias = info->dlpi_addr;
  m.start = UINT64_MAX;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    m.start = std::min<std::uint64_t>(m.start, info->dlpi_addr + ph.p_vaddr);
    m.end = std::max<std::uint64_t>(m.end, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
  }
  if (m.start == UINT64_MAX) return 0;
  m.path = info->dlpi_name ? info->dlpi_name : "";
  if (m.path.empty() && state->found->empty()) {
    // The first entry is the main program, reported without a name.
    char buf[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n > 0) m.path.assign(buf, static_cast<std::size_t>(n));
  }
  m.build_id = read_build_id(info);
  state->found->push_back(std::move(m));
  return 0;
}

}  // namespace

void ModuleMap::rescan(std::vector<Module>& added) {
  std::vector<Module> found;
  ScanState state{&found};
  dl_iterate_phdr(scan_one, &state);
  for (Module& m : found) {
    const bool known = std::any_of(modules_.begin(), modules_.end(), [&](const Module& k) {
      return k.bias == m.bias && k.start == m.start && k.path == m.path;
    });
    if (known) continue;
    m.id = next_id_++;
    modules_.push_back(m);
    ranges_.push_back({m.start, m.end, modules_.size() - 1});
    added.push_back(std::move(m));
  }
  std::sort(ranges_.begin(), ranges_.end(),
            [](const Range& a, const Range& b) { return a.start < b.start; });
}

const Module* ModuleMap::find(std::uint64_t address) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), address,
                             [](std::uint64_t a, const Range& r) { return a < r.start; });
  // Ranges do not overlap unless a module was unloaded and another loaded over it; a few steps back
  // cover that case, and any module that holds the address is enough for coverage.
  for (int steps = 0; it != ranges_.begin() && steps < 4; ++steps) {
    --it;
    if (address < it->end) return &modules_[it->module];
  }
  return nullptr;
}

bool ModuleMap::covers(std::uint64_t address) const { return find(address) != nullptr; }

void ModuleMap::clear() {
  modules_.clear();
  ranges_.clear();
  next_id_ = 1;
}

}  // namespace allocshim::trace
