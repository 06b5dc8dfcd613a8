// allocshim report --step (analysis/step_view.h).
#include "analysis/step_view.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/human.h"
#include "policy/policy.h"

namespace allocshim::analysis {
namespace {

using Json = nlohmann::json;

// The fields of one entry of migration.allocations (shim/core/summary.cpp, json_movable).
struct Entry {
  int device = 0;
  std::uint64_t base = 0, device_bytes = 0, host_bytes = 0, seq = 0;
  std::uint64_t uses = 0, first = 0, last = 0, idle_from = 0, idle_len = 0;
  std::string place;
};

bool parse_entry(const Json& a, Entry& e) {
  if (!a.is_array() || a.size() < 17 || !a[16].is_string()) return false;
  e.device = a[0].get<int>();
  e.base = a[1].get<std::uint64_t>();
  e.device_bytes = a[2].get<std::uint64_t>();
  e.host_bytes = a[3].get<std::uint64_t>();
  e.seq = a[4].get<std::uint64_t>();
  e.uses = a[11].get<std::uint64_t>();
  e.first = a[12].get<std::uint64_t>();
  e.last = a[13].get<std::uint64_t>();
  e.idle_from = a[14].get<std::uint64_t>();
  e.idle_len = a[15].get<std::uint64_t>();
  e.place = a[16].get<std::string>();
  return true;
}

void write_header(const Json& step, std::ostream& out) {
  const std::uint64_t submissions = step.value("submissions", std::uint64_t{0});
  char line[320];
  std::snprintf(line, sizeof line,
                "learned step: %" PRIu64 " submissions, %" PRIu64
                " synchronizations by the program, %.1f ms as submitted; from %" PRIu64
                " steps (%.1f%% repeated), recorded by epoch %" PRIu64 "\n",
                submissions, step.value("synchronizations", std::uint64_t{0}),
                static_cast<double>(step.value("submitted_ns", std::uint64_t{0})) / 1e6,
                step.value("steps_recorded", std::uint64_t{0}),
                static_cast<double>(step.value("match_permille", std::uint64_t{0})) / 10.0,
                step.value("epoch", std::uint64_t{0}));
  out << line;
}

void write_rows(const std::vector<Entry>& named, std::uint64_t submissions, std::ostream& out) {
  out << "place over the step, per allocation the step names (# used there on the device, h used "
         "there with part of it on the host, . not used there):\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-3s %-18s %10s %10s %9s %7s  %s\n", "dev", "base", "size",
                "on host", "uses/step", "idle", "step start -> end");
  out << line;
  for (const Entry& e : named) {
    const double idle =
        submissions ? 100.0 * static_cast<double>(e.idle_len) / static_cast<double>(submissions)
                    : 0.0;
    std::snprintf(line, sizeof line, "%-3d 0x%-16" PRIx64 " %10s %10s %9" PRIu64 " %6.0f%%  |%s|\n",
                  e.device, e.base, human_bytes(e.device_bytes + e.host_bytes).c_str(),
                  human_bytes(e.host_bytes).c_str(), e.uses, idle, e.place.c_str());
    out << line;
  }
}

}  // namespace

bool write_step_view(const std::string& path, std::ostream& out, std::string& error) {
  // Read as policies are: a FIFO without a writer is not waited on.
  std::string text;
  if (!policy::read_policy_file(path, text, error)) {
    error = path + ": " + error;
    return false;
  }
  Json stats;
  try {
    stats = Json::parse(text);
  } catch (const Json::exception& e) {
    error = path + ": not a stats file (" + e.what() + ")";
    return false;
  }
  if (!stats.is_object() || !stats.contains("migration") || !stats["migration"].is_object()) {
    error = path + ": no \"migration\" section (the run had no budget whose memory can move)";
    return false;
  }
  const Json& m = stats["migration"];
  const Json step = m.value("step", Json::object());
  if (step.value("epoch", std::uint64_t{0}) == 0) {
    out << "no step learned: no recording of the program's submissions ended\n";
    return true;
  }
  if (!step.value("repeats", false)) {
    out << "no step learned: nothing repeats in the recording that ended by epoch "
        << step.value("epoch", std::uint64_t{0}) << "\n";
    return true;
  }
  write_header(step, out);
  std::vector<Entry> named;
  std::size_t others = 0;
  for (const Json& a : m.value("allocations", Json::array())) {
    Entry e;
    bool ok = false;
    try {
      ok = parse_entry(a, e);
    } catch (const Json::exception&) {}
    if (!ok) {
      error = path + ": an allocation entry of an older or damaged stats file";
      return false;
    }
    if (e.uses > 0)
      named.push_back(e);
    else
      ++others;
  }
  std::sort(named.begin(), named.end(),
            [](const Entry& x, const Entry& y) { return x.seq < y.seq; });
  write_rows(named, step.value("submissions", std::uint64_t{0}), out);
  out << others << " movable allocations not named in the step\n";
  return true;
}

}  // namespace allocshim::analysis
