// See watch.h. stat() is the whole cost of a poll when nothing changed.
#include "policy/watch.h"

#include <sys/stat.h>

#include <utility>

namespace allocshim::policy {

PolicyWatcher::PolicyWatcher(std::string path, std::uint32_t interval_ms, const char* backend_env,
                             const char* conf_env, LoadOptions options)
    : path_(std::move(path)),
      interval_ms_(interval_ms),
      backend_env_(backend_env ? backend_env : ""),
      conf_env_(conf_env ? conf_env : ""),
      has_backend_env_(backend_env != nullptr),
      has_conf_env_(conf_env != nullptr),
      options_(options),
      stamp_(stat_now()) {}

PolicyWatcher::Stamp PolicyWatcher::stat_now() const {
  struct stat st {};
  Stamp s;
  if (::stat(path_.c_str(), &st) != 0) return s;
  s.exists = true;
  s.dev = static_cast<std::uint64_t>(st.st_dev);
  s.ino = static_cast<std::uint64_t>(st.st_ino);
  s.size = static_cast<std::uint64_t>(st.st_size);
  s.mtime_sec = static_cast<std::int64_t>(st.st_mtim.tv_sec);
  s.mtime_nsec = static_cast<std::int64_t>(st.st_mtim.tv_nsec);
  return s;
}

PolicyWatcher::Change PolicyWatcher::poll(Policy& out, std::vector<Diagnostic>& errors) {
  // Stat before reading: if the file changes again while it is read, the next poll sees a stamp
  // newer than the one recorded here and reads it once more.
  const Stamp now = stat_now();
  if (now == stamp_) return Change::none;
  stamp_ = now;
  Policy fresh;
  if (!load_file(path_, fresh, errors, options_)) return Change::invalid;
  if (!apply_overrides(fresh, has_backend_env_ ? backend_env_.c_str() : nullptr,
                       has_conf_env_ ? conf_env_.c_str() : nullptr, errors, options_))
    return Change::invalid;
  out = std::move(fresh);
  return Change::reloaded;
}

PolicyWatcher::Change PolicyWatcher::poll_if_due(std::uint64_t now_ms, Policy& out,
                                                 std::vector<Diagnostic>& errors) {
  if (polled_ && now_ms - last_poll_ms_ < interval_ms_) return Change::none;
  polled_ = true;
  last_poll_ms_ = now_ms;
  return poll(out, errors);
}

}  // namespace allocshim::policy
