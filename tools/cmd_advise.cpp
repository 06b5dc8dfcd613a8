// allocshim advise: draft a policy from a trace, each rule commented with its evidence.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "policy/policy.h"
#include "analysis/advise.h"
#include "analysis/load.h"

namespace allocshim::tool {
namespace {

struct AdviseArgs {
  std::vector<std::string> traces;
  std::string output;
};

int advise(const AdviseArgs& args) {
  if (!readable_inputs(args.traces, "advise")) return kExitUsage;
  std::string error;
  std::unique_ptr<analysis::Analysis> a = analysis::load_and_analyze(args.traces, {}, error);
  if (!a) {
    std::fprintf(stderr, "allocshim advise: %s\n", error.c_str());
    return kExitFailed;
  }
  const std::string toml = analysis::advise(*a);
  // What we write must be a policy the shim accepts: check it the way `allocshim check` does.
  policy::Policy p;
  std::vector<policy::Diagnostic> diags;
  if (!policy::load_string(toml, "<advice>", p, diags)) {
    for (const auto& d : diags)
      std::fprintf(stderr, "allocshim advise: internal error: %s\n", d.str().c_str());
    return kExitFailed;
  }
  if (args.output.empty() || args.output == "-") {
    std::cout << toml;
    return 0;
  }
  std::ofstream out(args.output);
  out << toml;
  out.close();
  if (!out) {
    std::fprintf(stderr, "allocshim advise: cannot write %s\n", args.output.c_str());
    return kExitFailed;
  }
  return 0;
}

void add(CLI::App& root, int& exit_code) {
  auto args = std::make_shared<AdviseArgs>();
  CLI::App* sub =
      root.add_subcommand("advise", "Draft a policy from traces, with the evidence for each rule");
  sub->add_option("traces", args->traces, "Trace files")->required();
  sub->add_option("-o,--output", args->output,
                  "Write the policy to FILE instead of standard output");
  sub->footer("Example: allocshim advise trace.bin -o policy.toml && allocshim check policy.toml");
  sub->callback([args, &exit_code] { exit_code = advise(*args); });
}

}  // namespace
}  // namespace allocshim::tool

ALLOCSHIM_COMMAND(allocshim::tool::add);
