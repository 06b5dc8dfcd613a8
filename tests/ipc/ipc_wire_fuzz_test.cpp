// The wire fuzz property (fuzz_wire.h) over handles the shim issues and messages of every type, and
// deterministic mutations of them: flipped bits, wrong lengths, descriptors attached or missing.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

#include "fuzz_wire.h"
#include "ipc/handle.h"
#include "ipc/wire.h"

namespace allocshim::ipc {
namespace {

TEST(IpcWireFuzz, SeedsAndMutationsAreHandled) {
  std::vector<std::vector<std::uint8_t>> seeds;
  HandleFields f;
  f.pid = 1234;
  f.nonce = 0x1122334455667788ull;
  f.export_id = 7;
  f.offset = 4096;
  f.size = 1 << 20;
  IpcHandle h;
  encode(f, &h);
  seeds.emplace_back(h.bytes, h.bytes + kIpcHandleBytes);
  wire::Request req;
  wire::Reply rep;
  wire::Pieces pieces;
  pieces.count = 2;
  wire::PoolData pool;
  // Control bytes: the type to expect and the descriptors to attach (low 2 bits, then the rest),
  // then whether to pad to that size and how many descriptors to want.
  const std::pair<const void*, std::size_t> messages[] = {
      {&req, sizeof req}, {&rep, sizeof rep}, {&pieces, sizeof pieces}, {&pool, sizeof pool}};
  for (std::uint8_t type = 0; type < 4; ++type)
    for (std::uint8_t fds : {0, 1, 2, 64, 65}) {
      std::vector<std::uint8_t> s{static_cast<std::uint8_t>(type | fds << 2),
                                  static_cast<std::uint8_t>(1)};
      const auto* m = static_cast<const std::uint8_t*>(messages[type].first);
      s.insert(s.end(), m, m + messages[type].second);
      seeds.push_back(s);
    }
  seeds.push_back({});
  seeds.push_back({0x05, 0x01});  // an empty message with one descriptor attached
  std::mt19937_64 rng(777);
  for (const auto& seed : seeds) {
    ASSERT_EQ(fuzz::check_input(seed.data(), seed.size()), "")
        << "seed of " << seed.size() << " bytes";
    for (int round = 0; round < 300; ++round) {
      std::vector<std::uint8_t> b = seed;
      if (b.empty()) b.push_back(0);
      switch (round % 3) {
        case 0: b.resize(rng() % (b.size() + 8)); break;
        case 1:
          for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k)
            b[rng() % b.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
          break;
        case 2: b[rng() % b.size()] = static_cast<std::uint8_t>(rng()); break;
      }
      std::string hex;
      for (std::uint8_t x : b) hex += "0123456789abcdef"[x >> 4], hex += "0123456789abcdef"[x & 15];
      ASSERT_EQ(fuzz::check_input(b.data(), b.size()), "") << "round " << round << ": " << hex;
    }
  }
}

// Inputs that once broke the property (tests/ipc/fuzz_regressions/), e.g. an empty message carrying
// descriptors, whose descriptors recv_message used to leave open.
TEST(IpcWireFuzz, Regressions) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(IPC_FUZZ_REGRESSIONS)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::vector<std::uint8_t> b{std::istreambuf_iterator<char>(in),
                                      std::istreambuf_iterator<char>()};
    EXPECT_EQ(fuzz::check_input(b.data(), b.size()), "") << entry.path();
    ++files;
  }
  EXPECT_GT(files, 0);
}

}  // namespace
}  // namespace allocshim::ipc
