// The conformance suite on the fake driver: runs everywhere, in CI, with and without sanitizers.
#include "conformance.h"
#include "fake_driver.h"

namespace allocshim::conformance {
namespace {

class FakeDevice final : public TestDevice {
 public:
  FakeDevice() : fake_(config()) {}
  const Driver& driver() const override { return fake_.driver(); }
  fake::FakeDriver* fake() override { return &fake_; }
  std::size_t capacity() const override { return fake_.capacity(0); }

 private:
  static fake::FakeConfig config() {
    fake::FakeConfig c;
    c.capacity = 8 * fake::kGiB;  // memfd-backed: only the bytes tests touch cost host memory
    // Mappings are unusable until cuMemSetAccess, as on a GPU: a backend that forgets it faults.
    c.strict_access = true;
    return c;
  }
  fake::FakeDriver fake_;
};

}  // namespace

std::unique_ptr<TestDevice> make_test_device(std::string&) {
  return std::make_unique<FakeDevice>();
}

}  // namespace allocshim::conformance
