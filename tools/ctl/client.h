// The client of a process's control socket (allocshim ctl; the server is shim/core/control.h):
// finds the socket of a process by its pid, checks that the listener is that process, sends one
// request and reads the answer.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>

namespace allocshim::ctl {

struct Reply {
  bool ok = false;
  std::string error;                          // why there is no answer, or the process's reason
  std::map<std::string, std::string> fields;  // the answer's key=value words
};

// Sends `request` ("sleep", "wake" or "status") to process `pid` (as this process numbers it) and
// waits up to `timeout_ms` for the answer. `proc`: where /proc is (tests).
Reply ask(pid_t pid, const std::string& request, int timeout_ms, const std::string& proc = "/proc");

// The answer's words: "ok k=v ..." or "error k=v ... reason=TEXT" (the reason runs to the end).
Reply parse(const std::string& answer);

// One line for people: what the process did and where its memory is.
std::string describe(pid_t pid, const std::string& request, const Reply& reply);

}  // namespace allocshim::ctl
