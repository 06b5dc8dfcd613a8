// Policy BackendSpec -> backend instance. One case per kind; a kind whose backend is not in this
// build yields an error, and the core then serves natively rather than guess.
#include <memory>
#include <string>

#include "backends/async_pool.h"
#include "backends/host.h"
#include "backends/managed.h"
#include "backends/native.h"
#include "backends/vmm.h"
#include "core/core.h"

namespace allocshim {

std::unique_ptr<Backend> make_backend(const policy::BackendSpec& spec, const Driver& driver,
                                      StreamTracker& streams, std::string& error) {
  switch (spec.kind) {
    case BackendKind::native: return make_native_backend(spec.name, driver);
    case BackendKind::async_pool: return make_async_pool_backend(spec, driver, streams, error);
    case BackendKind::vmm: return make_vmm_backend(spec, driver, streams, error);
    case BackendKind::managed: return make_managed_backend(spec, driver, error);
    case BackendKind::host: return make_host_backend(spec, driver, error);
  }
  error = std::string("backend kind \"") + backend_kind_name(spec.kind) +
          "\" is not implemented in this build";
  return nullptr;
}

std::unique_ptr<Backend> make_native_passthrough(const Driver& driver) {
  return make_native_backend("native", driver);
}

std::unique_ptr<Backend> make_spill_backend(Budget::Spill spill, const Driver& driver,
                                            Budget& budget, std::string& error) {
  switch (spill) {
    case Budget::Spill::host: return make_spill_host_backend(driver, budget, error);
    case Budget::Spill::managed: return make_spill_managed_backend(driver, budget, error);
    case Budget::Spill::none: break;
  }
  error = "no spill target";
  return nullptr;
}

void configure_spill(Backend& spill, const policy::BackendSpec& host_side, Budget::Migrate mode) {
  if (spill.kind() == BackendKind::host) set_host_side(spill, host_side, mode);
}

void attach_budget(Backend& backend, Budget& budget) {
  if (backend.kind() == BackendKind::managed) set_managed_budget(backend, &budget);
}

}  // namespace allocshim
