// Symbolization with libdwfl (see symbolize.h).
#include "analysis/symbolize.h"

#include "analysis/debug_files.h"

#include <cxxabi.h>
#include <dwarf.h>
#include <elfutils/libdwelf.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <gelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace allocshim::analysis {

struct Symbolizer::Setup {
  std::string debuginfo_path;  // where libdwfl looks for separate debug files
  char* debuginfo_path_ptr = nullptr;
  DebugSearch search;  // the same places, for find_debuginfo (each module's user data)
  Dwfl_Callbacks callbacks{};
};

namespace {

std::string basename_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string hex_bytes(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

bool debuginfod_configured() {
  const char* urls = std::getenv("DEBUGINFOD_URLS");
  return urls && *urls;
}

// Files that may be the recorded module, most specific first; each is used only if its build-id
// matches the recorded one.
std::vector<std::string> candidates(const ModuleRecord& m, const SymbolOptions& o) {
  std::vector<std::string> out;
  const std::string name = basename_of(m.path);
  for (const std::string& root : o.sysroots) out.push_back(root + m.path);
  for (const std::string& dir : o.debug_dirs) {
    if (!m.build_id.empty()) {
      const std::string id = hex_bytes(m.build_id);
      const std::string base = dir + "/.build-id/" + id.substr(0, 2) + "/" + id.substr(2);
      out.push_back(base);  // the binary itself (distributions link it here)
      out.push_back(base + ".debug");
    }
    out.push_back(dir + "/" + name);
  }
  out.push_back(m.path);
  return out;
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
  if (!file.empty() && line > 0)
    return function + " (" + basename_of(file) + ":" + std::to_string(line) + ")";
  if (resolved && !module.empty()) return function + " (" + module + ")";
  return function;
}

std::string file_build_id(const std::string& path) {
  const int fd = open_regular(path);
  if (fd < 0) return {};
  std::string out = fd_build_id(fd);
  close(fd);
  return out;
}

std::string missing_symbols_hint(const std::vector<std::string>& modules) {
  std::string list;
  for (std::size_t i = 0; i < modules.size() && i < 6; ++i) list += (i ? ", " : "") + modules[i];
  if (modules.size() > 6) list += ", and " + std::to_string(modules.size() - 6) + " more";
  return "frames of " + list +
         " are shown as module+offset: no file here has the build-id they were recorded with (the "
         "trace comes from another machine, or the files changed since). To name them, point "
         "--sysroot at a copy of the recording machine's files, or --debug-dir at a directory of "
         "its libraries or their debug files (.build-id/xx/yyyy.debug), or set DEBUGINFOD_URLS to a "
         "debuginfod server that knows them";
}

Symbolizer::Symbolizer(const Trace& trace, const SymbolOptions& options)
    : trace_(trace), setup_(std::make_unique<Setup>()) {
  // Separate debug files: next to the module, its .debug/, /usr/lib/debug, then each --debug-dir
  // (by .gnu_debuglink or by build-id). libdwfl asks debuginfod too when DEBUGINFOD_URLS is set.
  setup_->search.dirs = {"", ".debug", "/usr/lib/debug"};
  setup_->search.dirs.insert(setup_->search.dirs.end(), options.debug_dirs.begin(),
                             options.debug_dirs.end());
  setup_->search.debuginfod = debuginfod_configured();
  for (const std::string& dir : setup_->search.dirs)
    setup_->debuginfo_path += (setup_->debuginfo_path.empty() && dir.empty() ? "" : ":") + dir;
  setup_->debuginfo_path_ptr = setup_->debuginfo_path.data();
  setup_->callbacks.find_elf = dwfl_build_id_find_elf;  // modules reported by build-id only
  setup_->callbacks.find_debuginfo = find_debuginfo;
  setup_->callbacks.section_address = dwfl_offline_section_address;
  setup_->callbacks.debuginfo_path = &setup_->debuginfo_path_ptr;

  for (const ModuleRecord& m : trace.modules) modules_.push_back({&m, basename_of(m.path)});
  dwfl_ = dwfl_begin(&setup_->callbacks);
  if (!dwfl_) return;
  const bool debuginfod = setup_->search.debuginfod;
  // find_debuginfo reads where to look from the module's user data.
  const auto search_for = [this](Dwfl_Module* dm) {
    void** slot = nullptr;
    dwfl_module_info(dm, &slot, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    if (slot) *slot = &setup_->search;
  };
  dwfl_report_begin(dwfl_);
  for (Module& mod : modules_) {
    const ModuleRecord& m = *mod.record;
    // The vDSO has no file; "[...]" names are not files either.
    if (m.path.empty() || m.path[0] != '/') continue;
    for (const std::string& file : candidates(m, options)) {
      // Opened here, never by libdwfl, so that no path of the trace is waited on.
      const int fd = open_regular(file);
      if (fd < 0) continue;
      if (fd_build_id(fd) != m.build_id) {
        close(fd);
        continue;
      }
      // libdwfl owns the descriptor once the report succeeds.
      if (Dwfl_Module* dm =
              dwfl_report_elf(dwfl_, mod.name.c_str(), file.c_str(), fd, m.bias, true)) {
        mod.usable = true;
        search_for(dm);
      } else {
        close(fd);
      }
      break;
    }
    if (!mod.usable && debuginfod && !m.build_id.empty()) {
      // Reported by address range and build-id: libdwfl's find_elf fetches the file by build-id.
      Dwfl_Module* dm = dwfl_report_module(dwfl_, mod.name.c_str(), m.start & ~0xfffull, m.end);
      if (dm &&
          dwfl_module_report_build_id(dm, reinterpret_cast<const unsigned char*>(m.build_id.data()),
                                      m.build_id.size(), 0) == 0) {
        mod.usable = true;
        search_for(dm);
      }
    }
  }
  dwfl_report_end(dwfl_, nullptr, nullptr);
}

Symbolizer::~Symbolizer() {
  if (dwfl_) dwfl_end(dwfl_);
}

std::vector<std::string> Symbolizer::unresolved_modules() const {
  std::vector<std::string> out;
  for (const Module& m : modules_)
    if (m.missed && std::find(out.begin(), out.end(), m.name) == out.end()) out.push_back(m.name);
  return out;
}

Symbolizer::Module* Symbolizer::module_at(std::uint64_t addr) {
  for (auto m = modules_.rbegin(); m != modules_.rend(); ++m)
    if (addr >= m->record->start && addr < m->record->end) return &*m;
  return nullptr;
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
  if (trace::is_python_frame(value)) {
    Frame f;
    f.python = true;
    f.module = "python";
    f.line = static_cast<int>(trace::python_line(value));
    auto fn = trace_.functions.find(trace::python_func(value));
    if (fn != trace_.functions.end()) {
      f.function = fn->second.name;
      f.file = fn->second.file;
      f.resolved = true;
    } else {
      f.function = "<python function " + std::to_string(trace::python_func(value)) + ">";
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
  Module* module_rec = module_at(addr);
  const std::string module = module_rec ? module_rec->name : std::string();
  const std::uint64_t offset_in_file = module_rec ? addr - module_rec->record->bias : addr;
  Dwfl_Module* mod =
      dwfl_ && module_rec && module_rec->usable ? dwfl_addrmodule(dwfl_, addr) : nullptr;
  GElf_Off offset = 0;
  GElf_Sym sym;
  const char* symbol =
      mod ? dwfl_module_addrinfo(mod, addr, &offset, &sym, nullptr, nullptr, nullptr) : nullptr;
  if (!symbol) {
    // No matching file, or no symbol covers the address: the module and the offset in its file,
    // which `eu-addr2line -e FILE OFFSET` resolves wherever the right file is.
    Frame f;
    f.module = module.empty() ? "?" : module;
    f.offset = offset_in_file;
    f.function = module.empty() ? hex(addr) : module + "+" + hex(offset_in_file);
    // A matching file without a symbol there (stripped of its local symbols) needs no hint.
    Dwarf_Addr elf_bias = 0;
    if (module_rec && !(mod && dwfl_module_getelf(mod, &elf_bias))) module_rec->missed = true;
    out.push_back(std::move(f));
    return out;
  }
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
      if (f.function.empty()) f.function = demangle(symbol);
      f.file = file;
      f.line = at_line;
      f.module = module;
      f.offset = offset_in_file;
      f.resolved = true;
      f.inlined = tag == DW_TAG_inlined_subroutine;
      out.push_back(std::move(f));
      if (tag == DW_TAG_subprogram) break;
      // The caller's location is where this inlined call sits.
      Dwarf_Attribute attr;
      Dwarf_Word call_file = 0, call_line = 0;
      if (dwarf_formudata(dwarf_attr(&scopes[i], DW_AT_call_file, &attr), &call_file) == 0 &&
          files) {
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
    f.function = demangle(symbol);
    f.file = src ? src : "";
    f.line = line;
    f.module = module;
    f.offset = offset_in_file;
    f.resolved = true;
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

}  // namespace allocshim::analysis
