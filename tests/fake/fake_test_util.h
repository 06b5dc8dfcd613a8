// Shared by the fake driver's tests: a two-device fixture, a byte-usability check, and a pattern
// written and read back through the driver table (what moves with migrated memory).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "fake_driver.h"

namespace allocshim::fake::testing {

constexpr std::size_t kGran = 2 * kMiB;

// Fills [p, p + n) with a pattern derived from `seed` and checks it reads back: every byte usable.
inline void fill_and_check(DevPtr p, std::size_t n, unsigned seed) {
  auto* b = reinterpret_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(i * 31 + seed);
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_EQ(b[i], static_cast<unsigned char>(i * 31 + seed)) << "byte " << i;
}

// fill's pattern: byte i is i * 131 + seed, which repeats every 256 bytes, so a chunk of a
// multiple of 256 bytes stands for any aligned stretch of it. The chunks go through memcpy and
// memcmp, whose sanitizer interceptors check a whole range at once: a byte loop over hundreds of
// MiB is what made tests on the fake driver slow under TSan.
inline std::vector<unsigned char> pattern_chunk(unsigned seed) {
  std::vector<unsigned char> v(std::size_t{1} << 20);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<unsigned char>(i * 131 + seed);
  return v;
}

// Writes a pattern derived from `seed` over [p, p + n) with memcpy_htod.
inline void fill(const Driver& d, DevPtr p, std::size_t n, unsigned seed) {
  const std::vector<unsigned char> chunk = pattern_chunk(seed);
  for (std::size_t at = 0; at < n; at += chunk.size()) {
    const std::size_t len = std::min(chunk.size(), n - at);
    ASSERT_EQ(d.memcpy_htod(p + at, chunk.data(), len), res::ok);
  }
}

// Whether [p, p + n) still holds fill's pattern (read with memcpy_dtoh).
inline bool verify(const Driver& d, DevPtr p, std::size_t n, unsigned seed) {
  const std::vector<unsigned char> chunk = pattern_chunk(seed);
  std::vector<unsigned char> v(chunk.size());
  for (std::size_t at = 0; at < n; at += chunk.size()) {
    const std::size_t len = std::min(chunk.size(), n - at);
    if (d.memcpy_dtoh(v.data(), p + at, len) != res::ok) return false;
    if (std::memcmp(v.data(), chunk.data(), len) != 0) return false;
  }
  return true;
}

class FakeDriverTest : public ::testing::Test {
 protected:
  static FakeConfig config() {
    FakeConfig c;
    c.devices = 2;
    c.capacity = 64 * kMiB;
    return c;
  }
  FakeDriver fake{config()};
  const Driver& d = fake.driver();
};

}  // namespace allocshim::fake::testing
