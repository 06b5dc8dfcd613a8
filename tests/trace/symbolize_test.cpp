// Symbolization of this test program's own functions: names, files, lines and inlined frames, from
// a trace written by the recorder and read back like the tool does.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "test_util.h"
#include "analysis/analysis.h"
#include "analysis/reader.h"
#include "trace/recorder.h"
#include "analysis/symbolize.h"

namespace symbolize_test {

int g_outer_line = 0, g_inlined_line = 0, g_caller_line = 0;

__attribute__((noinline)) void known_allocating_function(Recorder* r) {
  g_outer_line = __LINE__ + 1;
  r->on_alloc(0x100000, 4096, 0, 0, Api::alloc, 10);
  asm volatile("" ::: "memory");
}

inline __attribute__((always_inline)) void inlined_allocator(Recorder* r) {
  g_inlined_line = __LINE__ + 1;
  r->on_alloc(0x200000, 8192, 0, 0, Api::alloc, 10);
}

__attribute__((noinline)) void caller_of_inlined(Recorder* r) {
  g_caller_line = __LINE__ + 1;
  inlined_allocator(r);
  asm volatile("" ::: "memory");
}

}  // namespace symbolize_test

namespace {

Trace record_known_functions() {
  const std::string path = test::temp_path("symbolize");
  Recorder* r = test::start_recorder(path, StackMode::native);
  symbolize_test::known_allocating_function(r);
  symbolize_test::caller_of_inlined(r);
  Recorder::stop();
  Trace t;
  std::string error;
  EXPECT_TRUE(read_trace(path, t, error)) << error;
  return t;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

namespace {

// The frames of one of record_known_functions()'s two events (at least two, or none).
std::vector<Frame> known_frames(std::size_t event) {
  const Trace t = record_known_functions();
  EXPECT_EQ(t.events.size(), 2u);
  if (t.events.size() != 2) return {};
  Symbolizer sym(t);
  std::vector<Frame> frames = sym.stack(t.events[event].stack);
  EXPECT_GE(frames.size(), 2u);
  if (frames.size() < 2) frames.clear();
  return frames;
}

}  // namespace

TEST(TraceSymbolize, KnownFunctionAndLine) {
  const std::vector<Frame> frames = known_frames(0);
  ASSERT_FALSE(frames.empty());
  EXPECT_EQ(frames[0].function,
            "symbolize_test::known_allocating_function(allocshim::trace::Recorder*)");
  EXPECT_TRUE(ends_with(frames[0].file, "symbolize_test.cpp")) << frames[0].file;
  EXPECT_EQ(frames[0].line, symbolize_test::g_outer_line);
  EXPECT_EQ(frames[0].module, "trace_tests");
  EXPECT_FALSE(frames[0].inlined);
  // The caller is the test body, which gtest runs from its own functions further out.
  bool saw_test_body = false;
  for (const Frame& f : frames)
    saw_test_body |=
        f.function.find("TraceSymbolize_KnownFunctionAndLine_Test::TestBody") != std::string::npos;
  EXPECT_TRUE(saw_test_body);
}

TEST(TraceSymbolize, InlinedFrames) {
  const std::vector<Frame> frames = known_frames(1);
  ASSERT_FALSE(frames.empty());
  EXPECT_EQ(frames[0].function, "symbolize_test::inlined_allocator(allocshim::trace::Recorder*)");
  EXPECT_TRUE(frames[0].inlined);
  EXPECT_EQ(frames[0].line, symbolize_test::g_inlined_line);
  EXPECT_EQ(frames[1].function, "symbolize_test::caller_of_inlined(allocshim::trace::Recorder*)");
  EXPECT_FALSE(frames[1].inlined);
  EXPECT_EQ(frames[1].line, symbolize_test::g_caller_line);
  EXPECT_TRUE(ends_with(frames[1].file, "symbolize_test.cpp")) << frames[1].file;
}

TEST(TraceSymbolize, ReportNamesTheSites) {
  std::vector<Trace> traces;
  traces.push_back(record_known_functions());
  auto a = analyze(std::move(traces));
  const auto top = a->top(Metric::bytes, 2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0]->bytes, 8192u);
  EXPECT_EQ(top[0]->frames[0].label(),
            "symbolize_test::inlined_allocator(allocshim::trace::Recorder*) (symbolize_test.cpp:" +
                std::to_string(symbolize_test::g_inlined_line) + ")");
  EXPECT_EQ(top[1]->bytes, 4096u);
}

// A trace recorded through one build of libsymfake.so, read where that path holds another build
// (the usual case for a trace made on the GPU machine: its libc is not this machine's libc).
class OtherBuild : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::temp_path("symfake");
    std::filesystem::create_directories(dir_);
    lib_ = dir_ + "/libsymfake.so";
    std::filesystem::copy_file(ALLOCSHIM_SYMFAKE_A, lib_);
    const std::string path = dir_ + "/trace";
    Recorder* r = test::start_recorder(path, StackMode::native);
    void* h = dlopen(lib_.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(h, nullptr) << dlerror();
    auto call = reinterpret_cast<void (*)(void (*)(void*), void*)>(dlsym(h, "symfake_a"));
    ASSERT_NE(call, nullptr);
    call(
        [](void* rec) {
          static_cast<Recorder*>(rec)->on_alloc(0x300000, 4096, 0, 0, Api::alloc, 10);
        },
        r);
    Recorder::stop();
    dlclose(h);
    std::string error;
    ASSERT_TRUE(read_trace(path, trace_, error)) << error;
    ASSERT_EQ(trace_.events.size(), 1u);
    // Now the path holds the other build: same code at the same offsets, other names.
    std::filesystem::remove(lib_);
    std::filesystem::copy_file(ALLOCSHIM_SYMFAKE_B, lib_);
    unsetenv("DEBUGINFOD_URLS");  // no network from tests
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The frame of the stack inside libsymfake.so.
  Frame library_frame(const SymbolOptions& o) {
    Symbolizer sym(trace_, o);
    for (const Frame& f : sym.stack(trace_.events[0].stack))
      if (f.module == "libsymfake.so") return f;
    ADD_FAILURE() << "no frame in libsymfake.so";
    return {};
  }

  std::string dir_, lib_;
  Trace trace_;

 public:
  Frame library_frame_public(const SymbolOptions& o) { return library_frame(o); }
};

TEST_F(OtherBuild, ShowsModuleAndOffsetNeverTheOtherBuildsName) {
  Symbolizer sym(trace_);
  bool found = false;
  for (const Frame& f : sym.stack(trace_.events[0].stack)) {
    EXPECT_EQ(f.function.find("symfake_b"), std::string::npos) << f.label();
    if (f.module != "libsymfake.so") continue;
    found = true;
    EXPECT_FALSE(f.resolved);
    char expected[64];
    std::snprintf(expected, sizeof expected, "libsymfake.so+0x%llx",
                  static_cast<unsigned long long>(f.offset));
    EXPECT_EQ(f.label(), expected);
    // The offset is the call's, inside symfake_a (which the other build has at the same place).
    EXPECT_LT(f.offset, 0x100000u);
    const ModuleRecord* m = nullptr;
    for (const ModuleRecord& r : trace_.modules)
      if (r.path == lib_) m = &r;
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(f.offset, f.address - 1 - m->bias);
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(sym.unresolved_modules(), std::vector<std::string>{"libsymfake.so"});

  // The report says once how to get the symbols.
  std::vector<Trace> traces;
  traces.push_back(trace_);
  auto a = analyze(std::move(traces));
  std::size_t hints = 0;
  for (const std::string& w : a->warnings)
    if (w.find("--debug-dir") != std::string::npos) {
      ++hints;
      EXPECT_NE(w.find("libsymfake.so"), std::string::npos) << w;
    }
  EXPECT_EQ(hints, 1u);
}

TEST_F(OtherBuild, SameLabelWhereverTheModuleWasLoaded) {
  // Another run loads the module elsewhere: the label must not change, so stacks of both runs merge.
  const std::string before = library_frame({}).label();
  for (ModuleRecord& m : trace_.modules)
    if (m.path == lib_) {
      m.bias += 0x40000000;
      m.start += 0x40000000;
      m.end += 0x40000000;
    }
  for (auto& [id, node] : trace_.nodes) {
    const ModuleRecord* m = nullptr;
    for (const ModuleRecord& r : trace_.modules)
      if (r.path == lib_) m = &r;
    if (node.frame >= m->start - 0x40000000 && node.frame < m->end - 0x40000000)
      node.frame += 0x40000000;
  }
  EXPECT_EQ(library_frame({}).label(), before);
}

TEST_F(OtherBuild, DebugDirByBuildIdNamesIt) {
  const std::string debug = dir_ + "/debug";
  std::filesystem::create_directories(debug + "/.build-id/01");
  std::filesystem::copy_file(ALLOCSHIM_SYMFAKE_A,
                             debug + "/.build-id/01/23456789abcdef0123456789abcdef01234567.debug");
  SymbolOptions o;
  o.debug_dirs.push_back(debug);
  const Frame f = library_frame(o);
  EXPECT_TRUE(f.resolved);
  EXPECT_EQ(f.function, "symfake_a");
  EXPECT_NE(f.file.find("symfake.cpp"), std::string::npos) << f.file;
}

TEST_F(OtherBuild, DebugDirByFileNameNamesIt) {
  const std::string copy = dir_ + "/gpu-libs";
  std::filesystem::create_directories(copy);
  std::filesystem::copy_file(ALLOCSHIM_SYMFAKE_A, copy + "/libsymfake.so");
  SymbolOptions o;
  o.debug_dirs.push_back(copy);
  EXPECT_EQ(library_frame(o).function, "symfake_a");
  // A file of that name but another build-id is not used.
  std::filesystem::remove(copy + "/libsymfake.so");
  std::filesystem::copy_file(ALLOCSHIM_SYMFAKE_B, copy + "/libsymfake.so");
  EXPECT_FALSE(library_frame(o).resolved);
}

// Symbolizes on another thread; a search that waits on one of `fifos` fails the test, and the
// FIFOs are opened for writing to let it go.
Frame frame_within(OtherBuild* t, const SymbolOptions& o, const std::vector<std::string>& fifos,
                   Frame (OtherBuild::*frame)(const SymbolOptions&)) {
  auto f = std::async(std::launch::async, [&] { return (t->*frame)(o); });
  if (f.wait_for(std::chrono::seconds(30)) == std::future_status::ready) return f.get();
  ADD_FAILURE() << "symbolization waited on a FIFO";
  for (const std::string& p : fifos) {
    const int fd = open(p.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) close(fd);
  }
  return f.get();
}

TEST_F(OtherBuild, SeparateDebugFileIsFoundAndAFifoInItsPlaceIsNotWaitedOn) {
  // The library at the path has the recorded build-id but no debug information.
  std::filesystem::remove(lib_);
  std::filesystem::copy_file(ALLOCSHIM_SYMFAKE_A_NODEBUG, lib_);
  const std::string debug = dir_ + "/debug";
  const std::string by_id = debug + "/.build-id/01/23456789abcdef0123456789abcdef01234567.debug";
  const std::string beside = lib_ + ".debug";
  std::filesystem::create_directories(debug + "/.build-id/01");
  SymbolOptions o;
  o.debug_dirs.push_back(debug);

  // Another user planted FIFOs where the debug file is looked for: the search goes past them.
  ASSERT_EQ(mkfifo(by_id.c_str(), 0600), 0);
  ASSERT_EQ(mkfifo(beside.c_str(), 0600), 0);
  Frame f = frame_within(this, o, {by_id, beside}, &OtherBuild::library_frame_public);
  EXPECT_EQ(f.function, "symfake_a");  // from the library's own symbol table
  EXPECT_EQ(f.line, 0) << f.file;

  // The real debug file in the FIFO's place names the source line.
  std::filesystem::remove(by_id);
  std::filesystem::copy_file(ALLOCSHIM_SYMFAKE_A, by_id);
  f = frame_within(this, o, {beside}, &OtherBuild::library_frame_public);
  EXPECT_EQ(f.function, "symfake_a");
  EXPECT_NE(f.file.find("symfake.cpp"), std::string::npos) << f.file;
  EXPECT_GT(f.line, 0);
}

TEST_F(OtherBuild, FifoAtTheModulePathIsNotWaitedOn) {
  std::filesystem::remove(lib_);
  ASSERT_EQ(mkfifo(lib_.c_str(), 0600), 0);
  const Frame f = frame_within(this, {}, {lib_}, &OtherBuild::library_frame_public);
  EXPECT_FALSE(f.resolved);
}

TEST_F(OtherBuild, SysrootNamesIt) {
  const std::string root = dir_ + "/root";
  std::filesystem::create_directories(root + dir_);
  std::filesystem::copy_file(ALLOCSHIM_SYMFAKE_A, root + lib_);
  SymbolOptions o;
  o.sysroots.push_back(root);
  EXPECT_EQ(library_frame(o).function, "symfake_a");
}

TEST_F(OtherBuild, MatchingFileAtThePathNamesIt) {
  std::filesystem::remove(lib_);
  std::filesystem::copy_file(ALLOCSHIM_SYMFAKE_A, lib_);
  EXPECT_EQ(library_frame({}).function, "symfake_a");
}

TEST(TraceSymbolize, DemangleLeavesPlainNamesAlone) {
  EXPECT_EQ(demangle("_ZN3foo3barEv"), "foo::bar()");
  EXPECT_EQ(demangle("main"), "main");
}
