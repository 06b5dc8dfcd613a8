// The module map that lets the tool symbolize the recorded addresses offline (the addresses come
// from os/unwinder.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace allocshim::trace {

struct Module {
  std::uint32_t id = 0;
  std::uint64_t bias = 0;   // load bias: runtime address = file vaddr + bias
  std::uint64_t start = 0;  // lowest and highest address of its PT_LOAD segments
  std::uint64_t end = 0;
  std::string path;      // absolute for the main program (from /proc/self/exe)
  std::string build_id;  // raw NT_GNU_BUILD_ID bytes; empty when the module has none
};

// The loaded modules, as dl_iterate_phdr reports them. Rescanned when a new stack holds an address
// no known module covers (a library was dlopened since), so the map is complete for every recorded
// address without hooking dlopen or polling.
class ModuleMap {
 public:
  // Adds modules not seen before to the map and appends them to `added`.
  void rescan(std::vector<Module>& added);
  bool covers(std::uint64_t address) const;
  // The module containing `address`, or null.
  const Module* find(std::uint64_t address) const;
  // Forget everything (a forked child writing a trace of its own re-records the map).
  void clear();
  const std::vector<Module>& modules() const { return modules_; }

 private:
  std::vector<Module> modules_;
  struct Range {
    std::uint64_t start, end;
    std::size_t module;
  };
  std::vector<Range> ranges_;  // sorted by start
  std::uint32_t next_id_ = 1;
};

}  // namespace allocshim::trace
