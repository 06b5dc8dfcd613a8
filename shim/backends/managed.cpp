#include "backends/managed.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>

#include "backends/managed_held.h"
#include "backends/request.h"
#include "core/budget.h"

namespace allocshim {

std::array<std::atomic<std::size_t>, kMaxDevices> managed_detail::g_held{};

namespace {

using managed_detail::held;

constexpr unsigned kAttachGlobal = 0x1;  // CU_MEM_ATTACH_GLOBAL
constexpr std::size_t kStripePage = std::size_t{2} << 20;
// Fractions are compared in millionths, so page placement is exact integer arithmetic.
constexpr std::uint64_t kStripeScale = 1'000'000;

class ManagedBackend final : public Backend {
 public:
  ManagedBackend(const policy::BackendSpec& spec, const Driver& driver, Budget* budget, bool spill)
      : Backend(spec.name, BackendKind::managed, driver),
        spec_(spec),
        budget_(budget),
        spill_(spill) {}

  void set_budget(Budget* b) { budget_.store(b, std::memory_order_release); }
  double stripe_fraction(int device, std::size_t bytes) const;

 private:
  Result do_allocate(const AllocRequest& req, FreeSync sync, DevPtr* out,
                     std::uint64_t* cookie) override;
  Result do_deallocate(DevPtr ptr, const Block& block, const FreeRequest& req) override;
  void on_forget(const Block& block) override {
    held(block.device).fetch_sub(static_cast<std::size_t>(block.cookie), std::memory_order_relaxed);
  }
  // Advice and prefetch for a fresh allocation; failures are ignored (hints).
  void advise(DevPtr ptr, std::size_t bytes, int device, Stream stream) const;
  void stripe(DevPtr ptr, std::size_t bytes, int device, Stream stream, double fraction) const;

  policy::BackendSpec spec_;
  std::atomic<Budget*> budget_;
  bool spill_;
};

double ManagedBackend::stripe_fraction(int device, std::size_t bytes) const {
  if (spec_.stripe != policy::kStripeAuto) return std::clamp(spec_.stripe, 0.0, 1.0);
  Budget* b = budget_.load(std::memory_order_acquire);
  if (b == nullptr || bytes == 0) return 0.0;
  const std::uint64_t room = b->headroom(device);
  if (room >= bytes) return 0.0;
  return 1.0 - static_cast<double>(room) / static_cast<double>(bytes);
}

void ManagedBackend::stripe(DevPtr ptr, std::size_t bytes, int device, Stream stream,
                            double fraction) const {
  const Driver& d = driver();
  const Location dev{Location::Type::device, device}, host{Location::Type::host, 0};
  const auto q = static_cast<std::uint64_t>(std::llround(fraction * kStripeScale));
  const std::size_t pages = (bytes + kStripePage - 1) / kStripePage;
  auto on_host = [&](std::size_t i) { return (i + 1) * q / kStripeScale > i * q / kStripeScale; };
  // Runs of pages with the same placement get one advice (and one prefetch) each.
  for (std::size_t i = 0; i < pages;) {
    const bool h = on_host(i);
    std::size_t j = i + 1;
    while (j < pages && on_host(j) == h) ++j;
    const DevPtr at = ptr + i * kStripePage;
    const std::size_t len = std::min(j * kStripePage, bytes) - i * kStripePage;
    d.mem_advise(at, len, Advice::set_preferred_location, h ? host : dev);
    if (spec_.prefetch) d.mem_prefetch_async(at, len, h ? host : dev, stream);
    i = j;
  }
  // Host pages are read in place over the link, never faulted over to the device.
  d.mem_advise(ptr, bytes, Advice::set_accessed_by, dev);
}

void ManagedBackend::advise(DevPtr ptr, std::size_t bytes, int device, Stream stream) const {
  const Driver& d = driver();
  const Location dev{Location::Type::device, device}, host{Location::Type::host, 0};
  if (spec_.read_mostly) d.mem_advise(ptr, bytes, Advice::set_read_mostly, dev);
  if (const double f = stripe_fraction(device, bytes); f > 0.0) {
    stripe(ptr, bytes, device, stream, f);
    return;
  }
  using P = policy::BackendSpec::Preferred;
  if (spec_.preferred_location != P::none)
    d.mem_advise(ptr, bytes, Advice::set_preferred_location,
                 spec_.preferred_location == P::host ? host : dev);
  if (spec_.accessed_by) d.mem_advise(ptr, bytes, Advice::set_accessed_by, dev);
  if (spec_.prefetch)
    d.mem_prefetch_async(ptr, bytes, spec_.preferred_location == P::host ? host : dev, stream);
}

Result ManagedBackend::do_allocate(const AllocRequest& req, FreeSync, DevPtr* out,
                                   std::uint64_t* cookie) {
  std::size_t size = 0;
  if (const Result r = request_bytes(req, &size); r != res::ok) return r;
  // Never more managed memory than the device has free (UVM eviction can hang a shared GPU;
  // docs/design/oversubscription.md). Held bytes are reserved before the driver is asked, so two
  // threads cannot both take the last of it.
  std::size_t free = 0, total = 0;
  if (const Result r = driver().mem_get_info(&free, &total); r != res::ok) return r;
  std::atomic<std::size_t>& h = held(req.device);
  const std::size_t before = h.fetch_add(size, std::memory_order_relaxed);
  if (size > free || before > free - size) {
    h.fetch_sub(size, std::memory_order_relaxed);
    return res::out_of_memory;
  }
  const unsigned flags = req.api == Api::managed ? req.flags : kAttachGlobal;
  if (const Result r = driver().mem_alloc_managed(out, size, flags); r != res::ok) {
    h.fetch_sub(size, std::memory_order_relaxed);
    return r;
  }
  advise(*out, size, req.device, req.stream);
  *cookie = size;
  if (spill_)
    if (Budget* b = budget_.load(std::memory_order_acquire)) b->on_spilled(req.device, size);
  return res::ok;
}

Result ManagedBackend::do_deallocate(DevPtr ptr, const Block& block, const FreeRequest& req) {
  if (req.async) driver().stream_synchronize(req.stream);
  const Result r = driver().mem_free(ptr);
  held(block.device).fetch_sub(static_cast<std::size_t>(block.cookie), std::memory_order_relaxed);
  return r;
}

}  // namespace

std::unique_ptr<Backend> make_managed_backend(const policy::BackendSpec& spec, const Driver& driver,
                                              std::string& error) {
  if (driver.mem_alloc_managed == nullptr) {
    error = "the driver has no managed memory";
    return nullptr;
  }
  return std::make_unique<ManagedBackend>(spec, driver, nullptr, false);
}

std::unique_ptr<Backend> make_spill_managed_backend(const Driver& driver, Budget& budget,
                                                    std::string& error) {
  policy::BackendSpec spec;
  spec.name = "spill (managed)";
  spec.kind = BackendKind::managed;
  spec.preferred_location = policy::BackendSpec::Preferred::host;
  spec.accessed_by = true;
  if (driver.mem_alloc_managed == nullptr) {
    error = "the driver has no managed memory";
    return nullptr;
  }
  return std::make_unique<ManagedBackend>(spec, driver, &budget, true);
}

void set_managed_budget(Backend& backend, Budget* budget) {
  if (backend.kind() == BackendKind::managed)
    static_cast<ManagedBackend&>(backend).set_budget(budget);
}

}  // namespace allocshim
