// What allocshim top shows: every shared budget's region of a directory, each member with the
// process behind it (user, container, command from /proc), and its move rates between two reads;
// rendered as a table, JSON, or Prometheus text exposition.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/node_view.h"

namespace allocshim::top {

// A process as /proc shows it; empty fields where it cannot be read (another PID namespace, gone).
struct Process {
  std::string user;       // the region's uid as a name where the passwd database has one
  std::string container;  // the cgroup v2 path ("/" for the root), or the first v1 one
  std::string command;    // the executable's name (comm)
};
Process read_process(pid_t pid, uid_t uid, const std::string& proc = "/proc");

struct Snapshot {
  std::uint64_t time_ns = 0;  // CLOCK_MONOTONIC when read
  std::vector<node::RegionView> regions;
  std::map<pid_t, Process> processes;
  // Bytes per second moved by (region path, slot, entry) since the previous snapshot; absent for a
  // first read or a member that changed.
  struct Rate {
    double to_device = 0, to_host = 0;
  };
  std::map<std::string, Rate> rates;
  // Members of another PID namespace (a container), by (namespace inode, pid there): their pid
  // here, found through /proc/PID/ns/pid and NSpid; absent where none matched.
  std::map<std::pair<std::uint64_t, pid_t>, pid_t> here;
  std::uint64_t own_pid_ns = 0;
};
// The member's pid as this process's /proc names it, or -1 where it cannot be found.
pid_t pid_here(const Snapshot& s, const node::MemberView& m);
// Key of a member's use of one GPU in Snapshot::rates.
std::string rate_key(const std::string& path, const node::MemberView& m, int entry);

// Reads every region of `dir`; with `previous` (same directory, earlier), the move rates too.
Snapshot take(const std::string& dir, const Snapshot* previous = nullptr,
              const std::string& proc = "/proc");

void write_table(const Snapshot& s, std::ostream& out);
nlohmann::json to_json(const Snapshot& s);
// Prometheus text exposition format (version 0.0.4).
std::string to_prometheus(const Snapshot& s);

}  // namespace allocshim::top
