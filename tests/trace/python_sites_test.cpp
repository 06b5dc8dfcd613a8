// Python programs in reports: the program's own Python line leads each site (native frames and the
// framework frames it called left out, framework frames further out folded), every frame on
// request, and a note when PyTorch's caching allocator hides the tensors.
#include <gtest/gtest.h>

#include <sstream>

#include "analysis/analysis.h"
#include "test_util.h"
#include "analysis/frameworks.h"
#include "analysis/reader.h"
#include "analysis/report.h"

using namespace allocshim::trace;
using namespace allocshim::analysis;

namespace {

constexpr std::uint64_t kTorchLib = 0x7f0000000000;  // where libc10_cuda.so was loaded

// A PyTorch-like program: 16 allocations (the caching allocator's segments) and `frees` frees, each
// from model.py's forward through nn.Module and torch.nn.functional, under the allocator's native
// frames.
Trace torch_like_trace(int frees) {
  std::vector<unsigned char> b(kFileHeaderBytes);
  FileHeader h;
  h.pid = 77;
  encode_file_header(h, b.data());
  std::vector<unsigned char> raw;
  Encoder e(raw);
  allocshim::test::record(e, Tag::process, 77, 1, 3, 1);
  e.str("/usr/bin/python3");
  e.str("python3");
  allocshim::test::record(e, Tag::module, 1, kTorchLib, kTorchLib, kTorchLib + 0x100000);
  e.str("/opt/conda/lib/python3.11/site-packages/torch/lib/libc10_cuda.so");
  e.str(std::string(20, '\x5a'));
  const char* torch = "/opt/conda/lib/python3.11/site-packages/torch/nn/";
  const std::pair<std::string, std::string> funcs[] = {
      {"linear", std::string(torch) + "functional.py"},
      {"forward", std::string(torch) + "modules/linear.py"},
      {"_call_impl", std::string(torch) + "modules/module.py"},
      {"forward", "/home/me/model.py"},
      {"step", "/home/me/train.py"},
      {"<module>", "/home/me/train.py"},
      {"_run_code", "/usr/lib/python3.11/runpy.py"}};
  for (std::uint32_t i = 0; i < 7; ++i) {
    allocshim::test::record(e, Tag::py_func, i + 1, 1);
    e.str(funcs[i].first);
    e.str(funcs[i].second);
  }
  // Outermost first: runpy, <module>, step, _call_impl x2, model.forward, _call_impl, linear.forward,
  // functional.linear, then two native frames of the allocator.
  const std::uint64_t frames[] = {
      python_frame(7, 88),   python_frame(6, 30), python_frame(5, 12),   python_frame(3, 1520),
      python_frame(3, 1511), python_frame(4, 9),  python_frame(3, 1520), python_frame(2, 117),
      python_frame(1, 2010), kTorchLib + 0x2001,  kTorchLib + 0x1001};
  for (std::uint32_t i = 0; i < 11; ++i) {
    allocshim::test::record(e, Tag::stack_node, i + 1, i, frames[i]);
  }
  allocshim::test::record(e, Tag::backend, 0, 0);
  e.str("native");
  allocshim::test::record(e, Tag::thread, 1, 1000);
  std::uint64_t last = 0;
  for (int i = 0; i < 16; ++i) {
    const std::uint64_t addr = 0x700000000 + static_cast<std::uint64_t>(i) * (1 << 26);
    allocshim::test::record(e, Tag::alloc, 100, 0, 20 << 20,
                            zigzag(static_cast<std::int64_t>(addr - last)), 0, 0, 1000, 11);
    last = addr;
  }
  for (int i = 0; i < frees; ++i) {
    const std::uint64_t addr = 0x700000000 + static_cast<std::uint64_t>(i) * (1 << 26);
    allocshim::test::record(e, Tag::free, 100, 0, 20 << 20,
                            zigzag(static_cast<std::int64_t>(addr - last)), 0, 10, 0);
    last = addr;
  }
  allocshim::test::record(e, Tag::end, 16 + frees, 0);
  ChunkCompressor c;
  std::vector<unsigned char> chunk;
  EXPECT_TRUE(c.compress(raw.data(), raw.size(), chunk));
  b.insert(b.end(), chunk.begin(), chunk.end());
  Trace t;
  std::string error;
  EXPECT_TRUE(parse_trace(b.data(), b.size(), t, error)) << error;
  return t;
}

std::unique_ptr<Analysis> analysis(int frees, bool native_frames = false) {
  std::vector<Trace> traces;
  traces.push_back(torch_like_trace(frees));
  AnalyzeOptions o;
  o.native_frames = native_frames;
  return analyze(std::move(traces), o);
}

std::string render(Format f, const Analysis& a) {
  std::ostringstream out;
  write_report(f, a, {}, out);
  return out.str();
}

}  // namespace

TEST(PythonSites, PackageOfAFile) {
  EXPECT_EQ(python_package("/opt/conda/lib/python3.11/site-packages/torch/nn/functional.py"),
            "torch");
  EXPECT_EQ(python_package("/usr/lib/python3/dist-packages/numpy/core/numeric.py"), "numpy");
  EXPECT_EQ(python_package("/venv/lib/python3.12/site-packages/six.py"), "six");
  EXPECT_EQ(python_package("/usr/lib/python3.11/runpy.py"), "python");
  EXPECT_EQ(python_package("<frozen runpy>"), "python");
  EXPECT_EQ(python_package("/home/me/train.py"), "");
}

TEST(PythonSites, ProgramLineLeads) {
  auto a = analysis(16);
  ASSERT_EQ(a->sites.size(), 1u);
  const std::vector<Frame>& f = a->sites[0].frames;
  ASSERT_EQ(f.size(), 5u);
  EXPECT_EQ(f[0].label(), "forward (model.py:9)");
  EXPECT_EQ(f[1].label(), "[2 frames in torch] (torch)");
  EXPECT_EQ(f[2].label(), "step (train.py:12)");
  EXPECT_EQ(f[3].label(), "<module> (train.py:30)");
  EXPECT_EQ(f[4].label(), "[1 frame in python] (python)");
  // The table's first line, the flame graph's leaf and JSON's first frame are the program's line.
  EXPECT_NE(render(Format::table, *a).find("at forward (model.py:9)\n"), std::string::npos);
  const std::string collapsed = render(Format::collapsed, *a);
  EXPECT_NE(collapsed.find(";forward (model.py:9) "), std::string::npos) << collapsed;
  EXPECT_NE(render(Format::json, *a).find("\"frames\": [\n     {\n      \"function\": \"forward\""),
            std::string::npos);
}

TEST(PythonSites, EveryFrameOnRequest) {
  auto a = analysis(16, true);
  ASSERT_EQ(a->sites.size(), 1u);
  const std::vector<Frame>& f = a->sites[0].frames;
  ASSERT_EQ(f.size(), 11u);
  EXPECT_FALSE(f[0].python);
  EXPECT_EQ(f[0].module, "libc10_cuda.so");
  EXPECT_EQ(f[2].label(), "linear (functional.py:2010)");
  // The allocator's frames are shown unnamed (its library is not here): the report says so, but not
  // when they are left out.
  auto hinted = [](const Analysis& an) {
    for (const std::string& w : an.warnings)
      if (w.find("libc10_cuda.so are shown as module+offset") != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(hinted(*a));
  EXPECT_FALSE(hinted(*analysis(16)));
}

TEST(PythonSites, CachingAllocatorIsNamed) {
  auto a = analysis(0);
  std::string notes;
  for (const std::string& w : a->warnings) notes += w + "\n";
  EXPECT_NE(notes.find("PyTorch's caching allocator is on"), std::string::npos) << notes;
  EXPECT_NE(notes.find("PYTORCH_NO_CUDA_MEMORY_CACHING=1"), std::string::npos) << notes;
  EXPECT_NE(render(Format::table, *a).find("PYTORCH_NO_CUDA_MEMORY_CACHING=1"), std::string::npos);
  // Frees as often as allocations: the cache is off, nothing to say.
  auto off = analysis(16);
  for (const std::string& w : off->warnings)
    EXPECT_EQ(w.find("caching allocator"), std::string::npos) << w;
}
