// The fuzz property of the node budget's region (node_region_fuzz.h) over seeds and deterministic
// random inputs: raw contents, a valid region patched anywhere, operations of two members
// interleaved with writes and truncations of the file.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "node/node_region.h"
#include "core_fixture.h"
#include "node_region_fuzz.h"

namespace {

class RegionFuzz : public allocshim::testing::EmptyDirTest {
 protected:
  RegionFuzz() : EmptyDirTest("allocshim-region") {}
  std::string check(const std::vector<std::uint8_t>& in) {
    return allocshim::node::fuzz::check_input(in.data(), in.size(), dir_);
  }
};

// One op record: kind, member and device, a 16-bit argument, a 64-bit value.
void op(std::vector<std::uint8_t>& in, int kind, int a, std::uint16_t b, std::uint64_t v) {
  in.push_back(static_cast<std::uint8_t>(kind));
  in.push_back(static_cast<std::uint8_t>(a));
  in.insert(in.end(), reinterpret_cast<const std::uint8_t*>(&b),
            reinterpret_cast<const std::uint8_t*>(&b) + 2);
  in.insert(in.end(), reinterpret_cast<const std::uint8_t*>(&v),
            reinterpret_cast<const std::uint8_t*>(&v) + 8);
}

// Two members attach, grow, ask each other, answer, while the file is written and cut.
std::vector<std::uint8_t> seed(bool fresh) {
  std::vector<std::uint8_t> in = {static_cast<std::uint8_t>(fresh ? 1 : 0), 0, 0, 0};
  int n = 0;
  const auto add = [&](int kind, int a, std::uint16_t b, std::uint64_t v) {
    op(in, kind, a, b, v);
    ++n;
  };
  add(7, 0, 0, 512u << 20);           // member 0 attaches device 0
  add(8, 0, 0, 0);                    // member 1 joins
  add(7, 0x80, 0, 256u << 20);        // and attaches device 0 (a smaller limit of its own)
  add(0, 0, 0, 448u << 20);           // member 0 grows
  add(0, 0x80, 0x100, 256u << 20);    // member 1 grows, asks
  add(4, 0, 0, 0);                    // member 0 sees the request
  add(3, 0, 0, 0);                    // and takes it
  add(1, 0, 0, 64u << 20);            // gives room back
  add(2, 0x80, 0, 0);                 // room
  add(5, 0, 300, ~std::uint64_t{0});  // someone writes a lease
  add(0, 0x80, 0, 512u << 20);
  add(6, 0, 0, 100);  // someone cuts the file
  add(0, 0, 0, 512u << 20);
  add(9, 0, 0, 0);  // member 0 leaves and joins again
  in[1] = static_cast<std::uint8_t>(n);
  return in;
}

TEST_F(RegionFuzz, SeedsAreHandled) {
  EXPECT_EQ(check({}), "");
  EXPECT_EQ(check(seed(true)), "");
  EXPECT_EQ(check(seed(false)), "");
  std::vector<std::uint8_t> raw = seed(false);
  raw.resize(raw.size() + sizeof(allocshim::node::Layout),
             0xff);  // a file of the right size, all ones
  EXPECT_EQ(check(raw), "");
}

TEST_F(RegionFuzz, RandomInputsAreHandled) {
  std::mt19937_64 rng(24);
  const std::vector<std::uint8_t> base = seed(true);
  for (int round = 0; round < 1500; ++round) {
    std::vector<std::uint8_t> in = base;
    switch (round % 3) {
      case 0:  // ops and values changed
        for (int k = 0; k < 1 + static_cast<int>(rng() % 8); ++k)
          in[rng() % in.size()] = static_cast<std::uint8_t>(rng());
        break;
      case 1:  // a valid region patched at a random place with random bytes
        in[2] = static_cast<std::uint8_t>(rng());
        in[3] = static_cast<std::uint8_t>(rng() % 18);
        for (int k = 0; k < 64; ++k) in.push_back(static_cast<std::uint8_t>(rng()));
        break;
      case 2:  // raw contents of random size
        in[0] = 0;
        in.resize(in.size() + rng() % 512);
        for (std::size_t k = base.size(); k < in.size(); ++k)
          in[k] = static_cast<std::uint8_t>(rng());
        break;
    }
    ASSERT_EQ(check(in), "") << "round " << round;
  }
}

}  // namespace
