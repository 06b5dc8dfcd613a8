// The shared format primitives: varints, zigzag, headers, path expansion.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "trace/format.h"

using namespace allocshim::trace;

TEST(TraceFormat, VarintsRoundTripAtEveryLength) {
  std::vector<std::uint64_t> values = {
      0, 1, 127, 128, 16383, 16384, (1ull << 35) + 7, std::numeric_limits<std::uint64_t>::max()};
  std::vector<unsigned char> buf;
  Encoder e(buf);
  for (std::uint64_t v : values) e.u(v);
  e.str("abc");
  EXPECT_EQ(buf[0], 0u);
  EXPECT_EQ(buf.size(), 1 + 1 + 1 + 2 + 2 + 3 + 6 + 10 + 4u);
  Decoder d(buf.data(), buf.size());
  for (std::uint64_t v : values) EXPECT_EQ(d.u(), v);
  EXPECT_EQ(d.str(), "abc");
  EXPECT_TRUE(d.done());
  EXPECT_FALSE(d.failed);
  EXPECT_EQ(d.u(), 0u);  // past the end
  EXPECT_TRUE(d.failed);
}

TEST(TraceFormat, OverlongVarintAndStringFail) {
  const unsigned char overlong[11] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
                                      0x80, 0x80, 0x80, 0x80, 1};
  Decoder d(overlong, sizeof overlong);
  d.u();
  EXPECT_TRUE(d.failed);
  const unsigned char str[2] = {5, 'a'};  // claims 5 bytes, has 1
  Decoder s(str, sizeof str);
  EXPECT_EQ(s.str(), "");
  EXPECT_TRUE(s.failed);
}

TEST(TraceFormat, ZigzagKeepsSmallDeltasSmall) {
  for (std::int64_t v : std::initializer_list<std::int64_t>{
           0, 1, -1, 4096, -4096, std::numeric_limits<std::int64_t>::min()})
    EXPECT_EQ(unzigzag(zigzag(v)), v);
  EXPECT_EQ(zigzag(-1), 1u);
  EXPECT_EQ(zigzag(1), 2u);
}

TEST(TraceFormat, PythonFramesAreTaggedApartFromAddresses) {
  const std::uint64_t f = python_frame(12345, 678);
  EXPECT_TRUE(is_python_frame(f));
  EXPECT_EQ(python_func(f), 12345u);
  EXPECT_EQ(python_line(f), 678u);
  EXPECT_FALSE(is_python_frame(0x00007fffffffe000ull));
}

TEST(TraceFormat, HeaderRoundTrip) {
  FileHeader h;
  h.pid = 4242;
  h.start_mono_ns = 123456789;
  h.start_real_ns = 987654321;
  unsigned char b[kFileHeaderBytes];
  encode_file_header(h, b);
  FileHeader r;
  std::string error;
  ASSERT_TRUE(decode_file_header(b, sizeof b, r, error)) << error;
  EXPECT_EQ(r.pid, 4242u);
  EXPECT_EQ(r.start_mono_ns, 123456789u);
  EXPECT_EQ(r.start_real_ns, 987654321u);
}

TEST(TraceFormat, CompressedChunkRoundTrip) {
  std::vector<unsigned char> raw(100000);
  for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<unsigned char>(i % 7);
  ChunkCompressor c;
  std::vector<unsigned char> chunk;
  ASSERT_TRUE(c.compress(raw.data(), raw.size(), chunk));
  EXPECT_LT(chunk.size(), raw.size() / 10);
  ChunkHeader h;
  std::string error;
  ASSERT_TRUE(decode_chunk_header(chunk.data(), h, error)) << error;
  EXPECT_EQ(h.raw, raw.size());
  EXPECT_EQ(h.compressed + kChunkHeaderBytes, chunk.size());
  ChunkDecompressor d;
  std::vector<unsigned char> back;
  ASSERT_TRUE(d.decompress(chunk.data() + kChunkHeaderBytes, h.compressed, h.raw, back, error))
      << error;
  EXPECT_EQ(back, raw);
}

TEST(TraceFormat, PathExpansion) {
  EXPECT_EQ(expand_path("/tmp/t.%p.bin", 77), "/tmp/t.77.bin");
  EXPECT_EQ(expand_path("a%%p%", 1), "a%p%");
  EXPECT_EQ(expand_path("plain", 1), "plain");
}
