// Offline symbolization of recorded stacks with elfutils (libdwfl): demangled function names,
// file:line, and the chain of inlined calls where the module has debug information. Python frames
// resolve through the trace's function table.
//
// A trace is usually read on another machine than the one that recorded it, where a library of the
// same path is a different build: a module is symbolized only from a file whose build-id equals the
// recorded one (found at the recorded path, under a --sysroot, in a --debug-dir, or through
// debuginfod when DEBUGINFOD_URLS is set). Frames of other modules stay `module+0xoffset`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "analysis/reader.h"

struct Dwfl;  // elfutils

namespace allocshim::analysis {

struct Frame {
  std::string function;  // demangled; "module+0xoffset" when unresolved, "0x..." outside any module
  std::string file;      // source file, or empty
  int line = 0;
  std::string module;         // file name of the module (no directory); "python" for Python frames
  std::uint64_t address = 0;  // as recorded (a return address)
  std::uint64_t offset = 0;   // of the call in the module's file (address - 1 - load bias)
  bool inlined = false;       // an inlined call inside the next frame's function
  bool python = false;
  bool resolved = false;  // the name comes from the module's symbols (or the Python function table)

  // How every output names a frame: "function (file:line)", "function (module)" without line
  // information, "module+0xoffset" when unresolved. Unresolved labels do not depend on where the
  // module was loaded, so stacks of two runs (or two ranks) merge.
  std::string label() const;
};

// Where to find the recording machine's files (see docs/tracing.md).
struct SymbolOptions {
  std::vector<std::string> sysroots;    // a copy of its file system: SYSROOT/usr/lib/...
  std::vector<std::string> debug_dirs;  // DIR/.build-id/xx/rest[.debug], or DIR/<file name>
};

// The sentence that says how to get symbols for modules no matching file was found for.
std::string missing_symbols_hint(const std::vector<std::string>& modules);

class Symbolizer {
 public:
  // Reports the trace's modules whose build-id matches a file here to libdwfl (each file is
  // opened lazily on first lookup).
  explicit Symbolizer(const Trace& trace, const SymbolOptions& options = {});
  ~Symbolizer();
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  // The frames of one recorded frame value, innermost first: an address inside inlined code gives
  // the inlined functions, then the function they were inlined into.
  const std::vector<Frame>& resolve(std::uint64_t frame);
  // A whole stack, innermost first.
  std::vector<Frame> stack(std::uint32_t stack_id);
  // Frames that are only the shim or the CUDA runtime/driver (not the program's own code).
  static bool is_runtime(const Frame& f);
  // File names of the modules that frames fell into but that have no matching file here.
  std::vector<std::string> unresolved_modules() const;

 private:
  struct Module {
    const ModuleRecord* record;
    std::string name;     // file name, no directory
    bool usable = false;  // reported to libdwfl (a matching file, or debuginfod may find one)
    bool missed = false;  // a frame fell into it and could not be named
  };
  std::vector<Frame> lookup_native(std::uint64_t address);
  Module* module_at(std::uint64_t address);

  struct Setup;  // libdwfl's callbacks and search path, which must outlive the session

  const Trace& trace_;
  std::unique_ptr<Setup> setup_;
  ::Dwfl* dwfl_ = nullptr;
  std::vector<Module> modules_;  // in the trace's order
  std::unordered_map<std::uint64_t, std::vector<Frame>> cache_;
};

// The build-id of an ELF file as raw bytes; empty when it has none or cannot be read.
std::string file_build_id(const std::string& path);

// Demangles a C++ symbol; returns it unchanged if it is not mangled.
std::string demangle(const char* symbol);

}  // namespace allocshim::analysis
