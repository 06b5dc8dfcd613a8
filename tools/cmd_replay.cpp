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
#include "policy/size.h"
#include "analysis/load.h"
#include "analysis/replay.h"
#include "sim/simulated_device.h"

namespace allocshim::tool {
namespace {

struct ReplayArgs {
  std::vector<std::string> traces;
  std::string policy, simulate;
  int devices = 1;
  std::size_t max_live = analysis::Replayer::kMaxLive;
  bool json = false;
};

int replay(const ReplayArgs& args) {
  std::string error;
  std::uint64_t capacity = 0;
  if (!args.simulate.empty() &&
      (!policy::parse_size(args.simulate, capacity, error) || capacity == 0)) {
    std::fprintf(stderr,
                 "allocshim replay: --simulate wants a device size such as 80GiB, not \"%s\"%s%s\n",
                 args.simulate.c_str(), error.empty() ? "" : ": ", error.c_str());
    return kExitUsage;
  }
  // A policy passed to a command is one of its arguments: an invalid one is a usage error here
  // (`allocshim check` alone answers 1 for it, that being its verdict).
  policy::Policy p = policy::default_policy();
  if (!args.policy.empty()) {
    std::vector<policy::Diagnostic> diags;
    if (!policy::load_file(args.policy, p, diags)) {
      for (const auto& d : diags) std::fprintf(stderr, "%s\n", d.str().c_str());
      return kExitUsage;
    }
  }
  if (!readable_inputs(args.traces, "replay")) return kExitUsage;
  // Streamed, as for report: the events of one stretch of time are held, never the whole trace.
  analysis::EventStream stream;
  if (!stream.open(args.traces, error)) {
    std::fprintf(stderr, "allocshim replay: %s\n", error.c_str());
    return kExitFailed;
  }
  std::unique_ptr<sim::SimulatedDevice> simulated;
  const Driver* driver = nullptr;
  if (!args.simulate.empty()) {
    simulated = std::make_unique<sim::SimulatedDevice>(sim::SimConfig{args.devices, capacity});
    driver = &simulated->driver();
  } else {
    driver = load_real_driver([](void* h, const char* n) { return dlsym(h, n); }, true, error);
    if (!driver) {
      std::fprintf(
          stderr,
          "allocshim replay: no CUDA driver (%s); use --simulate SIZE to replay on a simulated device\n",
          error.c_str());
      return kExitFailed;
    }
  }
  analysis::Replayer replayer(*driver, p, args.max_live);
  if (!stream.run([&](const analysis::Event& e) { replayer.step(e); }, error)) {
    std::fprintf(stderr, "allocshim replay: %s\n", error.c_str());
    return kExitFailed;
  }
  if (!replayer.stopped().empty()) {
    const std::uint32_t at =
        replayer.stopped_process();  // the trace's position among the arguments
    std::fprintf(stderr, "allocshim replay: %s: %s\n",
                 at < args.traces.size() ? args.traces[at].c_str() : "?",
                 replayer.stopped().c_str());
    replayer.finish();
    return kExitFailed;
  }
  const analysis::ReplayResult r = replayer.finish();
  for (const std::string& w : stream.warnings())
    std::fprintf(stderr, "allocshim replay: warning: %s\n", w.c_str());
  if (args.json)
    analysis::write_replay_json(r, std::cout);
  else
    analysis::write_replay_text(r, std::cout);
  return 0;
}

void add(CLI::App& root, int& exit_code) {
  auto args = std::make_shared<ReplayArgs>();
  CLI::App* sub = root.add_subcommand(
      "replay", "Replay traced allocations against a policy (GPU or simulated)");
  sub->add_option("traces", args->traces, "Trace files")->required();
  sub->add_option("-p,--policy", args->policy, "Policy file (default: the built-in policy)");
  sub->add_option("--simulate", args->simulate,
                  "Replay on a simulated device of this capacity (e.g. 80GiB)");
  sub->add_option("--devices", args->devices, "Simulated devices")
      ->check(CLI::Range(1, static_cast<int>(kMaxDevices)));
  sub->add_option(
         "--max-live", args->max_live,
         "Stop with an error past this many allocations live at once (each is held in memory)")
      ->check(CLI::PositiveNumber);
  sub->add_flag("--json", args->json, "Print the results as JSON");
  sub->footer("Example: allocshim replay trace.bin --policy pool.toml --simulate 80GiB");
  sub->callback([args, &exit_code] { exit_code = replay(*args); });
}

}  // namespace
}  // namespace allocshim::tool

ALLOCSHIM_COMMAND(allocshim::tool::add);
