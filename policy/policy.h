// A policy: which backend serves which allocation, and how frees are made safe.
//
// This header is the whole contract between the policy engine (this folder: TOML loading,
// validation, matching) and its users (the shim's core, the allocshim tool). It is plain data:
// no CUDA, no toml types. The loader lives in policy/load.cpp, matching in policy/match.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "policy/types.h"

namespace allocshim::policy {

inline constexpr std::uint64_t kUnlimited = std::numeric_limits<std::uint64_t>::max();

// One named backend instance ([backends.NAME]); the five kinds can also be named directly.
struct BackendSpec {
  bool operator==(const BackendSpec&) const = default;
  // Same name and options but the spill target's host side: a reload keeps the instance (and its
  // cached memory); the host side is the spill target's, set at each install.
  bool same_instance(const BackendSpec& other) const {
    BackendSpec a = *this, b = other;
    a.pin_threads = b.pin_threads;
    a.host_reserve = b.host_reserve;
    a.pin_ahead = b.pin_ahead;
    a.pin_ahead_idle_ms = b.pin_ahead_idle_ms;
    return a == b;
  }
  std::string name;
  BackendKind kind = BackendKind::native;
  // async_pool
  std::uint64_t release_threshold =
      kUnlimited;             // bytes the pool keeps after a sync; kUnlimited: all
  std::uint64_t initial = 0;  // bytes reserved up front
  std::optional<bool> ipc;    // POSIX-FD exportable; unset: where the device allows
  // vmm
  std::uint64_t chunk = 2ull << 20;                  // physical chunk size
  std::uint64_t reserve = 0;                         // VA reserved per region (0: backend default)
  std::uint64_t vmm_release_threshold = kUnlimited;  // free chunks kept mapped
  std::uint64_t thread_cache = 32ull << 20;          // classed bytes parked per thread and device
  // managed
  bool read_mostly = false;
  enum class Preferred : std::uint8_t { none, device, host } preferred_location = Preferred::none;
  bool accessed_by = false;  // the allocating device is advised as an accessor
  bool prefetch = false;     // prefetch to the preferred location on allocation
  double stripe = 0.0;       // fraction of 2 MiB pages kept on the host (0: no striping;
                             // kStripeAuto: the backend picks it from the budget)
  // host, as the budget's spill target ([backends.host] only): the host side of its moves.
  // Threads that create pinned host memory for spilled allocations and demotions at once (0: the
  // calling thread alone); docs/design/oversubscription.md, "What a move costs".
  std::uint32_t pin_threads = 8;
  // Pinned host pieces that promotions free, kept (up to this many bytes) for later demotions and
  // spills of the same size: no pinning then (docs/design/oversubscription.md, "The host reserve"). 0: none.
  std::uint64_t host_reserve = std::uint64_t{4} << 30;
  // With migrate = "auto": a thread of the shim fills the host reserve before demotions come, so
  // that a demotion copies instead of pinning (docs/design/oversubscription.md, "Pinning ahead").
  // Off by default: it pins host memory the program has not asked for yet.
  bool pin_ahead = false;
  // Host pieces pinned ahead that no demotion took for this long are given back.
  std::uint32_t pin_ahead_idle_ms = 30000;
};
inline constexpr double kStripeAuto = -1.0;

struct Rule {
  std::uint64_t size_min = 0;           // inclusive
  std::uint64_t size_max = kUnlimited;  // inclusive
  std::uint32_t api_mask = ~0u;         // bit (1 << Api)
  std::uint64_t device_mask = ~0ull;    // bit (1 << device id)
  std::string callsite;                 // glob; empty: any
  int backend = 0;                      // index into Policy::backends; -1: the default backend
  std::optional<FreeSync> free_sync;    // unset: the default's
  int line = 0, column = 0;             // where the rule starts in its file, for explanations
};

struct Budget {
  // Device bytes the shim may back per device; kUnlimited: no budget. A percentage is resolved
  // against the device's total memory when the shim starts (percent_of_total >= 0).
  std::uint64_t device = kUnlimited;
  double percent = -1.0;
  std::vector<std::pair<int, std::uint64_t>> per_device;  // explicit per-device overrides
  std::vector<std::pair<int, double>> per_device_percent;
  enum class Spill : std::uint8_t { none, host, managed } spill = Spill::none;
  // off: placement is decided once; promote: spilled host chunks move back to the device when room
  // returns; auto: promote, and demote cold device memory to make room (docs/oversubscription.md).
  enum class Migrate : std::uint8_t { off, promote, auto_ } migrate = Migrate::off;
  // Who shares each device's budget: this process alone, or every process under allocshim of the
  // same user, of the same group, or of anyone on the node (docs/oversubscription.md).
  enum class Share : std::uint8_t { process, user, group, device } share = Share::process;
  // How long an allocation past a shared budget waits for other processes to give room back.
  std::uint32_t share_wait_ms = 200;
  // A process that submits no work for this long is put to sleep by a thread of the shim: its
  // device memory moves to the host and its share of a shared budget goes back (docs/operators.md,
  // "Sleep and wake"). 0: never.
  std::uint32_t idle_sleep_ms = 0;
};

// [compute]: GPU time shared between the processes that want one GPU at once, in exclusive
// slices (docs/operators.md, "Compute share and priority"). Only processes whose policy has the
// section take part.
struct Compute {
  bool enabled = false;  // the policy has a [compute] section
  // The most of the GPU's time this process may take while others want it, in thousandths (1000:
  // no cap beyond an equal split).
  std::uint32_t share_permille = 1000;
  // Members of the highest priority that want the GPU run; the others wait for them to stop.
  enum class Priority : std::uint8_t { low, normal, high } priority = Priority::normal;
  // Who takes part together: the processes of this user, of this group, or of the whole node.
  Budget::Share scope = Budget::Share::device;
  // One round of slices: every member that wants the GPU gets its part of it once.
  std::uint32_t period_ms = 100;
};

struct Trace {
  std::string path;  // empty: tracing off; "%p" becomes the pid
  enum class Stacks : std::uint8_t { off, native, python, both } stacks = Stacks::native;
  std::uint32_t sample = 1;  // record one event in N
};

struct Log {
  enum class Level : std::uint8_t { error, warn, info, debug } level = Level::warn;
  bool summary = true;  // print the exit summary
};

struct Reload {
  bool watch = false;
  std::uint32_t interval_ms = 1000;
};

struct Policy {
  int version = 1;
  std::string source = "<default>";  // file the policy came from
  // The environment overrides applied on top of it, as written ("ALLOCSHIM_BACKEND=vmm,
  // ALLOCSHIM_CONF=free_sync=none"); empty when none.
  std::string overrides;
  std::vector<BackendSpec> backends;  // index 0.. ; the default backend is one of these
  int default_backend = 0;
  FreeSync default_free_sync = FreeSync::device;
  std::vector<Rule> rules;  // first match wins
  Budget budget;
  Compute compute;
  Trace trace;
  Log log;
  Reload reload;

  // The host side of the budget's host spill target: [backends.host] when the policy has it, the
  // defaults otherwise.
  BackendSpec host_side() const {
    for (const BackendSpec& b : backends)
      if (b.name == "host" && b.kind == BackendKind::host) return b;
    BackendSpec d;
    d.name = "host";
    d.kind = BackendKind::host;
    return d;
  }

  bool uses_callsite() const {
    for (const Rule& r : rules)
      if (!r.callsite.empty()) return true;
    return false;
  }
};

// A located error: FILE:LINE:COLUMN: message.
struct Diagnostic {
  std::string file;
  int line = 0, column = 0;
  std::string message;
  std::string str() const;
};

// Backend kinds. Which ones this build implements is decided in policy/kinds.cpp alone.
bool kind_implemented(BackendKind kind);
std::uint32_t implemented_kinds();  // bit (1 << kind) per implemented kind
inline constexpr std::uint32_t kAllKinds = (1u << kBackendKindCount) - 1;

struct LoadOptions {
  // Kinds a policy may name (bit 1 << kind). A policy naming another kind is rejected, so it is
  // never silently served natively. Tests and `allocshim check --all-kinds` widen it.
  std::uint32_t kinds = implemented_kinds();
};

// Reads a policy file whole (at most 16 MiB). A pipe or FIFO is read as a stream, never waited on
// for a writer: one that gives no data is refused. False with `error` (no path in it) otherwise.
bool read_policy_file(const std::string& path, std::string& text, std::string& error);
// Loads and validates. On success returns true; otherwise false with every error in `errors`
// (sorted by position; `out` is then left unchanged).
bool load_file(const std::string& path, Policy& out, std::vector<Diagnostic>& errors);
bool load_string(std::string_view text, const std::string& name, Policy& out,
                 std::vector<Diagnostic>& errors);
bool load_file(const std::string& path, Policy& out, std::vector<Diagnostic>& errors,
               const LoadOptions& options);
bool load_string(std::string_view text, const std::string& name, Policy& out,
                 std::vector<Diagnostic>& errors, const LoadOptions& options);
// The embedded default policy (used when no file is given) and its TOML text.
const Policy& default_policy();
std::string_view default_policy_text();

// Applies ALLOCSHIM_BACKEND / ALLOCSHIM_CONF style overrides on top of `p` (either may be null or
// empty). ALLOCSHIM_BACKEND=NAME serves every allocation from NAME (a backend of `p` or a kind): the
// rules are dropped. ALLOCSHIM_CONF="key=value,..." sets keys in dotted form ("budget.device=8GiB",
// "backends.pool.ipc=true"; "backend" and "free_sync" mean the [defaults] ones), left to right,
// after ALLOCSHIM_BACKEND. Errors are located in the variable ("ALLOCSHIM_CONF:1:COLUMN", the
// column counting from 1 at the string's first character). All or nothing: on error `p` is left
// unchanged.
bool apply_overrides(Policy& p, const char* backend_env, const char* conf_env,
                     std::vector<Diagnostic>& errors);
bool apply_overrides(Policy& p, const char* backend_env, const char* conf_env,
                     std::vector<Diagnostic>& errors, const LoadOptions& options);

// Device bytes the shim may back on `device`, whose total memory is `device_total`: an explicit
// per-device entry first, then the global size or percentage; kUnlimited when there is no budget.
std::uint64_t budget_for(const Budget& b, int device, std::uint64_t device_total);

// The outcome of matching one allocation.
struct Decision {
  int backend = 0;
  FreeSync free_sync = FreeSync::device;
  int rule = -1;  // index into Policy::rules, -1: the defaults
};

// Matches an allocation against the rules. `callsite` names the call stack's frames (demangled
// function and module names, separated by '\n'); it is only consulted by rules with a callsite
// glob, and may be empty when none exists.
Decision match(const Policy& p, std::uint64_t size, Api api, int device,
               std::string_view callsite = {});

// match() with the callsite globs already evaluated: bit i of `callsite_bits` says whether rule i's
// glob matches the allocating stack (the shim caches these bits per stack). Rules past the 64th
// never match on a callsite here.
Decision match_callsite_bits(const Policy& p, std::uint64_t size, Api api, int device,
                             std::uint64_t callsite_bits);

// Why match() decides what it does, for `allocshim check --explain`: one line with the decision
// and the rule that made it, then one line per earlier rule saying why it did not match.
std::string explain(const Policy& p, std::uint64_t size, Api api, int device,
                    std::string_view callsite = {});

// The normalized TOML form of a policy (what `allocshim check` prints). Loading it gives back the
// same policy.
std::string to_toml(const Policy& p);

}  // namespace allocshim::policy
