// The fuzz property (fuzz_reader.h) over real traces and many deterministic mutations of them:
// truncations, flipped bytes and overwritten chunk headers, with and without zstd framing intact.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "fuzz_reader.h"
#include "test_util.h"
#include "trace/recorder.h"

using namespace allocshim::trace;
namespace test = allocshim::test;

namespace {

std::vector<unsigned char> seed_trace() {
  const std::string path = test::temp_path("fuzzseed");
  Recorder* r = test::start_recorder(path, StackMode::native);
  test::describe_two_backends(r);
  for (int i = 0; i < 300; ++i) {
    r->on_alloc(0x1000 + static_cast<allocshim::DevPtr>(i) * 64, 64, 0, i % 2, allocshim::Api::alloc, 5);
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
  ASSERT_EQ(allocshim::trace::fuzz::check_input(seed.data(), seed.size()), "");
  std::mt19937_64 rng(12345);
  for (int round = 0; round < 3000; ++round) {
    std::vector<unsigned char> b = seed;
    switch (round % 3) {
      case 0:
        b.resize(rng() % (b.size() + 1));
        break;
      case 1:
        for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k)
          b[rng() % b.size()] ^= static_cast<unsigned char>(1u << (rng() % 8));
        break;
      case 2: {
        const std::size_t at = rng() % b.size();
        for (std::size_t k = at; k < b.size() && k < at + 12; ++k) b[k] = static_cast<unsigned char>(rng());
        break;
      }
    }
    const std::string failure = allocshim::trace::fuzz::check_input(b.data(), b.size());
    ASSERT_EQ(failure, "") << "round " << round;
  }
}
