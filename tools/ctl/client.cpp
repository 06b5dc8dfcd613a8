#include "ctl/client.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "core/control.h"
#include "base/human.h"
#include "os/unix_socket.h"

namespace allocshim::ctl {
namespace {

// The process's effective uid and its pid in its own PID namespace (the last of NSpid), from
// /proc/PID/status; false if it cannot be read (no such process).
bool read_status(const std::string& dir, uid_t* uid, pid_t* inner) {
  std::ifstream in(dir + "/status");
  if (!in) return false;
  bool have_uid = false;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key;
    words >> key;
    if (key == "Uid:") {
      long real = -1, effective = -1;
      words >> real >> effective;
      have_uid = effective >= 0;
      *uid = static_cast<uid_t>(effective);
    } else if (key == "NSpid:") {
      long p = 0;
      while (words >> p) *inner = static_cast<pid_t>(p);
    }
  }
  return have_uid;
}

std::string link_of(const std::string& path) {
  char buf[256];
  const ssize_t n = readlink(path.c_str(), buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

// Abstract socket names in the process's network namespace that begin with `prefix` (its leading
// '\0' written '@', as /proc/net/unix writes it).
std::vector<std::string> names_with(const std::string& dir, const std::string& prefix) {
  std::ifstream in(dir + "/net/unix");
  std::set<std::string> found;
  std::string line, shown = "@" + prefix.substr(1);
  while (std::getline(in, line)) {
    const std::size_t at = line.find(shown);
    if (at == std::string::npos || line.find(' ', at) != std::string::npos) continue;
    found.insert(std::string(1, '\0') + line.substr(at + 1));
  }
  return {found.begin(), found.end()};
}

// " in 0.52 s (18.9 GB/s)"
std::string took(std::uint64_t bytes, std::uint64_t ns) {
  char buf[64];
  std::snprintf(buf, sizeof buf, " in %.2f s", static_cast<double>(ns) / 1e9);
  std::string s = buf;
  if (bytes > 0 && ns > 0) {
    std::snprintf(buf, sizeof buf, " (%.1f GB/s)",
                  static_cast<double>(bytes) / static_cast<double>(ns));
    s += buf;
  }
  return s;
}

std::uint64_t number(const Reply& r, const char* key) {
  const auto it = r.fields.find(key);
  return it == r.fields.end() ? 0 : std::strtoull(it->second.c_str(), nullptr, 10);
}

}  // namespace

Reply parse(const std::string& answer) {
  Reply r;
  std::istringstream words(answer);
  std::string first;
  words >> first;
  if (first != "ok" && first != "error") {
    r.error = "the process answered something else than allocshim's control protocol";
    return r;
  }
  r.ok = first == "ok";
  std::string w;
  while (words >> w) {
    const std::size_t eq = w.find('=');
    if (eq == std::string::npos) continue;
    std::string key = w.substr(0, eq), value = w.substr(eq + 1);
    if (key == "reason") {  // the rest of the line
      std::string rest;
      std::getline(words, rest);
      value += rest;
    }
    r.fields[key] = value;
  }
  if (!r.ok) r.error = r.fields.count("reason") ? r.fields["reason"] : "the process refused";
  return r;
}

Reply ask(pid_t pid, const std::string& request, int timeout_ms, const std::string& proc) {
  Reply r;
  const std::string dir = proc + "/" + std::to_string(pid);
  uid_t uid = 0;
  pid_t inner = pid;
  if (!read_status(dir, &uid, &inner)) {
    r.error = "no such process";
    return r;
  }
  const std::string mine = link_of(proc + "/self/ns/net"), theirs = link_of(dir + "/ns/net");
  if (!mine.empty() && !theirs.empty() && mine != theirs) {
    r.error =
        "it runs in another network namespace, where its control socket is: run "
        "`nsenter --net=" +
        dir + "/ns/net allocshim ctl " + std::to_string(pid) + " " + request + "` (as root)";
    return r;
  }
  const std::vector<std::string> names = names_with(dir, Control::prefix(uid, inner));
  if (names.empty()) {
    r.error =
        "no control socket: the process does not run under allocshim, or its policy moves "
        "no memory ([budget] spill = \"host\" with migrate = \"promote\" or \"auto\")";
    return r;
  }
  for (const std::string& name : names) {
    // Only the listener that process `pid` made answers (another user may have bound a name).
    const int fd = os::connect_to(name, uid, timeout_ms, pid, 1000);
    if (fd < 0) continue;
    std::string answer;
    bool closed = !os::send_message(fd, request.data(), request.size());
    if (!closed && os::readable(fd, timeout_ms)) {
      char buf[os::kMaxMessageBytes];
      std::size_t nfds = 0;
      const long n = os::recv_any(fd, buf, sizeof buf, nullptr, 0, &nfds);
      if (n > 0) answer.assign(buf, static_cast<std::size_t>(n));
      closed = n <= 0;
    }
    ::close(fd);
    if (answer.empty()) {
      // A process closes at once a connection of a user it does not answer.
      r.error = closed ? "it closed the connection: only its own user and root may ask it"
                       : "its control socket gave no answer within " +
                             std::to_string(timeout_ms / 1000) + " s";
      return r;
    }
    return parse(answer);
  }
  r.error = errno == EACCES || errno == EPERM
                ? "its control socket refused this user (only its own user and root may)"
                : "its control socket did not accept (only its own user and root may use it)";
  return r;
}

std::string describe(pid_t pid, const std::string& request, const Reply& reply) {
  std::string s = std::to_string(pid) + ": ";
  if (!reply.ok) return s + request + " failed: " + reply.error;
  const auto state = reply.fields.find("state");
  s += state == reply.fields.end() ? "?" : state->second;
  const std::uint64_t moved = number(reply, "moved"), ns = number(reply, "ns");
  if (request == "sleep")
    s += ": " + human_bytes(moved) + " moved to the host" + took(moved, ns);
  else if (request == "wake")
    s += ": " + human_bytes(moved) + " moved back to the device" + took(moved, ns);
  s += "; " + human_bytes(number(reply, "device")) + " on the device, " +
       human_bytes(number(reply, "host")) + " on the host";
  return s;
}

}  // namespace allocshim::ctl
