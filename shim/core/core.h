// The allocation core: dispatch (policy -> backend), the registry of live allocations, stream
// tracking for free safety, device accounting, and the exit summary.
//
// The core never sees cuda.h. The hook layer (shim/abi) converts driver arguments into the calls
// below; unit tests build a Core directly on the fake driver.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/backend.h"
#include "core/budget.h"
#include "base/callsite.h"
#include "node/compute_share.h"
#include "core/control.h"
#include "base/driver.h"
#include "core/registry.h"
#include "core/sleep.h"
#include "base/streams.h"
#include "base/types.h"
#include "policy/policy.h"
#include "policy/watch.h"

namespace allocshim {

// The IPC exporter (shim/ipc) sees every free of the core once something was exported: a block that
// another process still has open is not handed back to its backend until the last import closes.
class IpcHooks {
 public:
  // `block` was just erased from the registry. True: the exporter keeps it (and gives it back
  // through Core::release_deferred later); false: the free goes on as usual.
  virtual bool on_free(DevPtr ptr, const Block& block, const FreeRequest& req) = 0;
  // The context of `device` is being destroyed (core/reset.cpp): its exports, kept blocks
  // included, are gone with it and must never reach a backend again.
  virtual void on_context_dropped(int device) = 0;

 protected:
  ~IpcHooks() = default;
};

// Builds the backend instance a policy's BackendSpec describes; nullptr with `error` set when the
// kind is not available (not implemented yet, or not supported by the device).
using BackendFactory = std::unique_ptr<Backend> (*)(const policy::BackendSpec& spec,
                                                    const Driver& driver, StreamTracker& streams,
                                                    std::string& error);
std::unique_ptr<Backend> make_backend(const policy::BackendSpec& spec, const Driver& driver,
                                      StreamTracker& streams, std::string& error);

// The native passthrough every core has (the fallback of every request), defined with the backends.
std::unique_ptr<Backend> make_native_passthrough(const Driver& driver);

// A policy that serves everything natively: the fallback whenever the configured one cannot be used.
policy::Policy native_policy(std::string source);

class Core {
 public:
  // Builds a core over `driver` serving `policy`. If some backend of the policy cannot be built the
  // core serves everything natively and `error()` says why (the program must keep running).
  Core(const Driver& driver, policy::Policy policy);
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // Allocation and free, for every API. Frees of pointers the core does not own are forwarded to
  // the driver unchanged.
  Result alloc(AllocRequest& req, DevPtr* out);
  Result free(DevPtr ptr, const FreeRequest& req);
  Result host_alloc(void** ptr, std::size_t bytes, unsigned flags, bool portable_api);
  Result host_free(void* ptr);

  // The program's own VMM allocations (cuMemCreate/cuMemRelease), accounted per device. The core
  // cannot build a CUmemAllocationProp, so the hook passes `make`: make(ctx, nullptr, false) makes
  // the program's request as it is, make(ctx, &at, plain) the same request at `at`, without the
  // allocation flags only device memory may have when `plain`. `device_flags`: it has such flags.
  // create() decides where it goes (the budget, its spill target) and which attempts follow.
  using MakeCreate = Result (*)(void* ctx, const Location* at, bool plain);
  Result create(const MemHandle* handle, std::size_t bytes, const Location& location,
                bool device_flags, MakeCreate make, void* ctx);
  Result admit_create(std::size_t bytes, const Location& location);
  // Whether a create of `bytes` at `location` should be made on the host instead: a device
  // location past its budget with spill = "host". `host` gets the spill target's location
  // (HOST_NUMA with the device's NUMA id, else HOST). on_create_spilled counts one that was.
  bool create_on_host(std::size_t bytes, const Location& location, Location* host);
  void on_create_spilled(int device, std::size_t bytes) { budget_.on_spilled(device, bytes); }
  // The driver refused the host request (`error`): the program's own goes on the device, past the
  // budget. Said once.
  void on_create_not_spilled(int device, int error);
  void on_created(MemHandle handle, std::size_t bytes, const Location& location);
  void on_released(MemHandle handle);

  // Queries.
  Result mem_get_info(std::size_t* free, std::size_t* total);
  // The same view of the GPU with UUID `uuid` for another API's query (NVML's), given what that API
  // said: free and total under the budget as mem_get_info reports them. False when no device has
  // that UUID or it has no budget (the caller's numbers stand).
  bool budget_view(const unsigned char uuid[16], std::uint64_t* free, std::uint64_t* total);
  // If `ptr` lies in a block a sub-allocating backend served, its base and size; false otherwise.
  bool find_block(DevPtr ptr, DevPtr* base, std::size_t* size) const;

  // IPC: the live block containing `ptr` (its registry base and entry); false if none is known.
  bool lookup(DevPtr ptr, DevPtr* base, Block* block) const;
  // Installs the exporter's free hook (null: none). Until then a free costs one untaken branch.
  void set_ipc(IpcHooks* hooks) { ipc_.store(hooks, std::memory_order_release); }
  bool physical(const Block& block, DevPtr ptr, DevPtr* base, std::size_t* size) const {
    return block.backend < backend_count() && backends_[block.backend]->physical(ptr, base, size);
  }
  // Tells the backend that served `block` (at `base`) that it was exported (Backend::on_exported).
  void on_exported(DevPtr base, const Block& block) {
    if (block.backend < backend_count()) backends_[block.backend]->on_exported(base);
  }
  // Hands a block the exporter kept back to the backend that served it.
  Result release_deferred(DevPtr ptr, const Block& block);

  // The program's synchronizations. A context synchronization is numbered before the real call
  // (before_context_sync) and reported after it succeeded (after_context_sync): `barrier` frees
  // made before it began are complete (backends/free_sync.h), and it is a safe point for migration
  // (docs/oversubscription.md, "Migration"). at_safe_point: the program synchronized the context
  // of `device` (-1: every device), so nothing issued before is running; answers other processes'
  // requests for room and runs bounded promotion there. after_partial_sync: the program
  // synchronized one stream or event, which leaves other streams running: if there is something
  // to move and no stream the shim knows has work, the shim synchronizes the context itself
  // (counted) and runs the safe point; otherwise it skips it (counted). `waited_ns`: how long the
  // program's own call waited (Budget::at_safe_point says what it changes). Without a budget each
  // is one predicted branch.
  std::uint64_t before_context_sync() { return streams_.begin_context_sync(); }
  void after_context_sync(std::uint64_t sync, std::uint64_t waited_ns = 0);
  void at_safe_point(int device, std::uint64_t waited_ns = 0);
  void after_partial_sync(std::uint64_t waited_ns = 0);

  // Work submissions (kernel launches, copies, memsets, graphs; abi/hooks.def), while some core may
  // move memory (submissions_watched): each passes the launch gate from before its driver call
  // until after it, and names what it uses (placement/migration.h).
  void submit_enter() { budget_.migration().gate().enter(); }
  void submit_leave() { budget_.migration().gate().leave(); }
  void submit_uses(DevPtr ptr) { budget_.migration().uses().mark(ptr); }
  // A launch to `stream`, before its driver call; when it names host-resident memory the policy may
  // want back first, or the launch is to be timed (placement/host_cost.h), before_launch does so (out
  // of line, rare: once per allocation, or function and thread, and epoch). Returns a timing
  // token for launch_done, 0 almost always.
  std::uint32_t launch_uses(void* function, void** params, void** extra,
                            Stream stream = kStreamLegacy) {
    const unsigned ask = budget_.migration().uses().mark_launch(function, params, extra);
    return __builtin_expect(ask == 0, 1) ? 0 : before_launch(ask, stream);
  }
  std::uint32_t before_launch(unsigned ask, Stream stream);
  // After the driver call of a launch launch_uses gave `timing` for (`launched`: it succeeded).
  void launch_done(std::uint32_t timing, Stream stream, bool launched) {
    budget_.migration().host_cost().end(timing, stream, launched);
  }
  // A module or library was unloaded: its function handles may be reused.
  void on_module_unloaded() { budget_.migration().uses().forget_functions(); }

  // Streams (for `barrier` frees) and peer access (extended to the shim's own memory).
  void on_stream_created(Stream stream, unsigned flags);
  void on_stream_destroyed(Stream stream);
  Result enable_peer_access(Context peer, unsigned flags);

  // The program is about to destroy a context (core/reset.cpp): cuDevicePrimaryCtxReset on
  // `device`, cuCtxDestroy of `ctx`. Every block, stream, event and pool the
  // shim has in that context is given back while the handles are valid and forgotten; backends
  // rebuild at the device's next request. Frees of pointers from before then are forwarded to
  // the driver, which answers as it does natively for freed memory.
  void on_primary_reset(int device);
  void on_context_destroy(Context ctx);
  // cuDevicePrimaryCtxRelease, which destroys the context when it drops the last reference: its
  // handle before the real call, then whether it is gone after.
  Context primary_context(int device);
  void after_primary_release(int device, Context ctx);
  // cuDevicePrimaryCtxRetain returned `ctx`: if the primary context was destroyed and made again
  // since the last retain the shim saw, by a route it does not hook, what the shim held in the
  // old one is forgotten (its handles dangle) before anything uses it.
  void after_primary_retain(int device, Context ctx);
  void drop_context(int device, Context ctx, bool alive);
  std::uint64_t contexts_dropped() const {
    return contexts_dropped_.load(std::memory_order_relaxed);
  }

  // The exit summary (printed to stderr at exit unless quiet) and the same numbers as JSON
  // (written to $ALLOCSHIM_STATS at exit; tests and the GPU suite read it).
  std::string summary() const;
  std::string stats_json() const;
  std::uint64_t unknown_frees() const { return unknown_frees_.load(std::memory_order_relaxed); }

  const Driver& driver() const { return driver_; }
  // The policy new allocations follow (replaced by a reload; the old one stays valid).
  const policy::Policy& policy() const { return route()->policy; }

  // Policy reload ([reload] watch = true, or ALLOCSHIM_WATCH): the file is polled from the
  // allocation path at the watcher's interval, so reload needs no thread and no signal handler.
  // A valid new policy serves new allocations; blocks already handed out are freed by the backend
  // that made them; an invalid file keeps the current policy and is reported once.
  void enable_reload(std::unique_ptr<policy::PolicyWatcher> watcher);
  std::uint64_t reloads() const { return reloads_.load(std::memory_order_relaxed); }
  const CallsiteCache& callsites() const { return callsites_; }
  // Device budgets and the spill target (docs/oversubscription.md).
  Budget& budget() { return budget_; }
  const Budget& budget() const { return budget_; }
  // Sleep and wake (core/sleep.h) and the control socket that asks for them (core/control.h): the
  // process's core starts it (abi/init.cpp) when its policy can move memory, and stops it at exit.
  Sleeper& sleeper() { return sleeper_; }
  Control& control() { return control_; }
  // GPU time slices between processes ([compute], node/compute_share.h), started with the control
  // thread when the policy has the section.
  ComputeShare& compute() { return compute_; }
  const ComputeShare& compute() const { return compute_; }
  // Starts the shim's threads the policy asks for (control socket, slices); false: none runs.
  bool start_control();
  // Stops them (at exit, before the CUDA runtime tears its contexts down).
  void stop_control();
  // A synchronization of the program (ctx, stream or event) is in progress: while slices are
  // taken, a process waiting for its own work still wants the GPU (ComputeShare::Process::syncing).
  class Syncing {
   public:
    explicit Syncing(Core* core)
        : core_(core && core->slicing_.load(std::memory_order_relaxed) ? core : nullptr) {
      if (core_) core_->syncing_.fetch_add(1, std::memory_order_relaxed);
    }
    ~Syncing() {
      if (core_) core_->syncing_.fetch_sub(1, std::memory_order_relaxed);
    }
    Syncing(const Syncing&) = delete;
    Syncing& operator=(const Syncing&) = delete;

   private:
    Core* core_;
  };
  const std::string& error() const { return error_; }
  const Registry& registry() const { return registry_; }
  // fork support (see abi/init.cpp): no registry lock may be held across fork.
  void registry_lock_all() { registry_.lock_all(); }
  void registry_unlock_all() { registry_.unlock_all(); }
  std::size_t backend_count() const { return backend_count_.load(std::memory_order_acquire); }
  const Backend& backend(std::size_t i) const { return *backends_[i]; }

  // Backends are never destroyed while the core lives (a block keeps the index of its backend),
  // and a reload adds only the ones it does not share with the current policy: a fixed table, so
  // readers never see it move.
  static constexpr std::size_t kMaxBackends = 64;

 private:
  // A policy and where each of its backends sits in the core's table.
  struct Route {
    policy::Policy policy;
    std::vector<std::uint32_t> index;  // policy backend i -> backends_[index[i]]
    bool rules = false;                // some rule exists (else the defaults decide, no scan)
    bool callsite = false;             // some rule matches on the call stack
    bool budget = false;               // some device has a budget: requests are admitted
    std::uint32_t spill = kNoSpill;    // backends_ index of the budget's spill target
  };
  static constexpr std::uint32_t kNoSpill = UINT32_MAX;
  const Route* route() const { return route_.load(std::memory_order_acquire); }
  int current_device() const;
  // Builds (or reuses) the backends `p` names and makes it the active route. False, with `error`
  // set and nothing changed, when one of them cannot be built.
  bool install(policy::Policy p, std::string& error);
  std::uint32_t add_backend(std::unique_ptr<Backend> b);
  // After `refused` ran out of memory on `device`: trims every other backend there; true if that
  // gave memory back to the driver (then one retry is worth it).
  bool trim_others(std::uint32_t refused, int device);
  // The request for the budget's spill target `spill`: `req` with the device part the budget let
  // it have (core/budget.h, claim_new), which the backend's placement writes to `placed`.
  const AllocRequest& claim_spill(Backend& spill, const AllocRequest& req, AllocRequest& claimed,
                                  std::size_t& placed);
  // Says once that the spill target cannot work on this device (served natively instead).
  static void log_spill_unsupported(int device);
  // Says once that a request can never fit its device's budget with nowhere to spill.
  static void log_larger_than_budget(int device, std::size_t bytes);
  void poll_reload();

  const Driver& driver_;
  std::string error_;
  std::unique_ptr<Backend> backends_[kMaxBackends];
  std::atomic<std::size_t> backend_count_{0};
  std::uint32_t native_ = 0;  // a native backend always exists: the fallback and the passthrough
  std::atomic<const Route*> route_{nullptr};
  std::vector<std::unique_ptr<Route>> routes_;  // every route ever active (readers may hold any)
  std::mutex install_mutex_;
  CallsiteCache callsites_;
  std::unique_ptr<policy::PolicyWatcher> watcher_;
  std::mutex reload_mutex_;
  std::atomic<std::uint64_t> reloads_{0};
  std::atomic<std::uint64_t> unknown_frees_{0};
  std::atomic<std::uint64_t> contexts_dropped_{0};
  // The primary context of each device as the last retain saw it (cuCtxGetId), or 0 once the shim
  // dropped it: a retain that finds another id found a reset the shim did not see.
  struct PrimarySeen {
    Context ctx = nullptr;
    std::uint64_t id = 0;
  };
  std::mutex primary_mutex_;
  PrimarySeen primary_seen_[kMaxDevices];
  mutable std::atomic<int> device_count_{0};  // 0 until known (see current_device)
  std::atomic<IpcHooks*> ipc_{nullptr};
  Registry registry_;
  StreamTracker streams_;
  BackendStats host_stats_;     // pinned host memory (accounting only)
  BackendStats created_stats_;  // the program's own cuMemCreate, by location device

  mutable std::mutex created_mutex_;
  struct Created {
    std::size_t bytes;
    int device;  // -1: host memory
  };
  std::unordered_map<MemHandle, Created> created_;

  // Last, so that it is destroyed first: backends never call it from their destructors.
  Budget budget_{driver_, BudgetSources{backends_, &backend_count_, &created_stats_}};
  std::uint32_t spill_index_[3] = {kNoSpill, kNoSpill,
                                   kNoSpill};  // by Budget::Spill, kept across reloads
  // After the budget they use, so that they go first: the control thread ends before either.
  Sleeper sleeper_{budget_};
  Control control_;
  // Slices (after the budget, whose launch gate they close).
  ComputeShare::Process slice_hooks();
  void drain_work();
  bool slice_device(node::Uuid* uuid);
  std::atomic<bool> slicing_{false};
  std::atomic<int> syncing_{0};
  ComputeShare compute_{slice_hooks()};
};

// The process-wide core of the preloaded library, created on first use. Null when the driver could
// not be loaded (then every hook forwards to the driver untouched).
Core* process_core();

}  // namespace allocshim
