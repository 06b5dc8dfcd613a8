#include "core/control.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <system_error>

#include "base/clock.h"
#include "base/log.h"
#include "node/node_budget.h"
#include "os/thread.h"
#include "os/unix_socket.h"

namespace allocshim {
namespace {

// How long a client may take to send its request or read the answer.
constexpr int kIoTimeoutMs = 2000;

// A forked child has the listener's descriptor but no thread: it closes it, so that the name goes
// with the parent. (One instance serves a process; tests that start several are not forked.)
std::atomic<Control*> g_listening{nullptr};
std::atomic<int> g_listener_fd{-1}, g_wake_fds[2] = {-1, -1};
void close_in_child() {
  for (std::atomic<int>* fd : {&g_listener_fd, &g_wake_fds[0], &g_wake_fds[1]}) {
    const int f = fd->exchange(-1);
    if (f >= 0) ::close(f);
  }
  g_listening.store(nullptr);
}

std::string words(const Sleeper::Outcome& o) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "ok state=%s moved=%llu ns=%llu device=%llu host=%llu",
                state_name(o.state), static_cast<unsigned long long>(o.moved),
                static_cast<unsigned long long>(o.ns), static_cast<unsigned long long>(o.device),
                static_cast<unsigned long long>(o.host));
  return buf;
}

}  // namespace

std::string Control::prefix(uid_t uid, pid_t pid) {
  return std::string(1, '\0') + "allocshim-ctl." + std::to_string(uid) + "." + std::to_string(pid) +
         ".";
}

std::string Control::answer(Sleeper& sleeper, const std::string& request) {
  Sleeper::Outcome o;
  if (request == "sleep")
    o = sleeper.sleep();
  else if (request == "wake")
    o = sleeper.wake();
  else if (request == "status")
    o = sleeper.status();
  else
    return "error reason=unknown request (sleep, wake or status)";
  // The reason is the last word: it may hold spaces.
  return o.error.empty() ? words(o)
                         : "error state=" + std::string(state_name(o.state)) + " reason=" + o.error;
}

bool Control::start(Sleeper& sleeper, const NodeBudget& node, std::uint32_t idle_ms) {
  set_idle_ms(idle_ms);
  if (thread_.joinable()) return true;
  sleeper_ = &sleeper;
  node_ = &node;
  // A name taken already (by chance, or by a process that guessed it) gets another random part.
  for (int attempt = 0; attempt < 4 && listener_ < 0; ++attempt) {
    char part[24];
    std::snprintf(part, sizeof part, "%016llx",
                  static_cast<unsigned long long>(os::random_name_part()));
    name_ = prefix(geteuid(), getpid()) + part;
    listener_ = os::listen_on(name_);
  }
  if (listener_ < 0) {
    log::write(log::Level::warn, "control: no socket for allocshim ctl (errno %d)", errno);
    return false;
  }
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(listener_);
    listener_ = -1;
    return false;
  }
  static const bool atfork = pthread_atfork(nullptr, nullptr, close_in_child) == 0;
  (void)atfork;
  try {
    thread_ = os::start_thread([this] { run(); });
    pthread_setname_np(thread_.native_handle(), "allocshim-ctl");
  } catch (const std::system_error&) {
    for (int& fd : wake_) ::close(fd), fd = -1;
    ::close(listener_);
    listener_ = -1;
    log::write(log::Level::warn, "control: no thread for allocshim ctl");
    return false;
  }
  g_listener_fd.store(listener_);
  g_wake_fds[0].store(wake_[0]);
  g_wake_fds[1].store(wake_[1]);
  g_listening.store(this);
  return true;
}

void Control::stop() {
  if (!thread_.joinable()) return;
  const char c = 0;
  ssize_t ignored = ::write(wake_[1], &c, 1);
  (void)ignored;
  thread_.join();
  Control* self = this;
  if (g_listening.compare_exchange_strong(self, nullptr)) {
    g_listener_fd.store(-1);
    g_wake_fds[0].store(-1);
    g_wake_fds[1].store(-1);
  }
  ::close(listener_);
  for (int& fd : wake_) ::close(fd), fd = -1;
  listener_ = -1;
}

void Control::run() {
  for (;;) {
    pollfd fds[2] = {{wake_[0], POLLIN, 0}, {listener_, POLLIN, 0}};
    const int r = ::poll(fds, 2, kTickMs);
    if (r < 0 && errno != EINTR) break;
    if (fds[0].revents != 0) break;
    if (r > 0 && (fds[1].revents & POLLIN) != 0) serve_one();
    sleeper_->tick(clock::now_ns(), idle_ms_.load(std::memory_order_relaxed));
    node_->refresh();
  }
}

void Control::serve_one() {
  bool refused = false;
  const int fd = os::accept_from(listener_, geteuid(), kIoTimeoutMs, &refused, nullptr,
                                 /*or_root=*/true);
  if (fd < 0) {
    if (refused) log::write(log::Level::info, "control: refused a connection of another user");
    return;
  }
  char request[32];
  long n = 0;
  if (os::readable(fd, kIoTimeoutMs)) {
    std::size_t nfds = 0;
    n = os::recv_any(fd, request, sizeof request, nullptr, 0, &nfds);
  }
  if (n > 0) {
    const std::string reply = answer(*sleeper_, std::string(request, static_cast<std::size_t>(n)));
    os::send_message(fd, reply.data(), reply.size());
  }
  ::close(fd);
}

}  // namespace allocshim
