// Symbolization of this test program's own functions: names, files, lines and inlined frames, from
// a trace written by the recorder and read back like the tool does.
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"
#include "trace/analysis.h"
#include "trace/reader.h"
#include "trace/recorder.h"
#include "trace/symbolize.h"

using namespace allocshim::trace;
using allocshim::Api;
namespace test = allocshim::test;

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
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

TEST(TraceSymbolize, KnownFunctionAndLine) {
  Trace t = record_known_functions();
  ASSERT_EQ(t.events.size(), 2u);
  Symbolizer sym(t);
  const std::vector<Frame> frames = sym.stack(t.events[0].stack);
  ASSERT_GE(frames.size(), 2u);
  EXPECT_EQ(frames[0].function, "symbolize_test::known_allocating_function(allocshim::trace::Recorder*)");
  EXPECT_TRUE(ends_with(frames[0].file, "symbolize_test.cpp")) << frames[0].file;
  EXPECT_EQ(frames[0].line, symbolize_test::g_outer_line);
  EXPECT_EQ(frames[0].module, "trace_tests");
  EXPECT_FALSE(frames[0].inlined);
  // The caller is the test body, which gtest runs from its own functions further out.
  bool saw_test_body = false;
  for (const Frame& f : frames)
    saw_test_body |= f.function.find("TraceSymbolize_KnownFunctionAndLine_Test::TestBody") != std::string::npos;
  EXPECT_TRUE(saw_test_body);
}

TEST(TraceSymbolize, InlinedFrames) {
  Trace t = record_known_functions();
  ASSERT_EQ(t.events.size(), 2u);
  Symbolizer sym(t);
  const std::vector<Frame> frames = sym.stack(t.events[1].stack);
  ASSERT_GE(frames.size(), 2u);
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

TEST(TraceSymbolize, DemangleLeavesPlainNamesAlone) {
  EXPECT_EQ(demangle("_ZN3foo3barEv"), "foo::bar()");
  EXPECT_EQ(demangle("main"), "main");
}
