// The streaming analysis (load_and_analyze: two passes over each file, chunks merged in time order)
// against the analysis of traces read whole (read_trace + analyze, whose results the golden files
// of report_test pin): equal on a multi-threaded trace from the real recorder, on chunks written out
// of time order with equal timestamps across threads, and on several processes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_util.h"
#include "analysis/analysis.h"
#include "analysis/load.h"
#include "analysis/reader.h"
#include "analysis/report.h"

namespace {

class Stream : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::temp_path("stream");
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Every figure of the analysis: the JSON report with every site of every metric.
  static std::string everything(const Analysis& a) {
    ReportOptions o;
    o.top = 0;
    std::ostringstream out;
    write_json(a, o, out);
    return out.str();
  }

  void expect_streaming_equals_whole(const std::vector<std::string>& paths) {
    std::string error;
    auto streamed = load_and_analyze(paths, {}, error);
    ASSERT_NE(streamed, nullptr) << error;
    std::vector<Trace> traces;
    ASSERT_TRUE(load_traces(paths, traces, error)) << error;
    auto whole = analyze(std::move(traces));
    EXPECT_EQ(everything(*streamed), everything(*whole));
    EXPECT_EQ(streamed->totals.peak_live, whole->totals.peak_live);
    EXPECT_GT(streamed->totals.allocs, 0u);
  }

  std::string dir_;
};

// A trace of several chunks. Thread 1's second chunk comes first in the file although its events
// are later (the writer can submit a thread's full buffer after its next partial one), and threads
// 1 and 2 have events at the same nanosecond.
std::vector<unsigned char> out_of_order_trace(std::uint32_t pid) {
  std::vector<unsigned char> b(kFileHeaderBytes);
  FileHeader h;
  h.pid = pid;
  encode_file_header(h, b.data());
  ChunkCompressor c;
  auto chunk = [&](const std::vector<unsigned char>& raw) {
    std::vector<unsigned char> out;
    EXPECT_TRUE(c.compress(raw.data(), raw.size(), out));
    b.insert(b.end(), out.begin(), out.end());
  };
  std::vector<unsigned char> raw;
  Encoder e(raw);
  test::record(e, Tag::process, pid, 1, 1, 1);
  e.str("/bin/prog");
  e.str("prog");
  test::record(e, Tag::backend, 0, 0);
  e.str("native");
  test::record(e, Tag::stack_node, 1, 0, 0x1000);
  test::record(e, Tag::stack_node, 2, 0, 0x2000);
  chunk(raw);
  // Thread 1, later events: frees block A (allocated in the next chunk), allocates B.
  raw.clear();
  test::record(e, Tag::thread, 1, 5000);
  test::record(e, Tag::free, 0, 0, 4096, zigzag(0xa000), 0, 10, 0);
  test::record(e, Tag::alloc, 0, 0, 8192, zigzag(0x1000), 0, 0, 20, 1);
  test::record(e, Tag::thread, 2, 3000);
  test::record(e, Tag::alloc, 0, 0, 1 << 20, zigzag(0x100000), 0, 0, 30, 2);
  test::record(e, Tag::free, 2000, 0, 1 << 20, zigzag(0), 0, 10, 0);
  chunk(raw);
  // Thread 1, earlier events: allocates A at 1000 and C at 5000 (the time of the free above).
  raw.clear();
  test::record(e, Tag::thread, 1, 1000);
  test::record(e, Tag::alloc, 0, 0, 4096, zigzag(0xa000), 0, 0, 20, 1);
  test::record(e, Tag::alloc, 4000, 0, 65536, zigzag(0x10000), 0, 0, 20, 1);
  test::record(e, Tag::end, 6, 0);
  chunk(raw);
  return b;
}

}  // namespace

TEST_F(Stream, ChunksOutOfTimeOrder) {
  const std::string path = dir_ + "/ooo.trace";
  const std::vector<unsigned char> bytes = out_of_order_trace(10);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  expect_streaming_equals_whole({path});
  std::string error;
  auto a = load_and_analyze({path}, {}, error);
  ASSERT_NE(a, nullptr) << error;
  // Block A's free (file position before its allocation, later in time) matched it.
  EXPECT_EQ(a->totals.unmatched_frees, 0u);
  // At 5000 ns, in file order: A freed, B allocated (the peak: B and thread 2's block), thread 2's
  // block freed, C allocated.
  EXPECT_EQ(a->totals.peak_live, 8192u + (1u << 20));
}

TEST_F(Stream, RecordedMultiThreadedTrace) {
  const std::string path = dir_ + "/gen.trace";
  const std::string cmd =
      std::string(ALLOCSHIM_TRACE_GEN) + " " + path + " 400000 4 16 8 > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  expect_streaming_equals_whole({path});
}

TEST_F(Stream, SeveralProcesses) {
  std::vector<std::string> paths;
  for (int p = 0; p < 3; ++p) {
    paths.push_back(dir_ + "/ooo." + std::to_string(p) + ".trace");
    const std::vector<unsigned char> bytes =
        out_of_order_trace(100 + static_cast<std::uint32_t>(p));
    std::ofstream(paths.back(), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
  expect_streaming_equals_whole(paths);
  std::string error;
  auto a = load_and_analyze(paths, {}, error);
  ASSERT_NE(a, nullptr) << error;
  // Equal times in process order: every process's A and 1 MiB block, then process 0 swaps A for B.
  EXPECT_EQ(a->totals.peak_live, 3 * (4096u + (1u << 20)) + 4096u);
  EXPECT_EQ(a->series.size(), 3u);  // one per process (one device, one backend each)
}

TEST_F(Stream, SeveralOutputsFromOneReading) {
  const std::string trace = dir_ + "/ooo.trace";
  const std::vector<unsigned char> bytes = out_of_order_trace(10);
  std::ofstream(trace, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  const std::string tool = ALLOCSHIM_TOOL;
  const std::string both =
      tool + " report -f json -o " + dir_ + "/a.json -f collapsed -o " + dir_ + "/a.txt " + trace;
  ASSERT_EQ(std::system(both.c_str()), 0) << both;
  const std::string json = tool + " report -f json -o " + dir_ + "/b.json " + trace;
  const std::string collapsed = tool + " report -f collapsed " + trace + " > " + dir_ + "/b.txt";
  ASSERT_EQ(std::system(json.c_str()), 0);
  ASSERT_EQ(std::system(collapsed.c_str()), 0);
  EXPECT_EQ(test::read_text(dir_ + "/a.json"), test::read_text(dir_ + "/b.json"));
  EXPECT_EQ(test::read_text(dir_ + "/a.txt"), test::read_text(dir_ + "/b.txt"));
  EXPECT_FALSE(test::read_text(dir_ + "/a.txt").empty());
  // Formats and outputs that do not pair up stop before reading anything.
  const std::string unpaired =
      tool + " report -f json -f html -o " + dir_ + "/c.json " + trace + " 2>/dev/null";
  EXPECT_EQ(WEXITSTATUS(std::system(unpaired.c_str())), 2);
}

TEST_F(Stream, CheckedInGoldenTrace) {
  // The trace report_test's golden outputs come from (made by the analysis before it streamed).
  expect_streaming_equals_whole({std::string(ALLOCSHIM_TEST_DATA) + "/small.allocshim-trace"});
}
