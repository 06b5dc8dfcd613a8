// The `vmm` backend's class, shared by its allocation path (vmm.cpp) and the rest of its
// interface (vmm_device.cpp: teardown, trim, lookups, peers, contexts). Internal to
// shim/backends: everything else uses backends/vmm.h.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/free_sync.h"
#include "backends/vmm.h"
#include "backends/vmm_cache.h"
#include "backends/vmm_heap.h"
#include "backends/vmm_region.h"
#include "backends/vmm_small.h"
#include "base/threads.h"

namespace allocshim {
namespace vmm_detail {

using vmm::CacheClasses;
using vmm::Heap;
using vmm::SmallClasses;
using vmm::ThreadCache;

constexpr std::size_t kMinReserve = std::size_t{1} << 30;
constexpr std::size_t kMaxRequest = std::size_t{1} << 48;

class VmmBackend final : public Backend {
 public:
  VmmBackend(const policy::BackendSpec& spec, const Driver& driver, StreamTracker& streams)
      : Backend(spec.name, BackendKind::vmm, driver, Timing::sampled),
        spec_(spec),
        streams_(streams) {
    threads::add_exit_hook(&VmmBackend::on_thread_exit, this);
  }
  ~VmmBackend() override;

  Result trim(int device) override;
  bool find(DevPtr ptr, DevPtr* base, std::size_t* size) const override;
  std::size_t reserved(int device) const override;
  Result enable_peer_access(int accessing_device, int peer_device) override;
  bool drop_context(int device, Context ctx, bool alive) override;
  void context_synchronized(int device, std::uint64_t sync) override;
  void close_epochs(int device, Stream dying) override;
  VmmInfo info(int device) const;

 private:
  // Everything of one device, created at its first allocation.
  struct Device {
    Device(const Driver& driver, const vmm::RegionConfig& config, const StreamTracker* streams,
           Context ctx, SyncCounters* counters, std::size_t thread_cache)
        : region(driver, config),
          deferred(driver, streams, config.device, ctx, counters),
          cache(thread_cache) {}
    vmm::Region region;
    // Blocks below a quarter chunk (slabs included) and larger ones live in separate address
    // ranges: small blocks scattered among large ones would each pin a chunk that is otherwise
    // free, and the gaps large blocks leave would fill with small ones. Blocks of a quarter chunk
    // up to a chunk go with the large ones, where they fill the partly used chunks between large
    // blocks. The quarter was chosen by alloc_latency's mixed workload replayed on the fake
    // (FragmentationOfTheMixedBenchmarkWorkload in tests/unit/vmm_test.cpp).
    Heap small_heap;
    Heap large_heap;
    Heap& heap_for(std::size_t bytes) {
      return bytes >= region.chunk() / 4 ? large_heap : small_heap;
    }
    SmallClasses small;
    DeferredFrees deferred;
    std::vector<Heap::Node*> scratch;
    ThreadCache cache;  // blocks freed with nothing to wait for, per thread (vmm_cache.h)
    std::uint64_t locked_calls = 0;  // allocations and frees that took the device lock
    int last_thread = -1;            // the thread that last allocated under the lock
    // Set once a second thread allocates under the lock: the caches use size classes from then on
    // (vmm_cache.h). Read without the lock; written once.
    std::atomic<bool> classed{false};
  };
  struct DeviceState {
    mutable std::mutex mutex;
    std::unique_ptr<Device> dev;
    std::atomic<Device*> ready{
        nullptr};                       // `dev` once made: the thread caches, read without the lock
    std::atomic<Context> ctx{nullptr};  // set once, read without the lock by frees
    std::uint64_t peers = 0;            // devices granted access, also before `dev` exists
  };

  Result do_allocate(const AllocRequest& req, FreeSync sync, DevPtr* out,
                     std::uint64_t* cookie) override;
  Result do_deallocate(DevPtr ptr, const Block& block, const FreeRequest& req) override;

  Result init(DeviceState& s, int device);
  // A heap block of `bytes` with its memory mapped; *mapped is what had to be mapped for it.
  Result obtain(Device& d, int device, std::size_t bytes, Heap::Node** out, std::size_t* mapped);
  // Returns a freed block (small or large) to the allocators; its wait, if any, is over.
  void release_block(Device& d, DevPtr ptr, std::uint64_t cookie);
  void release_parked(Device& d, const ThreadCache::Parked& p) {
    release_block(d, p.ptr, p.cookie);
  }
  // A block of `bytes` for a request, from the slabs or the heap, mapped; *mapped: what was mapped.
  Result carve(Device& d, int device, std::size_t bytes, DevPtr* out, std::uint64_t* cookie,
               std::size_t* mapped);
  // After a miss of class size `bytes`: a few more blocks of it parked in thread `t`'s cache, from
  // memory already mapped, so that the next misses of the class do not take the lock.
  void refill(Device& d, int t, std::size_t bytes);
  void release_node(Device& d, Heap::Node* node);
  // Memory is short: wait for pending frees, return empty slabs and every free chunk.
  void reclaim(Device& d);
  // A thread exits: the blocks it parked go back to the heaps now, not at the next flush.
  static void on_thread_exit(void* self, int id);
  // Takes back blocks parked in the thread caches (under the device lock): every one, or (not
  // `classed`) those without a bound of bytes.
  void flush_cache(Device& d, bool classed = true) {
    d.cache.flush(classed, [this, &d](const ThreadCache::Parked& b) { release_parked(d, b); });
  }
  // Whether blocks of this allocation may pass through the thread caches: frees that wait for
  // events release to the heap, and so does everything under a release threshold (freed memory
  // must reach the region to be given back).
  bool cached(FreeSync sync) const {
    return sync != FreeSync::barrier && spec_.vmm_release_threshold == policy::kUnlimited;
  }
  // Bytes a live block really holds, from its cookie (no lock: its slab or node does not change).
  static std::size_t cookie_key(std::uint64_t cookie) {
    return vmm::is_small_cookie(cookie) ? vmm::slab_of(cookie)->slot_bytes
                                        : vmm::node_of(cookie)->size;
  }
  void apply_threshold(Device& d, int device);
  void note_reserved(Device& d, int device) {
    mutable_stats().device(device).set_reserved(d.region.reserved_bytes());
  }
  auto releaser(Device& d) {
    return [this, &d](const PendingFree& f) { release_block(d, f.ptr, f.cookie); };
  }

  policy::BackendSpec spec_;
  StreamTracker& streams_;
  PerDevice<DeviceState> devices_;
};

}  // namespace vmm_detail
}  // namespace allocshim
