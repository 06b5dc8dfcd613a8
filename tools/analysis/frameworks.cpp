// Python frameworks in reports (see frameworks.h).
#include "analysis/frameworks.h"

#include <algorithm>

#include "analysis/analysis.h"

namespace allocshim::analysis {
namespace {

bool has_module(const Trace& t, const char* name) {
  return std::any_of(t.modules.begin(), t.modules.end(),
                     [&](const ModuleRecord& m) { return m.path.find(name) != std::string::npos; });
}

}  // namespace

std::string python_package(const std::string& file) {
  for (const char* dir : {"/site-packages/", "/dist-packages/"}) {
    const auto at = file.rfind(dir);
    if (at == std::string::npos) continue;
    const std::size_t from = at + std::char_traits<char>::length(dir);
    std::size_t end = file.find_first_of("/.", from);
    if (end == std::string::npos) end = file.size();
    return file.substr(from, end - from);
  }
  // The standard library (lib/python3.X/...) and frozen modules ("<frozen importlib._bootstrap>").
  if (file.find("/lib/python3") != std::string::npos || (!file.empty() && file[0] == '<'))
    return "python";
  return {};
}

std::vector<Frame> python_first(std::vector<Frame> frames, std::size_t& hidden) {
  hidden = 0;
  const auto own = [](const Frame& f) { return f.python && python_package(f.file).empty(); };
  const auto first_own = std::find_if(frames.begin(), frames.end(), own);
  if (first_own == frames.end()) return frames;
  hidden = static_cast<std::size_t>(first_own - frames.begin());
  std::vector<Frame> out;
  for (auto it = first_own; it != frames.end();) {
    if (!it->python) {  // native frames between Python frames: the interpreter's, or an extension's
      ++it;
      continue;
    }
    const std::string package = python_package(it->file);
    if (package.empty()) {
      out.push_back(*it++);
      continue;
    }
    std::size_t n = 0;
    while (it != frames.end() && (!it->python || python_package(it->file) == package))
      n += (it++)->python;
    Frame folded;
    folded.python = true;
    folded.resolved = true;
    folded.module = package;
    folded.function =
        "[" + std::to_string(n) + (n == 1 ? " frame in " : " frames in ") + package + "]";
    out.push_back(std::move(folded));
  }
  return out;
}

std::vector<std::string> framework_notes(const Analysis& a) {
  std::vector<std::string> notes;
  bool torch = false, jax = false, cupy = false;
  for (const Trace& t : a.traces) {
    torch |= has_module(t, "libc10_cuda.so");
    jax |= has_module(t, "xla_extension.so") || has_module(t, "xla_cuda_plugin.so");
    cupy |= has_module(t, "cupy_backends") || has_module(t, "/cupy/");
  }
  const Totals& tot = a.totals;
  // A caching allocator frees almost nothing back to the driver while the program runs.
  const bool few_frees = tot.allocs > 0 && tot.frees * 4 < tot.allocs;
  if (torch && few_frees)
    notes.push_back(
        "PyTorch's caching allocator is on: the trace shows the " + std::to_string(tot.allocs) +
        " segments it took from the driver (and " + std::to_string(tot.frees) +
        " returned), not the tensors it carves from them. To trace each tensor, run with "
        "PYTORCH_NO_CUDA_MEMORY_CACHING=1 (slower; every tensor is then a cudaMalloc), or keep the "
        "cache and read its own view with torch.cuda.memory._record_memory_history");
  if (jax && tot.allocs > 0 && tot.frees * 4 < tot.allocs)
    notes.push_back(
        "JAX preallocates most of the GPU's memory at start (75% by default) and serves arrays from "
        "it: the trace shows that block, not the arrays. To trace them, run with "
        "XLA_PYTHON_CLIENT_PREALLOCATE=false (grows on demand) or XLA_PYTHON_CLIENT_ALLOCATOR=platform "
        "(allocates and frees each buffer; slower)");
  if (cupy && few_frees)
    notes.push_back(
        "CuPy's memory pool keeps freed blocks for reuse: the trace shows the pool's allocations. To "
        "trace each array, disable the pool in the program with cupy.cuda.set_allocator(None)");
  return notes;
}

}  // namespace allocshim::analysis
