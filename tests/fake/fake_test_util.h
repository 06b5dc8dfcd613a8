// Shared by the fake driver's tests: a two-device fixture, a byte-usability check, and a pattern
// written and read back through the driver table (what moves with migrated memory).
#pragma once

#include <gtest/gtest.h>

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

// Writes a pattern derived from `seed` over [p, p + n) with memcpy_htod.
inline void fill(const Driver& d, DevPtr p, std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i * 131 + seed);
  ASSERT_EQ(d.memcpy_htod(p, v.data(), n), res::ok);
}

// Whether [p, p + n) still holds fill's pattern (read with memcpy_dtoh).
inline bool verify(const Driver& d, DevPtr p, std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  if (d.memcpy_dtoh(v.data(), p, n) != res::ok) return false;
  for (std::size_t i = 0; i < n; ++i)
    if (v[i] != static_cast<unsigned char>(i * 131 + seed)) return false;
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
