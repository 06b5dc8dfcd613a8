// Damaged and cut traces: a cut file reads up to its last complete chunk with a warning; anything
// else wrong is a clear error, never garbage events.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.h"
#include "analysis/reader.h"
#include "trace/recorder.h"

namespace {

// A trace of `chunks` flushes of 50 alloc/free pairs each: one chunk per flush.
std::vector<unsigned char> make_trace(int chunks) {
  const std::string path = test::temp_path("damaged");
  Recorder* r = test::start_recorder(path, StackMode::native);
  for (int c = 0; c < chunks; ++c) {
    for (int i = 0; i < 50; ++i) {
      r->on_alloc(0x10000 + static_cast<DevPtr>(i) * 64, 64, 0, 0, Api::alloc, 1);
      r->on_free(0x10000 + static_cast<DevPtr>(i) * 64, 64, 0, 0, 1);
    }
    r->flush();
  }
  Recorder::stop();
  return test::read_bytes(path);
}

}  // namespace

TEST(TraceDamaged, CutAnywhereKeepsEveryCompleteChunk) {
  const std::vector<unsigned char> full = make_trace(4);
  Trace whole;
  std::string error;
  ASSERT_TRUE(parse_trace(full.data(), full.size(), whole, error)) << error;
  ASSERT_EQ(whole.events.size(), 400u);
  const std::vector<std::size_t> chunks = test::chunk_offsets(full);
  ASSERT_GE(chunks.size(), 4u);

  // Cut inside each chunk: the events of the chunks before it survive, in order.
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const std::size_t end = c + 1 < chunks.size() ? chunks[c + 1] : full.size();
    for (std::size_t cut : {chunks[c] + 5, (chunks[c] + end) / 2, end - 1}) {
      Trace t;
      ASSERT_TRUE(parse_trace(full.data(), cut, t, error)) << "cut at " << cut << ": " << error;
      EXPECT_FALSE(t.complete);
      ASSERT_FALSE(t.warnings.empty());
      EXPECT_NE(t.warnings[0].find("trace ends inside"), std::string::npos) << t.warnings[0];
      ASSERT_LE(t.events.size(), whole.events.size());
      for (std::size_t i = 0; i < t.events.size(); ++i) {
        EXPECT_EQ(t.events[i].addr, whole.events[i].addr);
        EXPECT_EQ(t.events[i].kind, whole.events[i].kind);
      }
    }
  }
  // Cut exactly between chunks: no partial chunk, only the missing end record is noted.
  Trace t;
  ASSERT_TRUE(parse_trace(full.data(), chunks[2], t, error)) << error;
  EXPECT_FALSE(t.complete);
  EXPECT_NE(t.warnings[0].find("exited abruptly"), std::string::npos);
}

TEST(TraceDamaged, FlippedByteInAChunkIsAnError) {
  std::vector<unsigned char> b = make_trace(2);
  const std::vector<std::size_t> chunks = test::chunk_offsets(b);
  ASSERT_GE(chunks.size(), 2u);
  // Inside the compressed data of the second chunk.
  b[chunks[1] + kChunkHeaderBytes + 20] ^= 0x5a;
  Trace t;
  std::string error;
  EXPECT_FALSE(parse_trace(b.data(), b.size(), t, error));
  EXPECT_NE(error.find("corrupted trace: chunk 1"), std::string::npos) << error;
}

TEST(TraceDamaged, BadChunkHeaderIsAnError) {
  std::vector<unsigned char> b = make_trace(1);
  b[kFileHeaderBytes] ^= 0xff;  // chunk magic
  Trace t;
  std::string error;
  EXPECT_FALSE(parse_trace(b.data(), b.size(), t, error));
  EXPECT_NE(error.find("bad chunk magic"), std::string::npos) << error;

  b = make_trace(1);
  b[kFileHeaderBytes + 11] = 0x7f;  // raw size far beyond the limit
  Trace t2;
  EXPECT_FALSE(parse_trace(b.data(), b.size(), t2, error));
  EXPECT_NE(error.find("MiB a chunk may hold"), std::string::npos) << error;
}

TEST(TraceDamaged, NotATraceOrWrongVersion) {
  const std::string text = "hello, this is not a trace file at all";
  Trace t;
  std::string error;
  EXPECT_FALSE(
      parse_trace(reinterpret_cast<const unsigned char*>(text.data()), text.size(), t, error));
  EXPECT_NE(error.find("not an allocshim trace"), std::string::npos) << error;

  EXPECT_FALSE(parse_trace(nullptr, 0, t, error));
  EXPECT_NE(error.find("too short"), std::string::npos) << error;

  std::vector<unsigned char> b = make_trace(1);
  EXPECT_FALSE(parse_trace(b.data(), 20, t, error));
  EXPECT_NE(error.find("truncated file header"), std::string::npos) << error;

  b[8] = 99;  // version
  EXPECT_FALSE(parse_trace(b.data(), b.size(), t, error));
  EXPECT_NE(error.find("unsupported trace format version 99"), std::string::npos) << error;
}

TEST(TraceDamaged, MissingFileIsAnError) {
  Trace t;
  std::string error;
  EXPECT_FALSE(read_trace("/nonexistent/trace", t, error));
  EXPECT_NE(error.find("/nonexistent/trace: cannot open"), std::string::npos) << error;
}
