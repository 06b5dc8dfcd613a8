// The control socket (`allocshim ctl`; docs/operators.md, "Sleep and wake"): one thread of the shim
// that answers sleep, wake and status, and watches for idleness ([budget] idle_sleep_ms).
//
// The socket is a SOCK_SEQPACKET listener in the abstract namespace named
// "allocshim-ctl.<uid>.<pid>.<random>": nothing on disk, gone with the process. Another local user
// may bind any name, so the name is not trusted either way: the shim accepts only peers of its own
// effective uid or root (SO_PEERCRED), and the client checks that the listener is the process it
// asked for, by pid. A name taken already only means this process has no control socket.
//
// One request per connection: a message "sleep", "wake" or "status"; the answer is one message of
// "key=value" words, first "ok" or "error", e.g. "ok state=asleep moved=... ns=... device=...
// host=..." or "error reason=...". Requests are served one at a time.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "core/sleep.h"

namespace allocshim {

class NodeBudget;

class Control {
 public:
  Control() = default;
  ~Control() { stop(); }
  Control(const Control&) = delete;
  Control& operator=(const Control&) = delete;

  // Starts the thread once (later calls only set `idle_ms`). False, said once in the log, when it
  // cannot: the process then has no control socket and never dozes.
  bool start(Sleeper& sleeper, const NodeBudget& node, std::uint32_t idle_ms);
  void set_idle_ms(std::uint32_t idle_ms) { idle_ms_.store(idle_ms, std::memory_order_relaxed); }
  // Ends the thread (an answer in progress finishes first).
  void stop();
  bool running() const { return thread_.joinable(); }
  const std::string& name() const { return name_; }

  // The answer to one request (what the thread sends back); public for tests.
  static std::string answer(Sleeper& sleeper, const std::string& request);
  // Names: the prefix of process `pid` of user `uid` (the random part follows).
  static std::string prefix(uid_t uid, pid_t pid);

  // How often the thread wakes without a request: the idle watch's resolution, and how often an
  // idle process reads its shared budget's region (requests, views).
  static constexpr int kTickMs = 100;

 private:
  void run();
  void serve_one();

  Sleeper* sleeper_ = nullptr;
  const NodeBudget* node_ = nullptr;
  std::atomic<std::uint32_t> idle_ms_{0};
  int listener_ = -1;
  int wake_[2] = {-1, -1};
  std::string name_;  // with its leading '\0'
  std::thread thread_;
};

}  // namespace allocshim
