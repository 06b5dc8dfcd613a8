// Shared by the fake driver's tests: a two-device fixture and a byte-usability check.
#pragma once

#include <gtest/gtest.h>

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
