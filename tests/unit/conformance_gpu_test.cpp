// The conformance suite on a real GPU, through the real driver table (libcuda loaded with dlopen,
// never linked). Without a GPU or a driver every test skips with the reason. Labelled `gpu` in CTest.
#include <dlfcn.h>

#include <mutex>

#include "conformance.h"
#include "driver/real_driver.h"

namespace allocshim::conformance {
namespace {

void* lookup(void* handle, const char* name) { return ::dlsym(handle, name); }

// The driver is loaded and device 0's primary context retained once per process: tests then make
// it current on whatever thread they run.
struct Gpu {
  const Driver* driver = nullptr;
  Context ctx = nullptr;
  std::size_t total = 0;
  std::string error;
};

const Gpu& gpu() {
  static const Gpu g = [] {
    Gpu out;
    const Driver* d = load_real_driver(lookup, true, out.error);
    if (d == nullptr) return out;
    int count = 0;
    Result r = d->init(0);
    if (r == res::ok) r = d->device_get_count(&count);
    if (r == res::ok && count == 0) r = res::no_device;
    if (r == res::ok) r = d->primary_ctx_retain(&out.ctx, 0);
    if (r == res::ok) r = d->device_total_mem(&out.total, 0);
    if (r != res::ok) {
      out.error = "driver present, but no usable device (CUresult " + std::to_string(r) + ")";
      return out;
    }
    out.driver = d;
    return out;
  }();
  return g;
}

class GpuDevice final : public TestDevice {
 public:
  explicit GpuDevice(const Gpu& g) : g_(g) { bind_thread(); }
  ~GpuDevice() override {
    // Leave no work behind for the next test's counts.
    g_.driver->ctx_synchronize();
  }
  const Driver& driver() const override { return *g_.driver; }
  std::size_t capacity() const override { return g_.total; }
  void bind_thread() override { g_.driver->ctx_set_current(g_.ctx); }

 private:
  const Gpu& g_;
};

}  // namespace

std::unique_ptr<TestDevice> make_test_device(std::string& why) {
  const Gpu& g = gpu();
  if (g.driver == nullptr) {
    why = g.error;
    return nullptr;
  }
  return std::make_unique<GpuDevice>(g);
}

}  // namespace allocshim::conformance
