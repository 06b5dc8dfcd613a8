// The fuzz property (fuzz_reader.h) over real traces and many deterministic mutations of them:
// truncations, flipped bytes and overwritten chunk headers, with and without zstd framing intact.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "fuzz_reader.h"
#include "test_util.h"
#include "trace/format.h"
#include "trace/recorder.h"

namespace {

std::vector<unsigned char> seed_trace() {
  const std::string path = test::temp_path("fuzzseed");
  Recorder* r = test::start_recorder(path, StackMode::native);
  test::describe_two_backends(r);
  for (int i = 0; i < 300; ++i) {
    r->on_alloc(0x1000 + static_cast<allocshim::DevPtr>(i) * 64, 64, 0, i % 2,
                allocshim::Api::alloc, 5);
    if (i % 3) r->on_free(0x1000 + static_cast<allocshim::DevPtr>(i) * 64, 64, 0, i % 2, 5);
    if (i % 100 == 0) r->flush();
  }
  r->on_alloc_failed(1 << 30, 0, 0, allocshim::Api::alloc, 2, 9);
  Recorder::stop();
  return test::read_bytes(path);
}

}  // namespace

TEST(TraceFuzz, SeedAndMutationsAreHandled) {
  const std::vector<unsigned char> seed = seed_trace();
  ASSERT_EQ(allocshim::analysis::fuzz::check_input(seed.data(), seed.size()), "");
  std::mt19937_64 rng(12345);
  for (int round = 0; round < 3000; ++round) {
    std::vector<unsigned char> b = seed;
    switch (round % 3) {
      case 0: b.resize(rng() % (b.size() + 1)); break;
      case 1:
        for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k)
          b[rng() % b.size()] ^= static_cast<unsigned char>(1u << (rng() % 8));
        break;
      case 2: {
        const std::size_t at = rng() % b.size();
        for (std::size_t k = at; k < b.size() && k < at + 12; ++k)
          b[k] = static_cast<unsigned char>(rng());
        break;
      }
    }
    const std::string failure = allocshim::analysis::fuzz::check_input(b.data(), b.size());
    ASSERT_EQ(failure, "") << "round " << round;
  }
}

// Past the compression layer: the decoded records of the seed trace, cut, flipped and overwritten,
// framed again with valid checksums (check_records), so that mutations reach the record parser.
TEST(TraceFuzz, RecordMutationsAreHandled) {
  const std::vector<unsigned char> seed = seed_trace();
  // The seed's records: every chunk decompressed and concatenated.
  std::vector<unsigned char> records{0};  // one chunk
  ChunkDecompressor dec;
  for (std::size_t pos = kFileHeaderBytes; pos + kChunkHeaderBytes <= seed.size();) {
    ChunkHeader h;
    std::string e;
    ASSERT_TRUE(decode_chunk_header(seed.data() + pos, h, e)) << e;
    std::vector<unsigned char> raw;
    ASSERT_TRUE(dec.decompress(seed.data() + pos + kChunkHeaderBytes, h.compressed, h.raw, raw, e))
        << e;
    records.insert(records.end(), raw.begin(), raw.end());
    pos += kChunkHeaderBytes + h.compressed;
  }
  ASSERT_EQ(allocshim::analysis::fuzz::check_records(records.data(), records.size()), "");
  std::mt19937_64 rng(54321);
  for (int round = 0; round < 3000; ++round) {
    std::vector<unsigned char> b = records;
    b[0] = static_cast<unsigned char>(rng());
    switch (round % 3) {
      case 0: b.resize(1 + rng() % b.size()); break;
      case 1:
        for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k)
          b[1 + rng() % (b.size() - 1)] ^= static_cast<unsigned char>(1u << (rng() % 8));
        break;
      case 2: {
        const std::size_t at = 1 + rng() % (b.size() - 1);
        for (std::size_t k = at; k < b.size() && k < at + 8; ++k)
          b[k] = static_cast<unsigned char>(rng());
        break;
      }
    }
    const std::string failure = allocshim::analysis::fuzz::check_records(b.data(), b.size());
    ASSERT_EQ(failure, "") << "round " << round;
  }
}
