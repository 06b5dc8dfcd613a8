#include "core/backend.h"

#include "core/clock.h"

namespace allocshim {

Result Backend::allocate(const AllocRequest& req, FreeSync sync, DevPtr* out, std::uint64_t* cookie) {
  const std::uint64_t t0 = clock::ticks();
  const Result r = do_allocate(req, sync, out, cookie);
  DeviceStats& d = stats_.device(req.device);
  if (__builtin_expect(r == res::ok, 1)) {
    d.on_alloc(req.size, clock::to_ns(clock::ticks() - t0));
    stats_.on_api(req.api);
  } else {
    d.on_failure();
  }
  return r;
}

Result Backend::deallocate(DevPtr ptr, const Block& block, const FreeRequest& req) {
  const std::uint64_t t0 = clock::ticks();
  const Result r = do_deallocate(ptr, block, req);
  // The block is gone from the program's point of view whatever the driver said: a free that
  // fails (e.g. during driver teardown at exit) must not leave it counted as live.
  stats_.device(block.device).on_free(block.size, clock::to_ns(clock::ticks() - t0));
  return r;
}

}  // namespace allocshim
