// Report outputs against expected files, on a synthetic trace with Python frames (its symbols do
// not depend on the machine), merging of per-process traces, and advise's policy.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "policy/policy.h"
#include "policy/types.h"
#include "test_util.h"
#include "analysis/advise.h"
#include "analysis/analysis.h"
#include "analysis/reader.h"
#include "analysis/replay.h"
#include "analysis/report.h"
#include "sim/simulated_device.h"

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

// A small training-like program: 200 temporary 4 KiB blocks from alloc_buffers (through a native
// library), six large blocks of growing size from train_step, one failed 2 GiB allocation and one
// out-of-memory.
std::vector<unsigned char> synthetic_trace(std::uint32_t pid) {
  std::vector<unsigned char> b(kFileHeaderBytes);
  FileHeader h;
  h.pid = pid;
  h.start_mono_ns = 1000000000;
  encode_file_header(h, b.data());
  std::vector<unsigned char> raw;
  Encoder e(raw);
  test::record(e, Tag::process, pid, 1, 2, 1);
  e.str("/usr/bin/python3");
  e.str(std::string("python3\0train.py", 16));
  const char* names[][2] = {
      {"train_step", "train.py"}, {"alloc_buffers", "model.py"}, {"main", "train.py"}};
  for (std::uint32_t i = 0; i < 3; ++i) {
    test::record(e, Tag::py_func, i + 1, 10 * (i + 1));
    e.str(names[i][0]);
    e.str(names[i][1]);
  }
  // A library of the recording machine that is not here: its frame stays module+0xoffset.
  test::record(e, Tag::module, 1, 0x7f0000000000, 0x7f0000000000, 0x7f0000100000);
  e.str("/opt/gpu-machine/lib/libkernels.so");
  e.str("\x5a\x11\xce\x0d");
  const std::uint64_t nodes[][2] = {{0, python_frame(3, 40)},
                                    {1, python_frame(1, 12)},
                                    {2, python_frame(2, 25)},
                                    {1, python_frame(1, 15)},
                                    {3, 0x7f0000001235}};
  for (std::uint32_t i = 0; i < 5; ++i) {
    test::record(e, Tag::stack_node, i + 1, nodes[i][0], nodes[i][1]);
  }
  test::record(e, Tag::backend, 0, 0);
  e.str("native");
  test::record(e, Tag::backend, 1, 1);
  e.str("pool");
  test::record(e, Tag::thread, 7, 1000000000);
  std::uint64_t last_addr = 0;
  auto addr = [&](std::uint64_t a) {
    e.u(zigzag(static_cast<std::int64_t>(a - last_addr)));
    last_addr = a;
  };
  for (int i = 0; i < 200; ++i) {
    test::record(e, Tag::alloc, 1000, 0, 4096);
    addr(0x10000000);
    e.u(1);
    e.u(0);
    e.u(2000);
    e.u(5);
    test::record(e, Tag::free, 500, 0, 4096);
    addr(0x10000000);
    e.u(1);
    e.u(300);
    e.u(0);
  }
  for (int i = 0; i < 6; ++i) {
    const std::uint64_t size = (256 + 64 * i) * kMiB;
    test::record(e, Tag::alloc, 100000, 0, size);
    addr(0x200000000 + i * (1ull << 30));
    e.u(0);
    e.u(0);
    e.u(80000);
    e.u(4);
  }
  for (int i = 0; i < 6; ++i) {
    const std::uint64_t size = (256 + 64 * i) * kMiB;
    test::record(e, Tag::free, 100000, 0, size);
    addr(0x200000000 + i * (1ull << 30));
    e.u(0);
    e.u(40000);
    e.u(0);
  }
  test::record(e, Tag::alloc_fail, 5000, 0, 2048 * kMiB, 0, 0, 2, 90000, 4);
  test::record(e, Tag::oom, 5000, 0, 2048 * kMiB, 8192 * kMiB, 7936 * kMiB, 4);
  test::record(e, Tag::end, 416, 0);
  ChunkCompressor c;
  std::vector<unsigned char> chunk;
  EXPECT_TRUE(c.compress(raw.data(), raw.size(), chunk));
  b.insert(b.end(), chunk.begin(), chunk.end());
  return b;
}

std::unique_ptr<Analysis> analysis_of(std::initializer_list<std::uint32_t> pids,
                                      const AnalyzeOptions& options = {}) {
  std::vector<Trace> traces;
  for (std::uint32_t pid : pids) {
    const std::vector<unsigned char> bytes = synthetic_trace(pid);
    Trace t;
    std::string error;
    EXPECT_TRUE(parse_trace(bytes.data(), bytes.size(), t, error)) << error;
    t.path = "synthetic-" + std::to_string(pid) + ".trace";
    traces.push_back(std::move(t));
  }
  return analyze(std::move(traces), options);
}

// The checked-in trace the golden outputs are made from (data/small.allocshim-trace: synthetic_trace(4242),
// Python frames only, so that its symbols do not depend on the machine reading it).
// ALLOCSHIM_UPDATE_GOLDEN=1 writes it again first.
std::unique_ptr<Analysis> small_trace() {
  const std::string path = std::string(ALLOCSHIM_TEST_DATA) + "/small.allocshim-trace";
  if (std::getenv("ALLOCSHIM_UPDATE_GOLDEN")) {
    const std::vector<unsigned char> bytes = synthetic_trace(4242);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
  std::vector<Trace> traces(1);
  std::string error;
  EXPECT_TRUE(read_trace(path, traces[0], error)) << error;
  traces[0].path = "small.allocshim-trace";
  // Every frame, the native one below the Python code too (a Python site's report starts at its
  // Python line by default: python_sites_test.cpp).
  AnalyzeOptions o;
  o.native_frames = true;
  return analyze(std::move(traces), o);
}

// Compares with tests/trace/data/NAME; ALLOCSHIM_UPDATE_GOLDEN=1 rewrites the file instead.
void expect_golden(const std::string& name, const std::string& actual) {
  const std::string path = std::string(ALLOCSHIM_TEST_DATA) + "/" + name;
  if (std::getenv("ALLOCSHIM_UPDATE_GOLDEN")) {
    std::ofstream(path, std::ios::binary) << actual;
    return;
  }
  EXPECT_EQ(actual, test::read_text(path))
      << "differs from " << path << " (ALLOCSHIM_UPDATE_GOLDEN=1 rewrites it)";
}

std::string render(Format f, const Analysis& a, ReportOptions o = {}) {
  std::ostringstream out;
  write_report(f, a, o, out);
  return out.str();
}

}  // namespace

TEST(TraceReport, TableMatchesExpected) {
  auto a = small_trace();
  expect_golden("report.table.txt", render(Format::table, *a));
}

TEST(TraceReport, SortedTableShowsOneSection) {
  auto a = analysis_of({4242});
  ReportOptions o;
  o.sorted = true;
  o.sort = Metric::temporary;
  o.top = 1;
  const std::string out = render(Format::table, *a, o);
  EXPECT_NE(out.find("Top 1 sites by temporary allocations"), std::string::npos) << out;
  EXPECT_EQ(out.find("Top 1 sites by bytes allocated"), std::string::npos) << out;
  // A Python site starts at its Python line (the native frame below it: --native-frames).
  EXPECT_NE(out.find("at alloc_buffers (model.py:25)\n       by train_step"), std::string::npos)
      << out;
}

// A format whose whole output is checked in: tests/trace/data/file.
struct Golden {
  Format format;
  const char* name;
  const char* file;
};

class TraceReportGolden : public ::testing::TestWithParam<Golden> {};

TEST_P(TraceReportGolden, MatchesExpected) {
  auto a = small_trace();
  expect_golden(GetParam().file, render(GetParam().format, *a));
}

INSTANTIATE_TEST_SUITE_P(
    Formats, TraceReportGolden,
    ::testing::Values(Golden{Format::collapsed, "collapsed", "report.collapsed.txt"},
                      Golden{Format::json, "json", "report.json"},
                      Golden{Format::speedscope, "speedscope", "report.speedscope.json"},
                      Golden{Format::perfetto, "perfetto", "report.perfetto.json"}),
    [](const auto& info) { return std::string(info.param.name); });

// The page as this side writes it (summary, sites table, the data the script draws from), without
// the inlined script and style (report_html.js and .css, checked in Chromium by html_test.cpp).
TEST(TraceReport, HtmlMatchesExpected) {
  auto a = small_trace();
  std::string html = render(Format::html, *a);
  for (const std::string tag : {"style", "script"}) {
    const std::string open = "<" + tag + ">";
    const std::size_t b = html.find(open), e = html.find("</" + tag + ">", b);
    ASSERT_NE(b, std::string::npos);
    ASSERT_NE(e, std::string::npos);
    html.replace(b + open.size(), e - b - open.size(), "[inlined]");
  }
  expect_golden("report.html", html);
}

TEST(TraceReport, MemorySnapshotMatchesExpected) {
  auto a = small_trace();
  expect_golden("report.memory_snapshot.pickle", render(Format::memory_snapshot, *a));
}

// Names come from the traced machine as bytes: every format writes them without throwing, and the
// JSON and HTML outputs are valid UTF-8 (invalid bytes replaced by U+FFFD).
TEST(TraceReport, NamesThatAreNotUtf8) {
  Trace t;
  t.path = "run-\xff.trace";
  t.process.pid = 7;
  t.process.exe = "/opt/\xc3(app";
  t.functions[1] = {1, "f\xe2\x82", "mod\xfe.py"};
  t.nodes[1] = {0, python_frame(1, 3)};
  t.backends[0] = {"native\x80", 0};
  Event e;
  e.size = 4096;
  e.addr = 0x1000;
  e.stack = 1;
  t.events.push_back(e);
  std::vector<Trace> traces;
  traces.push_back(std::move(t));
  auto a = analyze(std::move(traces));
  for (Format f : {Format::table, Format::collapsed, Format::speedscope, Format::perfetto,
                   Format::json, Format::html, Format::memory_snapshot}) {
    std::string out;
    ASSERT_NO_THROW(out = render(f, *a)) << static_cast<int>(f);
    if (f == Format::json || f == Format::speedscope || f == Format::perfetto) {
      nlohmann::json parsed;
      EXPECT_NO_THROW(parsed = nlohmann::json::parse(out))
          << out;  // the parser rejects invalid UTF-8
      EXPECT_EQ(valid_utf8(out), out);
    }
    if (f == Format::html) {
      EXPECT_EQ(valid_utf8(out), out);
      EXPECT_NE(out.find("/opt/\xef\xbf\xbd(app"), std::string::npos);
    }
  }
  EXPECT_EQ(valid_utf8("ok \xc3\xa9 \xf0\x9f\x98\x80"), "ok \xc3\xa9 \xf0\x9f\x98\x80");
  EXPECT_EQ(valid_utf8("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // a surrogate
  EXPECT_EQ(valid_utf8("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");                  // overlong
}

// The timeline keeps the allocations that held the most memory over time, within its bound.
TEST(TraceReport, KeepsTheAllocationsThatHeldTheMost) {
  AnalyzeOptions o;
  o.max_allocations = 3;
  auto a = analysis_of({4242}, o);
  ASSERT_EQ(a->allocations.size(), 3u);
  EXPECT_EQ(a->allocations_omitted, 203u);
  // The six large blocks live 600 us each: the three largest, in allocation order.
  EXPECT_EQ(a->allocations[0].size, 448 * kMiB);
  EXPECT_EQ(a->allocations[1].size, 512 * kMiB);
  EXPECT_EQ(a->allocations[2].size, 576 * kMiB);
  EXPECT_EQ(a->allocations[2].free_ns - a->allocations[2].alloc_ns, 600000u);
}

// Downsampled, the total still reaches the peak and never exceeds it (the series' maxima, summed,
// would: the small blocks' series and the large blocks' peak in different moments of a stretch).
TEST(TraceReport, TotalIsTheEnvelopeWhenDownsampled) {
  AnalyzeOptions o;
  o.max_points = 4;
  auto a = analysis_of({4242}, o);
  ASSERT_LE(a->total.points.size(), 2 * o.max_points + 3);
  std::uint64_t highest = 0;
  for (const Point& p : a->total.points) highest = std::max(highest, p.bytes);
  EXPECT_EQ(highest, a->totals.peak_live);
  EXPECT_EQ(a->total.peak, a->totals.peak_live);
}

// A migration moves the bytes of a live block from one backend's series to the other's; the
// Perfetto timeline shows the move as a slice of the time it took, ending when it was recorded.
TEST(TraceReport, MigrationMovesBytesBetweenSeries) {
  Trace t;
  t.backends[0] = {"vmm", static_cast<std::uint8_t>(allocshim::BackendKind::vmm)};
  t.backends[1] = {"host", static_cast<std::uint8_t>(allocshim::BackendKind::host)};
  auto event = [&](EventKind k, std::uint64_t time, std::uint64_t size, std::uint64_t addr,
                   int backend) {
    Event e;
    e.kind = k;
    e.time_ns = time;
    e.size = size;
    e.addr = addr;
    e.backend = backend;
    t.events.push_back(e);
    return &t.events.back();
  };
  event(EventKind::alloc, 1000, 8 * kMiB, 0x10000000, 1)->flags = kAllocSpilled;
  Event* move =
      event(EventKind::migrate, 2000, 2 * kMiB, 0x10000000 + 2 * kMiB, 1);  // a chunk inside
  move->to_backend = 0;
  move->dur_ns = 600;
  event(EventKind::free, 3000, 8 * kMiB, 0x10000000, 1);
  std::vector<Trace> traces;
  traces.push_back(std::move(t));
  auto a = analyze(std::move(traces));
  ASSERT_EQ(a->series.size(), 2u);
  const Series& host = a->series[0].backend == 1 ? a->series[0] : a->series[1];
  const Series& device = a->series[0].backend == 0 ? a->series[0] : a->series[1];
  ASSERT_EQ(host.points.size(), 3u);
  EXPECT_EQ(host.points[1].bytes, 6 * kMiB);
  EXPECT_EQ(host.points[2].bytes, 0u);
  ASSERT_EQ(device.points.size(), 2u);
  EXPECT_EQ(device.points[0].bytes, 2 * kMiB);
  EXPECT_EQ(device.points[1].bytes, 0u);
  ASSERT_EQ(a->allocations.size(), 1u);
  EXPECT_TRUE(a->allocations[0].spilled);
  EXPECT_EQ(a->allocations[0].migrations, 1u);
  EXPECT_EQ(a->allocations[0].migrated_bytes, 2 * kMiB);
  const nlohmann::json doc = nlohmann::json::parse(render(Format::perfetto, *a));
  int slices = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("name", "") != "migration") continue;
    ++slices;
    EXPECT_EQ(e["ph"], "X");
    EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 0.6);
    EXPECT_DOUBLE_EQ(e["ts"].get<double>(), static_cast<double>(2000 - 600 - a->start_ns) / 1000.0);
  }
  EXPECT_EQ(slices, 1);
}

TEST(TraceReport, FiguresOfTheSyntheticProgram) {
  auto a = analysis_of({4242});
  const Totals& t = a->totals;
  EXPECT_EQ(t.allocs, 206u);
  EXPECT_EQ(t.frees, 206u);
  // The 200 small blocks, and the last large block: freed with no allocation after it.
  EXPECT_EQ(t.temporaries, 201u);
  EXPECT_EQ(t.failures, 1u);
  EXPECT_EQ(t.ooms, 1u);
  // The six large blocks are all live after the sixth allocation.
  EXPECT_EQ(t.peak_live, (256 + 320 + 384 + 448 + 512 + 576) * kMiB);
  const auto peak = a->top(Metric::peak, 1);
  ASSERT_EQ(peak.size(), 1u);
  EXPECT_EQ(peak[0]->frames[0].label(), "train_step (train.py:15)");
  EXPECT_EQ(peak[0]->held_at_peak, t.peak_live);
  EXPECT_EQ(peak[0]->failures, 1u);
}

TEST(TraceReport, TracesOfSeveralProcessesMerge) {
  auto a = analysis_of({100, 200});
  EXPECT_EQ(a->totals.allocs, 412u);
  // Same symbolized stacks in both processes: one site each, with both processes' calls.
  const auto calls = a->top(Metric::calls, 0);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]->calls, 400u);
  EXPECT_EQ(calls[1]->calls, 12u);
  // Both processes' blocks are live together at the peak.
  EXPECT_EQ(a->totals.peak_live, 2 * (256 + 320 + 384 + 448 + 512 + 576) * kMiB);
  const std::string perfetto = render(Format::perfetto, *a);
  EXPECT_NE(perfetto.find("\"pid\":100"), std::string::npos);
  EXPECT_NE(perfetto.find("\"pid\":200"), std::string::npos);
}

TEST(TraceAdvise, PolicyIsAcceptedAndCitesEvidence) {
  auto a = analysis_of({4242});
  const std::string toml = advise(*a);
  allocshim::policy::Policy p;
  std::vector<allocshim::policy::Diagnostic> diags;
  ASSERT_TRUE(allocshim::policy::load_string(toml, "advice", p, diags))
      << (diags.empty() ? toml : diags[0].str());
  // The trace churns small blocks and has large ones of changing sizes: the embedded default
  // (measured fastest for both) serves them, cited as evidence, with no rule of its own.
  const auto& def = allocshim::policy::default_policy();
  EXPECT_EQ(p.backends[static_cast<std::size_t>(p.default_backend)].kind,
            def.backends[static_cast<std::size_t>(def.default_backend)].kind);
  EXPECT_EQ(p.default_free_sync, def.default_free_sync);
  EXPECT_TRUE(p.rules.empty()) << toml;
  EXPECT_NE(toml.find("200 temporary: alloc_buffers (model.py:25)"), std::string::npos) << toml;
  EXPECT_NE(toml.find("train_step (train.py:15)"), std::string::npos) << toml;
  EXPECT_EQ(p.budget.spill, allocshim::policy::Budget::Spill::host);
  EXPECT_NE(toml.find("1 allocations failed and 1 hit out-of-memory"), std::string::npos) << toml;
}

// The synthetic program's trace replayed on a simulated device of `capacity` bytes under the
// default policy.
ReplayResult replay_synthetic_on(std::uint64_t capacity) {
  std::string error;
  allocshim::sim::SimulatedDevice sim({1, capacity});
  const std::vector<unsigned char> bytes = synthetic_trace(4242);
  std::vector<Trace> traces(1);
  if (!parse_trace(bytes.data(), bytes.size(), traces[0], error)) {
    ADD_FAILURE() << error;
    return {};
  }
  return replay(traces, sim.driver(), allocshim::policy::default_policy());
}

TEST(TraceReplay, SimulatedDeviceServesTheSequence) {
  const ReplayResult r = replay_synthetic_on(4ull << 30);
  EXPECT_TRUE(r.error.empty()) << r.error;
  // 206 allocations and the failed one tried again; every traced free found its block.
  EXPECT_EQ(r.allocs, 207u);
  EXPECT_EQ(r.frees, 206u);
  EXPECT_EQ(r.trace_failures, 1u);
  // The 2 GiB block failed in the trace, but all large blocks are free by then here: served.
  EXPECT_EQ(r.failures, 0u);
  EXPECT_EQ(r.recovered, 1u);
  EXPECT_EQ(r.peak_live, (256 + 320 + 384 + 448 + 512 + 576) * kMiB);
  EXPECT_GE(r.peak_reserved, r.peak_live);
  EXPECT_EQ(r.alloc_ns.count, 207u);
  EXPECT_EQ(r.alloc_ns.samples.size(), 207u);
}

// Replay's per-operation times take bounded memory however long the trace: a uniform sample.
TEST(TraceReplay, DurationsKeepABoundedSample) {
  Durations d;
  const std::uint64_t n = Durations::kMaxSamples + 100000;
  for (std::uint64_t i = 0; i < n; ++i) d.add(static_cast<std::uint32_t>(i % 1000));
  EXPECT_EQ(d.count, n);
  EXPECT_EQ(d.samples.size(), Durations::kMaxSamples);
  EXPECT_NEAR(d.mean(), 499.5, 1.0);
  EXPECT_NEAR(d.percentile(0.5), 500.0, 10.0);
}

TEST(TraceReplay, SmallDeviceFailsAndSaysSo) {
  const ReplayResult r = replay_synthetic_on(1ull << 30);
  // 1 GiB holds the first three large blocks (256+320+384 MiB) but not the fourth onwards.
  EXPECT_EQ(r.failures, 4u);
  std::ostringstream out;
  write_replay_text(r, out);
  EXPECT_NE(out.str().find("failed: 4"), std::string::npos) << out.str();
}
