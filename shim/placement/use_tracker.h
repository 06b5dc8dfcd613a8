// What kernels, copies and memsets use (docs/design/oversubscription.md, "What kernels use"): every
// submission that passes the launch gate names the movable allocations it points into, and each
// such allocation keeps the last epoch it was used in, how many epochs it was used in and how many
// submissions named it. The
// migration policy (placement/migration.h) reads them to pick what to demote and what to bring back.
//
// A kernel's parameters are found through the driver's parameter layout (cuFuncGetParamInfo, or
// cuKernelGetParamInfo for a library kernel), asked once per function and cached; every aligned
// 8-byte word of every parameter is checked, so a pointer inside a struct passed by value counts.
// A word is first compared with the span of all movable ranges, then looked up in a sorted
// snapshot of them. Pointers the shim cannot see (arrays of pointers in device memory, a library's
// workspace behind an opaque handle, graph launches) mark nothing: those allocations keep their
// place in the age order.
//
// The hot path touches only this thread's function cache, the snapshot (read-only, published
// whole and freed once the launch gate says no submission can still read it), the records of the
// allocations it names (read, and a use counted in this thread's shard) and, once per epoch, the
// record's epoch.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/driver.h"
#include "placement/host_cost.h"
#include "base/launch_gate.h"
#include "base/threads.h"
#include "placement/step_tape.h"

namespace allocshim {

using Function = void*;  // CUfunction, or a CUkernel passed where a CUfunction is taken

struct UseRecord {
  std::atomic<std::uint64_t> last_epoch{0};  // the latest epoch a submission named it in
  std::atomic<std::uint64_t> epochs{0};      // how many epochs it was named in
  std::uint64_t bytes = 0;                   // the allocation's size
  int device = 0;
  // Its bytes on the host, kept by the mechanism: a launch that names it while some are asks the
  // policy, once per epoch (ahead_epoch), whether to bring it back before the kernel runs, and
  // may be timed (placement/host_cost.h).
  std::atomic<std::uint64_t> host_bytes{0};
  bool on_host() const { return host_bytes.load(std::memory_order_relaxed) != 0; }
  std::atomic<std::uint64_t> ahead_epoch{0};
  // The epoch from which a launch that names it on the host is timed again (placement/host_cost.h):
  // each host-resident allocation is timed once per kRetimeEpochs at most.
  std::atomic<std::uint64_t> time_due{0};
  static constexpr std::uint64_t kRetimeEpochs = 4;
  // What one use of it on the host costs, from timed launches that read it there, in
  // 1/HostCost::kPrior of the time its host bytes take to cross the link once (0: never timed;
  // the policy then assumes kPrior).
  std::atomic<std::uint32_t> cost{0};

  // What one submission that names only this allocation adds to shares(). A kernel whose
  // parameters name k distinct allocations adds kWhole / k to each, once however many of its
  // parameters point into it: a multi-tensor kernel spreads its work over the many buffers it
  // names, while a kernel naming a few (a matrix product) may read each whole, and more than
  // once. Explorations (placement/migration.h, "Trials") make room from the least shared first.
  static constexpr std::uint64_t kWhole = 1024;

  // Marks a use in `epoch` by thread `id` worth `share`: one load when already marked in it, and
  // counts in the thread's shard (loads and stores: counts are statistics, a rare lost one is
  // harmless).
  void touch(std::uint64_t epoch, int id, std::uint64_t share = kWhole) {
    count(id, 1, share);
    std::uint64_t last = last_epoch.load(std::memory_order_relaxed);
    if (__builtin_expect(last == epoch, 1)) return;
    if (last_epoch.compare_exchange_strong(last, epoch, std::memory_order_relaxed))
      epochs.fetch_add(1, std::memory_order_relaxed);
  }
  // Counts `n` submissions by thread `id` that named it, each worth `share`.
  void count(int id, std::uint64_t n, std::uint64_t share) {
    Shard& s = shards[static_cast<unsigned>(id) % kShards];
    s.n.store(s.n.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    s.share.store(s.share.load(std::memory_order_relaxed) + n * share, std::memory_order_relaxed);
  }
  // Submissions that named it so far (a thread's repeats of one launch may still be on their way:
  // UseTracker::settle).
  std::uint64_t uses() const {
    std::uint64_t sum = 0;
    for (const Shard& s : shards) sum += s.n.load(std::memory_order_relaxed);
    return sum;
  }
  // Their shares (kWhole for a submission that named it alone).
  std::uint64_t shares() const {
    std::uint64_t sum = 0;
    for (const Shard& s : shards) sum += s.share.load(std::memory_order_relaxed);
    return sum;
  }

  // The migration policy's own state (placement/migration.h), written at safe points only.
  std::atomic<std::uint64_t> rate{0};            // uses per epoch, a moving average (x16)
  std::atomic<std::uint64_t> counted{0};         // uses() when the rate was last updated
  std::atomic<std::uint64_t> share_rate{0};      // shares per epoch, a moving average
  std::atomic<std::uint64_t> shares_counted{0};  // shares() when share_rate was last updated
  std::atomic<std::uint64_t> demoted_epoch{0};   // a rebalance demoted it then (0: not)
  // A trial's verdict holds it where it is until this epoch: on the host (held_on_host) or on the
  // device, against the swaps the use counts would make and against being demoted to explore.
  std::atomic<std::uint64_t> held_until{0};
  std::atomic<bool> held_on_host{false};
  // Trials that promoted it and were undone, and the epoch before which no trial promotes it.
  std::atomic<std::uint32_t> failed{0};
  std::atomic<std::uint64_t> explore_after{0};

 private:
  static constexpr unsigned kShards = 8;
  // Threads count in shards of their own line, so launches over shared weights bounce nothing.
  struct alignas(64) Shard {
    std::atomic<std::uint64_t> n{0}, share{0};
  };
  Shard shards[kShards];
};

class UseTracker {
 public:
  UseTracker(const Driver& driver, LaunchGate& gate) : driver_(driver), gate_(gate) {}
  ~UseTracker();
  UseTracker(const UseTracker&) = delete;
  UseTracker& operator=(const UseTracker&) = delete;

  // Movable ranges: the migration mechanism registers each allocation it may move. The record
  // stays valid until remove() returns; a new one counts as used in the current epoch (a program
  // uses what it just allocated).
  UseRecord* add(DevPtr base, std::size_t bytes, int device = 0);
  void remove(DevPtr base);

  // Submission side, inside the launch gate.
  // The snapshot is loaded after the gate was entered: a writer that replaced it waits, in
  // LaunchGate::quiesce, for every submission that could still hold the old one.
  void mark(DevPtr ptr) {
    const Ranges* r = ranges_.load(std::memory_order_seq_cst);
    if (r != nullptr && ptr - r->lo < r->span)
      if (const Entry* e = find(*r, ptr)) {
        e->record->touch(epoch(), threads::id());
        if (__builtin_expect(tape_.armed(), 0)) tape_.submission(StepTape::kCopy, &e->record, 1);
      }
  }
  // A kernel launch: `params` is cuLaunchKernel's kernelParams (an array of pointers to each
  // parameter), `extra` its extra array (CU_LAUNCH_PARAM_BUFFER_POINTER/SIZE); either may be null.
  // Returns 0, or what the caller should do before the launch (take_named() then says what it
  // named): kAskAhead when it named an allocation (partly) on the host that no launch asked about
  // in this epoch yet, for the policy to decide; kTime when it named a host-resident allocation
  // whose timing is due (UseRecord::time_due), or is the thread's first launch of the function in
  // the epoch to name host-resident memory (placement/host_cost.h): every kernel that reads a buffer
  // there is timed, not only the first of the epoch (which may be the one that writes it).
  static constexpr unsigned kAskAhead = 1, kTime = 2;
  unsigned mark_launch(Function f, void** params, void** extra);

  // Adds the calling thread's counted repeats of its last launch to the allocations it named (at
  // a safe point of that thread, so that what the policy reads there is whole).
  void settle();

  // What the calling thread's last launch that returned nonzero named: every allocation (`named`,
  // which must stay on the device for promotion ahead) and those (partly) on the host, by base,
  // with their host bytes, those of the device of the first of them in `host`. Clears the
  // thread's list; false if it had none or none was on the host.
  struct Named {
    int device = 0;
    std::vector<DevPtr> named;
    std::vector<HostCost::Named> host;  // what a timed launch hands to HostCost::begin
  };
  bool take_named(Named& out);

  // The recording of what submissions name, in order, that the policy learns the step from.
  StepTape& tape() { return tape_; }

  // Epochs: the migration policy advances them at safe points.
  std::uint64_t epoch() const { return epoch_.load(std::memory_order_relaxed); }
  void advance_epoch() { epoch_.fetch_add(1, std::memory_order_relaxed); }

  // The migration policy reads records it listed from the spill target outside any lock: while
  // one such read is open, no removed record is freed (a later publication frees it).
  class PolicyRead {
   public:
    explicit PolicyRead(UseTracker& t) : t_(t) {
      t_.policy_readers_.fetch_add(1, std::memory_order_seq_cst);
    }
    ~PolicyRead() { t_.policy_readers_.fetch_sub(1, std::memory_order_release); }
    PolicyRead(const PolicyRead&) = delete;
    PolicyRead& operator=(const PolicyRead&) = delete;

   private:
    UseTracker& t_;
  };

  // How many times the set of movable ranges changed (an allocation added or removed).
  std::uint64_t publications() const { return publications_.load(std::memory_order_relaxed); }

  // A module or library was unloaded: a later function may reuse a cached handle.
  void forget_functions();

  struct Counts {
    std::uint64_t launches = 0;        // kernel launches scanned
    std::uint64_t unknown_layout = 0;  // launches whose parameter layout the driver did not give
    std::uint64_t functions = 0;       // layouts cached
    std::uint64_t layout_misses = 0;   // launches whose function was not in the thread's cache
  };
  Counts counts() const;

  // CU_LAUNCH_PARAM_* values (cuda.h), checked against it in abi/type_check.cpp.
  static constexpr std::uintptr_t kParamEnd = 0x00;
  static constexpr std::uintptr_t kParamBufferPointer = 0x01;
  static constexpr std::uintptr_t kParamBufferSize = 0x02;

 private:
  struct Entry {
    DevPtr base, end;
    UseRecord* record;
  };
  // A sorted, immutable set of the movable ranges.
  struct Ranges {
    std::uint64_t generation = 0;  // distinct for every snapshot published
    DevPtr lo = 0;
    std::uint64_t span = 0;  // hi - lo: a word w is in no range when w - lo >= span
    std::vector<Entry> entries;
  };
  // A function's parameters, as the 8-byte words to check: each word's parameter, its offset in
  // that parameter, and its offset in the packed buffer (the `extra` form).
  struct Word {
    std::uint32_t param, at, packed;
  };
  struct Layout {
    bool known = false;
    std::uint32_t params = 0;  // how many parameters
    std::vector<Word> words;
  };
  // A function this thread launched: its layout and, for the first kHints words, the range each
  // hit last (a kernel launched in a loop points its parameters into the same allocations, so
  // one check finds each), valid for the snapshot of `hint_generation`.
  struct CachedFunction {
    static constexpr std::size_t kHints = 8;
    Function key = nullptr;
    const Layout* layout = nullptr;
    std::uint64_t hint_generation = 0;
    const Entry* hints[kHints] = {};
    std::uint64_t timed_epoch =
        0;  // the last epoch a launch of it that named host memory was timed in
  };
  struct alignas(64) FunctionCache {
    // Sets of two, found by a multiplicative hash of the handle (driver handles are aligned
    // pointers, whose low bits would pick few sets).
    static constexpr std::size_t kSets = 32, kWaysPerSet = 2;
    std::uint64_t generation = 0;
    std::atomic<std::uint64_t> launches{0}, unknown{0}, misses{0};  // written by the owner only
    CachedFunction ways[kSets][kWaysPerSet];
    // The current launch's named ranges (bases) and their host bytes; valid when `ahead` is set
    // (the launch returned nonzero) until take_named().
    static constexpr unsigned kNamed = 16;
    DevPtr named[kNamed] = {};
    std::uint64_t host_bytes[kNamed] = {};
    int device[kNamed] = {};
    unsigned named_n = 0;
    bool ahead = false;
    // The thread's last launch, when it was scanned in full, asked nothing of the policy and named
    // at most kRepeatRecords allocations. A launch of the same function with the same parameter
    // words (a hash of them) in the same epoch, snapshot and placement names the same allocations,
    // which this launch already marked in this epoch: it only counts itself here, and the count
    // goes to their records at the thread's next full scan, every kRepeatFlush repeats, and at the
    // thread's safe points. Hot loops then read a few lines of their own thread's instead of every
    // record they name.
    static constexpr unsigned kRepeatRecords = 8;
    static constexpr std::uint32_t kRepeatFlush = 64;
    struct Repeat {
      Function f = nullptr;
      const Word* words = nullptr;
      std::uint32_t n = 0;
      std::uint32_t pending = 0;  // repeats not yet counted in the records
      std::uint64_t hash = 0, epoch = 0, generation = 0, moves = 0, functions = 0;
      std::uint64_t share = 0;  // what the launch counted in each record it named
      unsigned records_n = 0;
      UseRecord* records[kRepeatRecords] = {};
      DevPtr bases[kRepeatRecords] = {};
    } repeat;
  };

  // One launch's scan of its parameter words, and what it found (use_tracker_launch.cpp).
  struct Scan;

  static const Entry* find(const Ranges& r, DevPtr ptr);
  // The hash of a launch's parameter words that tells a repeat (kernelParams form).
  static std::uint64_t words_hash(const Word* words, std::size_t n, void** params);
  // Adds `c`'s counted repeats to those of their records still in `r`, the current snapshot, and
  // clears them.
  static void flush_repeat(FunctionCache& c, int id, const Ranges& r);
  // Whether a launch of `f` with `params` in epoch `e` repeats the thread's last one (it is then
  // only counted there); if not, the repeats counted so far go to their records and are forgotten.
  bool repeats(FunctionCache& c, int id, const Ranges& r, Function f, void** params,
               std::uint64_t e);
  // Keeps a launch that asked nothing of the policy as the one the thread's next launches may
  // repeat.
  void remember(FunctionCache& c, Function f, const Layout& l, void** params, const Ranges& r,
                const Scan& scan, std::uint64_t share);
  // The layout of `f`, and its entry in this thread's cache (null: no cache).
  const Layout* layout(FunctionCache* c, Function f, CachedFunction*& cached);
  // After a launch that wants promotion ahead: lists every allocation it names in `c`.
  static void name_all(FunctionCache& c, const Ranges& r, const Layout& l, void** params,
                       const unsigned char* buffer, std::size_t buffer_size);
  const Layout* layout_slow(Function f);
  // Builds and publishes the snapshot from `live_` (mutex_ held), freeing what no reader can see.
  void publish();
  void reclaim();

  const Driver& driver_;
  LaunchGate& gate_;
  std::atomic<std::uint64_t> epoch_{1};
  std::atomic<const Ranges*> ranges_{nullptr};
  std::atomic<std::uint64_t> generation_{1};  // of function handles (forget_functions)
  // Written by the policy and by allocations: a line apart from what every launch reads above.
  alignas(64) std::atomic<int> policy_readers_{0};
  std::atomic<std::uint64_t> publications_{0};
  std::uint64_t generations_ = 0;  // under mutex_

  std::mutex mutex_;  // live_, retired lists, the publication
  std::map<DevPtr, std::pair<std::size_t, std::unique_ptr<UseRecord>>> live_;
  std::vector<const Ranges*> retired_ranges_;
  std::vector<std::unique_ptr<UseRecord>> retired_records_;

  mutable std::mutex layout_mutex_;
  std::unordered_map<Function, std::unique_ptr<Layout>> layouts_;  // never erased: caches point in
  std::vector<std::unique_ptr<Layout>> stale_layouts_;
  threads::PerThread<FunctionCache> caches_;
  StepTape tape_;
};

}  // namespace allocshim
