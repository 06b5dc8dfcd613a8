// The simulated device replay runs on: the fake driver of the tests (tests/fake), when the build
// has it (it is built with the tests).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/driver.h"

namespace allocshim::analysis {

class SimulatedDevice {
 public:
  virtual ~SimulatedDevice() = default;
  virtual const Driver& driver() const = 0;
};

// Null with `error` set when this build has no simulator.
std::unique_ptr<SimulatedDevice> make_simulated_device(std::uint64_t capacity, int devices, std::string& error);

}  // namespace allocshim::analysis
