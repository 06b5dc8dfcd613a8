// The backend conformance suite: one set of tests every backend must pass, run on the fake driver
// in CI (conformance_test) and on a real GPU (conformance_gpu_test). conformance.cpp holds the
// tests; each executable supplies the device they run on through make_test_device().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/driver.h"
#include "base/types.h"

namespace allocshim::fake {
class FakeDriver;
}

namespace allocshim::conformance {

// The device a test runs on. Data goes through the driver's synchronous copies, so the same checks
// hold on the fake (which also verifies the range lies in memory it handed out) and on a GPU.
class TestDevice {
 public:
  virtual ~TestDevice() = default;
  virtual const Driver& driver() const = 0;
  // The fake behind the driver, for checks only a simulation can make (failure injection, held
  // streams, exact capacity); null on a real GPU, where those tests skip.
  virtual fake::FakeDriver* fake() { return nullptr; }
  // Device memory the tests may fill (they stay well below it).
  virtual std::size_t capacity() const = 0;
  // Whether a test thread must make the device's context current before driver calls.
  virtual void bind_thread() {}
};

// Defined by each test executable: the device to run on, or null with `why` set (the test skips
// with "no GPU/driver: <why>"). Called once per test.
std::unique_ptr<TestDevice> make_test_device(std::string& why);

}  // namespace allocshim::conformance
