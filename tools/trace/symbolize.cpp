// Symbolization with libdwfl (see symbolize.h).
#include "trace/symbolize.h"

#include <cxxabi.h>
#include <dwarf.h>
#include <elfutils/libdwfl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace allocshim::trace {
namespace {

const Dwfl_Callbacks kCallbacks = {
    dwfl_build_id_find_elf,        // find_elf (unused: every module is reported with its path)
    dwfl_standard_find_debuginfo,  // separate debug files: .gnu_debuglink, build-id, debuginfod off
    dwfl_offline_section_address,
    nullptr,
};

std::string basename_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// The function a DIE names: its demangled linkage name when it has one (which carries namespaces
// and parameter types), else its plain name, following abstract origins and specifications.
std::string die_name(Dwarf_Die* die) {
  Dwarf_Attribute attr;
  if (dwarf_attr_integrate(die, DW_AT_linkage_name, &attr) ||
      dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr)) {
    if (const char* s = dwarf_formstring(&attr)) return demangle(s);
  }
  if (dwarf_attr_integrate(die, DW_AT_name, &attr))
    if (const char* s = dwarf_formstring(&attr)) return s;
  return {};
}

}  // namespace

std::string demangle(const char* symbol) {
  if (!symbol) return {};
  int status = 0;
  char* d = abi::__cxa_demangle(symbol, nullptr, nullptr, &status);
  if (status != 0 || !d) return symbol;
  std::string out = d;
  std::free(d);
  return out;
}

std::string Frame::label() const {
  if (!file.empty() && line > 0) return function + " (" + basename_of(file) + ":" + std::to_string(line) + ")";
  if (!module.empty()) return function + " (" + module + ")";
  return function;
}

Symbolizer::Symbolizer(const Trace& trace) : trace_(trace) {
  dwfl_ = dwfl_begin(&kCallbacks);
  if (!dwfl_) return;
  dwfl_report_begin(dwfl_);
  for (const ModuleRecord& m : trace.modules) {
    // The vDSO and anything gone since the trace was taken cannot be opened: their addresses stay
    // unresolved (shown with the module name).
    if (m.path.empty() || m.path[0] != '/' || access(m.path.c_str(), R_OK) != 0) continue;
    dwfl_report_elf(dwfl_, basename_of(m.path).c_str(), m.path.c_str(), -1, m.bias, true);
  }
  dwfl_report_end(dwfl_, nullptr, nullptr);
}

Symbolizer::~Symbolizer() {
  if (dwfl_) dwfl_end(dwfl_);
}

bool Symbolizer::is_runtime(const Frame& f) {
  if (f.python) return false;
  const std::string& m = f.module;
  return m.rfind("liballocshim", 0) == 0 || m.rfind("libcuda.so", 0) == 0 ||
         m.rfind("libcudart", 0) == 0;
}

const std::vector<Frame>& Symbolizer::resolve(std::uint64_t value) {
  auto it = cache_.find(value);
  if (it != cache_.end()) return it->second;
  std::vector<Frame> frames;
  if (is_python_frame(value)) {
    Frame f;
    f.python = true;
    f.module = "python";
    f.line = static_cast<int>(python_line(value));
    auto fn = trace_.functions.find(python_func(value));
    if (fn != trace_.functions.end()) {
      f.function = fn->second.name;
      f.file = fn->second.file;
    } else {
      f.function = "<python function " + std::to_string(python_func(value)) + ">";
    }
    frames.push_back(std::move(f));
  } else {
    // Recorded native frames are return addresses: the call is the instruction before.
    frames = lookup_native(value > 0 ? value - 1 : 0);
    for (Frame& f : frames) f.address = value;
  }
  return cache_.emplace(value, std::move(frames)).first->second;
}

std::vector<Frame> Symbolizer::lookup_native(std::uint64_t addr) {
  std::vector<Frame> out;
  std::string module;
  for (auto m = trace_.modules.rbegin(); m != trace_.modules.rend(); ++m)
    if (addr >= m->start && addr < m->end) {
      module = basename_of(m->path);
      break;
    }
  Dwfl_Module* mod = dwfl_ ? dwfl_addrmodule(dwfl_, addr) : nullptr;
  if (!mod) {
    Frame f;
    f.function = hex(addr);
    f.module = module.empty() ? "?" : module;
    out.push_back(std::move(f));
    return out;
  }
  GElf_Off offset = 0;
  GElf_Sym sym;
  const char* symbol = dwfl_module_addrinfo(mod, addr, &offset, &sym, nullptr, nullptr, nullptr);
  const char* src = nullptr;
  int line = 0;
  if (Dwfl_Line* l = dwfl_module_getsrc(mod, addr))
    src = dwfl_lineinfo(l, nullptr, &line, nullptr, nullptr, nullptr);

  Dwarf_Addr bias = 0;
  if (Dwarf_Die* cu = dwfl_module_addrdie(mod, addr, &bias)) {
    Dwarf_Die* scopes = nullptr;
    int n = dwarf_getscopes(cu, addr - bias, &scopes);
    if (n > 0) {
      // dwarf_getscopes continues an inlined call with its abstract definition's scopes; the
      // lexical chain of the innermost scope gives the function it was inlined into instead
      // (as eu-addr2line -i does).
      Dwarf_Die inner = scopes[0];
      std::free(scopes);
      scopes = nullptr;
      n = dwarf_getscopes_die(&inner, &scopes);
    }
    Dwarf_Files* files = nullptr;
    std::size_t nfiles = 0;
    dwarf_getsrcfiles(cu, &files, &nfiles);
    std::string file = src ? src : "";
    int at_line = line;
    for (int i = 0; i < n; ++i) {
      const int tag = dwarf_tag(&scopes[i]);
      if (tag != DW_TAG_inlined_subroutine && tag != DW_TAG_subprogram) continue;
      Frame f;
      f.function = die_name(&scopes[i]);
      if (f.function.empty()) f.function = symbol ? demangle(symbol) : hex(addr);
      f.file = file;
      f.line = at_line;
      f.module = module;
      f.inlined = tag == DW_TAG_inlined_subroutine;
      out.push_back(std::move(f));
      if (tag == DW_TAG_subprogram) break;
      // The caller's location is where this inlined call sits.
      Dwarf_Attribute attr;
      Dwarf_Word call_file = 0, call_line = 0;
      if (dwarf_formudata(dwarf_attr(&scopes[i], DW_AT_call_file, &attr), &call_file) == 0 && files) {
        const char* name = dwarf_filesrc(files, call_file, nullptr, nullptr);
        file = name ? name : "";
      }
      if (dwarf_formudata(dwarf_attr(&scopes[i], DW_AT_call_line, &attr), &call_line) == 0)
        at_line = static_cast<int>(call_line);
    }
    std::free(scopes);
  }
  if (out.empty()) {
    Frame f;
    f.function = symbol ? demangle(symbol) : hex(addr);
    f.file = src ? src : "";
    f.line = line;
    f.module = module;
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<Frame> Symbolizer::stack(std::uint32_t stack_id) {
  std::vector<Frame> out;
  for (std::uint64_t v : trace_.frames(stack_id)) {
    const std::vector<Frame>& fs = resolve(v);
    out.insert(out.end(), fs.begin(), fs.end());
  }
  return out;
}

}  // namespace allocshim::trace
