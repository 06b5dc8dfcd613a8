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

#include "core/types.h"

namespace allocshim::policy {

inline constexpr std::uint64_t kUnlimited = std::numeric_limits<std::uint64_t>::max();

// One named backend instance ([backends.NAME]); the five kinds can also be named directly.
struct BackendSpec {
  std::string name;
  BackendKind kind = BackendKind::native;
  // async_pool
  std::uint64_t release_threshold = kUnlimited;  // bytes the pool keeps after a sync; kUnlimited: all
  std::uint64_t initial = 0;                     // bytes reserved up front
  bool ipc = false;                              // POSIX-FD exportable
  // vmm
  std::uint64_t chunk = 2ull << 20;              // physical chunk size
  std::uint64_t reserve = 0;                     // VA reserved per region (0: backend default)
  std::uint64_t vmm_release_threshold = kUnlimited;  // free chunks kept mapped
  // managed
  bool read_mostly = false;
  enum class Preferred : std::uint8_t { none, device, host } preferred_location = Preferred::none;
  bool accessed_by = false;   // the allocating device is advised as an accessor
  bool prefetch = false;      // prefetch to the preferred location on allocation
  double stripe = 0.0;        // fraction of 2 MiB pages kept on the host (0: no striping)
};

struct Rule {
  std::uint64_t size_min = 0;          // inclusive
  std::uint64_t size_max = kUnlimited; // inclusive
  std::uint32_t api_mask = ~0u;        // bit (1 << Api)
  std::uint64_t device_mask = ~0ull;   // bit (1 << device id)
  std::string callsite;                // glob; empty: any
  int backend = 0;                     // index into Policy::backends
  std::optional<FreeSync> free_sync;   // unset: the default's
  int line = 0, column = 0;            // where the rule starts in its file, for explanations
};

struct Budget {
  // Device bytes the shim may back per device; kUnlimited: no budget. A percentage is resolved
  // against the device's total memory when the shim starts (percent_of_total >= 0).
  std::uint64_t device = kUnlimited;
  double percent = -1.0;
  std::vector<std::pair<int, std::uint64_t>> per_device;    // explicit per-device overrides
  std::vector<std::pair<int, double>> per_device_percent;
  enum class Spill : std::uint8_t { none, host, managed } spill = Spill::none;
  enum class Migrate : std::uint8_t { off, promote } migrate = Migrate::off;
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
  std::vector<BackendSpec> backends;  // index 0.. ; the default backend is one of these
  int default_backend = 0;
  FreeSync default_free_sync = FreeSync::device;
  std::vector<Rule> rules;            // first match wins
  Budget budget;
  Trace trace;
  Log log;
  Reload reload;

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

// Loads and validates. On success returns true; otherwise false with every error in `errors`.
bool load_file(const std::string& path, Policy& out, std::vector<Diagnostic>& errors);
bool load_string(std::string_view text, const std::string& name, Policy& out,
                 std::vector<Diagnostic>& errors);
// The embedded default policy (used when no file is given) and its TOML text.
const Policy& default_policy();
std::string_view default_policy_text();

// Applies ALLOCSHIM_BACKEND / ALLOCSHIM_CONF style overrides on top of `p`.
bool apply_overrides(Policy& p, const char* backend_env, const char* conf_env,
                     std::vector<Diagnostic>& errors);

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

// The normalized TOML form of a policy (what `allocshim check` prints).
std::string to_toml(const Policy& p);

}  // namespace allocshim::policy
