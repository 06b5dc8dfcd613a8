// Reloading a policy file while the program runs ([reload] watch = true).
//
// The watcher only stats the file (inode, size, modification time to the nanosecond) until one of
// them changes, then reloads it and re-applies the environment overrides. A valid new file gives a
// new Policy (new allocations follow it); an invalid one gives its errors and the caller keeps the
// policy it has. The same broken file is reported once, not on every poll.
//
// Not thread-safe: one thread (the shim's reload check) owns a watcher.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policy/policy.h"

namespace allocshim::policy {

class PolicyWatcher {
 public:
  enum class Change {
    none,      // the file looks as it did: nothing read
    reloaded,  // the file changed and loaded: `out` holds the new policy
    invalid,   // the file changed but does not load (or vanished): `errors` says why
  };

  // Watches `path` as it is now (the caller loaded this version already). `backend_env` and
  // `conf_env` are re-applied after every reload, as at start (copies are kept).
  explicit PolicyWatcher(std::string path, std::uint32_t interval_ms = 1000,
                         const char* backend_env = nullptr, const char* conf_env = nullptr,
                         LoadOptions options = {});

  // Stats the file; reloads it if it changed.
  Change poll(Policy& out, std::vector<Diagnostic>& errors);
  // poll(), but only when `interval_ms` have passed since the last stat (`now_ms`: any monotonic
  // clock in milliseconds); otherwise Change::none without a system call.
  Change poll_if_due(std::uint64_t now_ms, Policy& out, std::vector<Diagnostic>& errors);

  const std::string& path() const { return path_; }
  std::uint32_t interval_ms() const { return interval_ms_; }
  void set_interval_ms(std::uint32_t ms) { interval_ms_ = ms; }

 private:
  struct Stamp {
    bool exists = false;
    std::uint64_t dev = 0, ino = 0, size = 0;
    std::int64_t mtime_sec = 0, mtime_nsec = 0;
    bool operator==(const Stamp&) const = default;
  };
  Stamp stat_now() const;

  std::string path_;
  std::uint32_t interval_ms_;
  std::string backend_env_, conf_env_;
  bool has_backend_env_, has_conf_env_;
  LoadOptions options_;
  Stamp stamp_;
  std::uint64_t last_poll_ms_ = 0;
  bool polled_ = false;
};

}  // namespace allocshim::policy
