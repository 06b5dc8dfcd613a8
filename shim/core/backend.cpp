#include "core/backend.h"

#include "base/clock.h"

namespace allocshim {

Result Backend::allocate(const AllocRequest& req, FreeSync sync, DevPtr* out,
                         std::uint64_t* cookie) {
  DeviceStats& d = stats_.device(req.device);
  const DeviceStats::Call call = d.begin(sampled_);
  const Result r = do_allocate(req, sync, out, cookie);
  if (__builtin_expect(r == res::ok, 1))
    d.end_alloc(call, req.size, req.api);
  else
    d.end_failure(call);
  return r;
}

Result Backend::deallocate(DevPtr ptr, const Block& block, const FreeRequest& req) {
  DeviceStats& d = stats_.device(block.device);
  const DeviceStats::Call call = d.begin(sampled_);
  const Result r = do_deallocate(ptr, block, req);
  // The block is gone from the program's point of view whatever the driver said: a free that
  // fails (e.g. during driver teardown at exit) must not leave it counted as live.
  d.end_free(call, block.size);
  return r;
}

void Backend::forget(const Block& block) {
  on_forget(block);
  stats_.device(block.device).on_dropped(block.size);
}

}  // namespace allocshim
