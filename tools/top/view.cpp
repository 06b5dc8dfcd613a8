#include "top/view.h"
#include "base/clock.h"

#include <dirent.h>
#include <pwd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace allocshim::top {
namespace {

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string bytes(std::uint64_t b) {
  char s[32];
  const double v = static_cast<double>(b);
  if (b >= (1ull << 30))
    std::snprintf(s, sizeof s, "%.1f GiB", v / (1ull << 30));
  else if (b >= (1ull << 20))
    std::snprintf(s, sizeof s, "%.1f MiB", v / (1ull << 20));
  else
    std::snprintf(s, sizeof s, "%" PRIu64 " B", b);
  return s;
}

std::string rate(const Snapshot& s, const std::string& key, bool to_device) {
  const auto it = s.rates.find(key);
  if (it == s.rates.end()) return "-";
  char t[32];
  std::snprintf(t, sizeof t, "%.2f GB/s",
                (to_device ? it->second.to_device : it->second.to_host) / 1e9);
  return t;
}

const node::GpuView* gpu_of(const node::RegionView& r, int entry) {
  for (const auto& g : r.gpus)
    if (g.entry == entry) return &g;
  return nullptr;
}

// A label value as the exposition format wants it: backslash, quote and newline escaped.
std::string label(const std::string& v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

Process read_process(pid_t pid, uid_t uid, const std::string& proc) {
  Process p;
  passwd pw{}, *found = nullptr;
  char buf[1024];
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found != nullptr)
    p.user = pw.pw_name;
  else
    p.user = std::to_string(uid);
  const std::string dir = proc + "/" + std::to_string(pid);
  p.command = first_line(dir + "/comm");
  std::ifstream cg(dir + "/cgroup");
  for (std::string line; std::getline(cg, line);) {
    // "0::/path" is cgroup v2's one line; v1 has one line per hierarchy, the first is taken.
    const std::size_t colon = line.find(':', line.find(':') + 1);
    if (colon == std::string::npos) continue;
    if (line.rfind("0::", 0) == 0 || p.container.empty()) p.container = line.substr(colon + 1);
    if (line.rfind("0::", 0) == 0) break;
  }
  return p;
}

namespace {

std::uint64_t pid_ns_of(const std::string& proc, const std::string& pid) {
  struct stat st {};
  return ::stat((proc + "/" + pid + "/ns/pid").c_str(), &st) == 0
             ? static_cast<std::uint64_t>(st.st_ino)
             : 0;
}

// For each wanted (namespace, pid there): the process of that namespace whose NSpid ends in pid.
void find_here(const std::string& proc, std::map<std::pair<std::uint64_t, pid_t>, pid_t>& wanted) {
  DIR* d = ::opendir(proc.c_str());
  if (d == nullptr) return;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    const std::uint64_t ns = pid_ns_of(proc, e->d_name);
    bool any = false;
    for (const auto& [key, here] : wanted) any = any || (key.first == ns && here < 0);
    if (!any) continue;
    std::ifstream status(proc + "/" + e->d_name + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("NSpid:", 0) != 0) continue;
      std::istringstream fields(line.substr(6));
      long last = -1;
      for (long v; fields >> v;) last = v;
      const auto it = wanted.find({ns, static_cast<pid_t>(last)});
      if (it != wanted.end()) it->second = static_cast<pid_t>(std::atol(e->d_name));
      break;
    }
  }
  ::closedir(d);
}

}  // namespace

pid_t pid_here(const Snapshot& s, const node::MemberView& m) {
  if (m.pid_ns == 0 || m.pid_ns == s.own_pid_ns) return m.pid;
  const auto it = s.here.find({m.pid_ns, m.pid});
  return it == s.here.end() ? -1 : it->second;
}

std::string rate_key(const std::string& path, const node::MemberView& m, int entry) {
  return path + "|" + std::to_string(m.slot) + "|" + std::to_string(m.pid) + "|" +
         std::to_string(entry);
}

Snapshot take(const std::string& dir, const Snapshot* previous, const std::string& proc) {
  Snapshot s;
  s.time_ns = clock::now_ns();
  s.regions = node::read_regions(dir);
  std::map<std::string, node::Usage> before;
  if (previous != nullptr)
    for (const auto& r : previous->regions)
      for (const auto& m : r.members)
        for (const auto& u : m.gpus) before[rate_key(r.path, m, u.entry)] = u.usage;
  const double seconds = previous != nullptr && s.time_ns > previous->time_ns
                             ? static_cast<double>(s.time_ns - previous->time_ns) / 1e9
                             : 0;
  s.own_pid_ns = pid_ns_of(proc, "self");
  for (const auto& r : s.regions)
    for (const auto& m : r.members)
      if (m.pid_ns != 0 && m.pid_ns != s.own_pid_ns) s.here[{m.pid_ns, m.pid}] = -1;
  if (!s.here.empty()) find_here(proc, s.here);
  for (const auto& r : s.regions)
    for (const auto& m : r.members) {
      const pid_t here = pid_here(s, m);
      if (here > 0 && !s.processes.count(here)) s.processes[here] = read_process(here, m.uid, proc);
      for (const auto& u : m.gpus) {
        const std::string key = rate_key(r.path, m, u.entry);
        const auto it = before.find(key);
        // Counters only grow while a member lives: a smaller one is another member in the slot.
        if (seconds <= 0 || it == before.end() || u.usage.to_device < it->second.to_device ||
            u.usage.to_host < it->second.to_host)
          continue;
        s.rates[key] =
            Snapshot::Rate{static_cast<double>(u.usage.to_device - it->second.to_device) / seconds,
                           static_cast<double>(u.usage.to_host - it->second.to_host) / seconds};
      }
    }
  return s;
}

namespace {

// The process behind pid `here` as the snapshot read it; empty fields where it could not.
const Process& process_of(const Snapshot& s, pid_t here) {
  static const Process none;
  const auto p = s.processes.find(here);
  return p == s.processes.end() ? none : p->second;
}

// Calls fn(member, its use of the GPU, its pid here, its process) for each member of `r` on the GPU
// of region entry `entry`.
template <class Fn>
void each_on_gpu(const Snapshot& s, const node::RegionView& r, int entry, Fn fn) {
  for (const auto& m : r.members)
    for (const auto& u : m.gpus)
      if (u.entry == entry) {
        const pid_t here = pid_here(s, m);
        fn(m, u, here, process_of(s, here));
      }
}

const char* priority_name(std::uint32_t p) {
  static const char* const kNames[] = {"low", "normal", "high"};
  return kNames[std::min<std::uint32_t>(p, 2)];
}

// A compute region: per GPU, each member's share, priority, time in its slices and time waited.
void write_compute(const Snapshot& s, const node::RegionView& r, std::ostream& out) {
  out << "compute slices, scope " << r.scope << " (" << r.path << ")\n";
  for (const auto& g : r.gpus) {
    out << "  " << g.uuid << "\n";
    char head[256];
    std::snprintf(head, sizeof head, "    %7s %-10s %-12s %-24s %6s %8s %10s %10s\n", "PID", "USER",
                  "COMMAND", "CONTAINER", "SHARE", "PRIORITY", "RAN", "WAITED");
    out << head;
    each_on_gpu(s, r, g.entry, [&](const auto& m, const auto& u, pid_t here, const Process& pr) {
      char row[512];
      std::snprintf(row, sizeof row,
                    "    %7d %-10.10s %-12.12s %-24.24s %5.1f%% %8s %9.1fs %9.1fs%s\n",
                    static_cast<int>(here), pr.user.c_str(), pr.command.c_str(),
                    pr.container.c_str(), std::min<std::uint32_t>(u.demand.share, 1000) / 10.0,
                    priority_name(u.demand.priority), static_cast<double>(u.demand.used_ns) / 1e9,
                    static_cast<double>(u.demand.waited_ns) / 1e9,
                    !m.alive             ? "  (dead: reclaimed next)"
                    : g.holder == m.slot ? "  running"
                                         : "");
      out << row;
    });
  }
}

}  // namespace

void write_table(const Snapshot& s, std::ostream& out) {
  if (s.regions.empty()) out << "no shared budgets (no region files)\n";
  for (const auto& r : s.regions) {
    if (!r.error.empty()) {
      out << r.path << ": " << r.error << "\n";
      continue;
    }
    if (r.compute) {
      write_compute(s, r, out);
      continue;
    }
    out << "scope " << r.scope << " (" << r.path << ")\n";
    for (const auto& g : r.gpus) {
      std::uint64_t leased = 0;
      for (const auto& m : r.members)
        for (const auto& u : m.gpus)
          if (u.entry == g.entry) leased += u.lease;
      out << "  " << g.uuid << "  limit " << bytes(g.limit) << ", leased " << bytes(leased) << "\n";
      char head[256];
      std::snprintf(head, sizeof head, "    %7s %-10s %-12s %-24s %10s %10s %10s %11s %11s %8s\n",
                    "PID", "USER", "COMMAND", "CONTAINER", "LEASE", "DEVICE", "HOST", "TO DEVICE",
                    "TO HOST", "WAITED");
      out << head;
      each_on_gpu(s, r, g.entry, [&](const auto& m, const auto& u, pid_t here, const Process& pr) {
        const std::string key = rate_key(r.path, m, u.entry);
        char row[512];
        std::snprintf(row, sizeof row,
                      "    %7d %-10.10s %-12.12s %-24.24s %10s %10s %10s %11s %11s %7.1fs%s\n",
                      static_cast<int>(here), pr.user.c_str(), pr.command.c_str(),
                      pr.container.c_str(), bytes(u.lease).c_str(), bytes(u.usage.device).c_str(),
                      bytes(u.usage.host).c_str(), rate(s, key, true).c_str(),
                      rate(s, key, false).c_str(), static_cast<double>(m.wait_ns) / 1e9,
                      m.alive ? (m.asleep ? "  asleep" : "") : "  (dead: reclaimed next)");
        out << row;
      });
    }
  }
}

nlohmann::json to_json(const Snapshot& s) {
  nlohmann::json regions = nlohmann::json::array();
  for (const auto& r : s.regions) {
    nlohmann::json jr = {
        {"path", r.path}, {"scope", r.scope}, {"kind", r.compute ? "compute" : "budget"}};
    if (!r.error.empty()) {
      jr["error"] = r.error;
      regions.push_back(jr);
      continue;
    }
    nlohmann::json gpus = nlohmann::json::array(), members = nlohmann::json::array();
    for (const auto& g : r.gpus)
      gpus.push_back({{"entry", g.entry}, {"uuid", g.uuid}, {"limit", g.limit}});
    for (const auto& m : r.members) {
      const pid_t here = pid_here(s, m);
      const auto p = s.processes.find(here);
      nlohmann::json jm = {{"pid", here > 0 ? nlohmann::json(here) : nlohmann::json()},
                           {"pid_in_namespace", m.pid},
                           {"pid_namespace", m.pid_ns},
                           {"uid", m.uid},
                           {"alive", m.alive},
                           {"asleep", m.asleep},
                           {"wait_seconds", static_cast<double>(m.wait_ns) / 1e9}};
      if (p != s.processes.end())
        jm.update({{"user", p->second.user},
                   {"container", p->second.container},
                   {"command", p->second.command}});
      nlohmann::json uses = nlohmann::json::array();
      for (const auto& u : m.gpus) {
        const node::GpuView* g = gpu_of(r, u.entry);
        if (r.compute) {
          uses.push_back({{"uuid", g ? g->uuid : ""},
                          {"share", std::min<std::uint32_t>(u.demand.share, 1000) / 1000.0},
                          {"priority", priority_name(u.demand.priority)},
                          {"ran_seconds", static_cast<double>(u.demand.used_ns) / 1e9},
                          {"waited_seconds", static_cast<double>(u.demand.waited_ns) / 1e9},
                          {"running", g != nullptr && g->holder == m.slot}});
          continue;
        }
        nlohmann::json ju = {{"uuid", g ? g->uuid : ""},       {"lease", u.lease},
                             {"device", u.usage.device},       {"host", u.usage.host},
                             {"to_device", u.usage.to_device}, {"to_host", u.usage.to_host}};
        const auto it = s.rates.find(rate_key(r.path, m, u.entry));
        ju["to_device_per_s"] =
            it == s.rates.end() ? nlohmann::json() : nlohmann::json(it->second.to_device);
        ju["to_host_per_s"] =
            it == s.rates.end() ? nlohmann::json() : nlohmann::json(it->second.to_host);
        uses.push_back(ju);
      }
      jm["gpus"] = uses;
      members.push_back(jm);
    }
    jr["gpus"] = gpus;
    jr["members"] = members;
    regions.push_back(jr);
  }
  return {{"regions", regions}};
}

std::string to_prometheus(const Snapshot& s) {
  struct Metric {
    const char* name;
    const char* type;
    const char* help;
  };
  // Per region, per GPU, per member and GPU, per member: each metric's rows are gathered apart,
  // then written after its HELP and TYPE lines.
  static const Metric kUp{"allocshim_region_up", "gauge",
                          "1 if the shared budget's region could be read, 0 if not"};
  static const Metric kLimit{"allocshim_gpu_limit_bytes", "gauge",
                             "The shared device budget of the GPU in the scope"};
  static const Metric kUse[] = {
      {"allocshim_member_lease_bytes", "gauge", "Room of the GPU's budget the process holds"},
      {"allocshim_member_device_bytes", "gauge", "Device memory the process backs on the GPU"},
      {"allocshim_member_host_bytes", "gauge", "Bytes of the process's allocations on the host"},
      {"allocshim_member_moved_to_device_bytes_total", "counter", "Bytes moved host to device"},
      {"allocshim_member_moved_to_host_bytes_total", "counter", "Bytes moved device to host"}};
  static const Metric kWaited{"allocshim_member_wait_seconds_total", "counter",
                              "Time the process waited for room"};
  static const Metric kAsleep{"allocshim_member_asleep", "gauge",
                              "1 while the process sleeps (its memory on the host), else 0"};
  static const Metric kSlices[] = {
      {"allocshim_compute_share_ratio", "gauge",
       "The most of the GPU's time the process takes while others want it ([compute] share)"},
      {"allocshim_compute_run_seconds_total", "counter", "Time the process ran in its slices"},
      {"allocshim_compute_wait_seconds_total", "counter",
       "Time the process's work waited for a slice"}};
  constexpr std::size_t kUses = sizeof kUse / sizeof kUse[0];
  constexpr std::size_t kSliceMetrics = sizeof kSlices / sizeof kSlices[0];
  std::ostringstream up, limit, use[kUses], waited, asleep, slices[kSliceMetrics];
  for (const auto& r : s.regions) {
    up << kUp.name << "{scope=\"" << label(r.scope) << "\",path=\"" << label(r.path) << "\"} "
       << (r.error.empty() ? 1 : 0) << "\n";
    if (!r.error.empty()) continue;
    for (const auto& g : r.gpus)
      if (!r.compute)
        limit << kLimit.name << "{scope=\"" << label(r.scope) << "\",gpu_uuid=\"" << g.uuid
              << "\"} " << g.limit << "\n";
    for (const auto& m : r.members) {
      const pid_t here = pid_here(s, m);
      const Process& pr = process_of(s, here);
      const std::string who = "scope=\"" + label(r.scope) + "\",pid=\"" +
                              std::to_string(here > 0 ? here : m.pid) + "\",user=\"" +
                              label(pr.user) + "\",container=\"" + label(pr.container) +
                              "\",command=\"" + label(pr.command) + "\"";
      if (r.compute) {
        for (const auto& u : m.gpus) {
          const node::GpuView* g = gpu_of(r, u.entry);
          const std::string labels = "{" + who + ",gpu_uuid=\"" + (g ? g->uuid : "") + "\"} ";
          const double values[kSliceMetrics] = {
              std::min<std::uint32_t>(u.demand.share, 1000) / 1000.0,
              static_cast<double>(u.demand.used_ns) / 1e9,
              static_cast<double>(u.demand.waited_ns) / 1e9};
          for (std::size_t k = 0; k < kSliceMetrics; ++k)
            slices[k] << kSlices[k].name << labels << values[k] << "\n";
        }
        continue;
      }
      waited << kWaited.name << "{" << who << "} " << static_cast<double>(m.wait_ns) / 1e9 << "\n";
      asleep << kAsleep.name << "{" << who << "} " << (m.asleep ? 1 : 0) << "\n";
      for (const auto& u : m.gpus) {
        const node::GpuView* g = gpu_of(r, u.entry);
        const std::string labels = "{" + who + ",gpu_uuid=\"" + (g ? g->uuid : "") + "\"} ";
        const std::uint64_t values[kUses] = {u.lease, u.usage.device, u.usage.host,
                                             u.usage.to_device, u.usage.to_host};
        for (std::size_t k = 0; k < kUses; ++k)
          use[k] << kUse[k].name << labels << values[k] << "\n";
      }
    }
  }
  std::string out;
  const auto put = [&out](const Metric& m, const std::ostringstream& rows) {
    out += std::string("# HELP ") + m.name + " " + m.help + "\n# TYPE " + m.name + " " + m.type +
           "\n" + rows.str();
  };
  put(kUp, up);
  put(kLimit, limit);
  for (std::size_t k = 0; k < kUses; ++k) put(kUse[k], use[k]);
  put(kWaited, waited);
  put(kAsleep, asleep);
  for (std::size_t k = 0; k < kSliceMetrics; ++k) put(kSlices[k], slices[k]);
  return out;
}

}  // namespace allocshim::top
