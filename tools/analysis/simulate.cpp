// The simulated device (see simulate.h).
#include "analysis/simulate.h"

#if ALLOCSHIM_HAVE_FAKE_DRIVER
#include "fake_driver.h"
#endif

namespace allocshim::analysis {

#if ALLOCSHIM_HAVE_FAKE_DRIVER
namespace {
class FakeDevice final : public SimulatedDevice {
 public:
  explicit FakeDevice(fake::FakeConfig c) : fake_(c) {}
  const Driver& driver() const override { return fake_.driver(); }

 private:
  fake::FakeDriver fake_;
};
}  // namespace

std::unique_ptr<SimulatedDevice> make_simulated_device(std::uint64_t capacity, int devices, std::string& error) {
  (void)error;
  fake::FakeConfig c;
  c.capacity = capacity;
  c.devices = devices < 1 ? 1 : devices;
  return std::make_unique<FakeDevice>(c);
}
#else
std::unique_ptr<SimulatedDevice> make_simulated_device(std::uint64_t, int, std::string& error) {
  error = "this build has no simulated device (configure with the tests: ALLOCSHIM_BUILD_TESTS=ON)";
  return nullptr;
}
#endif

}  // namespace allocshim::analysis
