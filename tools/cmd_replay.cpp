// allocshim replay: run a trace's allocations again against a policy, on the GPU or simulated.
#include <dlfcn.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "driver/real_driver.h"
#include "policy/policy.h"
#include "trace/load.h"
#include "trace/replay.h"
#include "trace/simulate.h"

namespace allocshim::tool {
namespace {

struct ReplayArgs {
  std::vector<std::string> traces;
  std::string policy, simulate;
  int devices = 1;
  bool json = false;
};

bool parse_size(const std::string& s, std::uint64_t& out) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v <= 0) return false;
  const std::string unit = end;
  const std::pair<const char*, double> units[] = {{"", 1},        {"B", 1},          {"KiB", 1024.0},
                                                  {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1024.0 * (1 << 30)},
                                                  {"K", 1024.0},  {"M", 1 << 20},    {"G", 1 << 30}};
  for (const auto& [name, mult] : units)
    if (unit == name) return out = static_cast<std::uint64_t>(v * mult), true;
  return false;
}

int replay(const ReplayArgs& args) {
  policy::Policy p = policy::default_policy();
  if (!args.policy.empty()) {
    std::vector<policy::Diagnostic> diags;
    if (!policy::load_file(args.policy, p, diags)) {
      for (const auto& d : diags) std::fprintf(stderr, "%s\n", d.str().c_str());
      return 2;
    }
  }
  std::vector<trace::Trace> traces;
  std::string error;
  if (!trace::load_traces(args.traces, traces, error)) {
    std::fprintf(stderr, "allocshim replay: %s\n", error.c_str());
    return 1;
  }
  trace::ReplayResult r;
  if (!args.simulate.empty()) {
    std::uint64_t capacity = 0;
    if (!parse_size(args.simulate, capacity)) {
      std::fprintf(stderr, "allocshim replay: --simulate wants a size such as 80GiB, not \"%s\"\n",
                   args.simulate.c_str());
      return 2;
    }
    std::unique_ptr<trace::SimulatedDevice> sim = trace::make_simulated_device(capacity, args.devices, error);
    if (!sim) {
      std::fprintf(stderr, "allocshim replay: %s\n", error.c_str());
      return 1;
    }
    r = trace::replay(traces, sim->driver(), p);
  } else {
    const Driver* d = load_real_driver([](void* h, const char* n) { return dlsym(h, n); }, true, error);
    if (!d) {
      std::fprintf(stderr, "allocshim replay: no CUDA driver (%s); use --simulate SIZE to replay on a simulated device\n",
                   error.c_str());
      return 1;
    }
    r = trace::replay(traces, *d, p);
  }
  if (args.json) trace::write_replay_json(r, std::cout);
  else trace::write_replay_text(r, std::cout);
  return 0;
}

void add(CLI::App& root, int& exit_code) {
  auto args = std::make_shared<ReplayArgs>();
  CLI::App* sub = root.add_subcommand("replay", "Replay traced allocations against a policy (GPU or simulated)");
  sub->add_option("traces", args->traces, "Trace files")->required();
  sub->add_option("-p,--policy", args->policy, "Policy file (default: the built-in policy)");
  sub->add_option("--simulate", args->simulate, "Replay on a simulated device of this capacity (e.g. 80GiB)");
  sub->add_option("--devices", args->devices, "Simulated devices");
  sub->add_flag("--json", args->json, "Print the results as JSON");
  sub->footer("Example: allocshim replay trace.bin --policy pool.toml --simulate 80GiB");
  sub->callback([args, &exit_code] { exit_code = replay(*args); });
}

}  // namespace
}  // namespace allocshim::tool

ALLOCSHIM_COMMAND(allocshim::tool::add);
