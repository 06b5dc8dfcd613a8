// Offline symbolization of recorded stacks with elfutils (libdwfl): demangled function names,
// file:line, and the chain of inlined calls where the module has debug information. Python frames
// resolve through the trace's function table.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "trace/reader.h"

struct Dwfl;  // elfutils

namespace allocshim::trace {

struct Frame {
  std::string function;  // demangled; "0x..." when unknown
  std::string file;      // source file, or empty
  int line = 0;
  std::string module;    // file name of the module (no directory); "python" for Python frames
  std::uint64_t address = 0;
  bool inlined = false;  // an inlined call inside the next frame's function
  bool python = false;

  // "function (file:line)" or "function (module)" when there is no line information.
  std::string label() const;
};

class Symbolizer {
 public:
  // Reports the trace's modules to libdwfl (each file is opened lazily on first lookup).
  explicit Symbolizer(const Trace& trace);
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

 private:
  std::vector<Frame> lookup_native(std::uint64_t address);

  const Trace& trace_;
  ::Dwfl* dwfl_ = nullptr;
  std::unordered_map<std::uint64_t, std::vector<Frame>> cache_;
};

// Demangles a C++ symbol; returns it unchanged if it is not mangled.
std::string demangle(const char* symbol);

}  // namespace allocshim::trace
