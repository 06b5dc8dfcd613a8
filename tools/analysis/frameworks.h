// What the report knows about Python frameworks: which Python frames are a framework's own (folded
// so the program's line leads each site), and when a framework's caching allocator or preallocation
// hides the program's allocations from the trace.
#pragma once

#include <string>
#include <vector>

#include "analysis/symbolize.h"

namespace allocshim::analysis {

struct Analysis;

// The package a Python file belongs to when it is not the program's own code: "torch" for
// .../site-packages/torch/..., "python" for the standard library; empty for the program's files.
std::string python_package(const std::string& file);

// A Python site's frames as the report shows them (innermost first): without the native frames
// below the Python code, starting at the innermost frame of the program's own code (the framework
// frames it called are counted in `hidden`), and each run of framework frames further out folded
// into one frame "[N frames in torch]". Stacks without Python frames, or without any frame of the
// program's own, are returned unchanged.
std::vector<Frame> python_first(std::vector<Frame> frames, std::size_t& hidden);

// Sentences for the report when a framework's allocator hides allocations: PyTorch's caching
// allocator (segments kept, few frees), JAX's preallocation, CuPy's memory pool; each says how to
// see the program's own allocations.
std::vector<std::string> framework_notes(const Analysis& a);

}  // namespace allocshim::analysis
