// allocshim ctl PID sleep|wake|status: asks a process under the shim to put its device memory to
// sleep on the host, to take it back, or where it stands (docs/operators.md, "Sleep and wake").
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "command.h"
#include "ctl/client.h"

namespace allocshim::tool {
namespace {

struct CtlArgs {
  int pid = 0;
  std::string action;
  double timeout_s = 600;
  bool json = false;
};

int ctl(const CtlArgs& args) {
  const ctl::Reply r = ctl::ask(args.pid, args.action, static_cast<int>(args.timeout_s * 1000.0));
  if (args.json) {
    nlohmann::json j = {{"pid", args.pid}, {"request", args.action}, {"ok", r.ok}};
    if (!r.ok) j["error"] = r.error;
    for (const auto& [k, v] : r.fields) {
      if (k == "reason") continue;
      const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
      j[k] = digits ? nlohmann::json(std::stoull(v)) : nlohmann::json(v);
    }
    std::cout << j.dump() << "\n";
  } else {
    (r.ok ? std::cout : std::cerr) << ctl::describe(args.pid, args.action, r) << "\n";
  }
  return r.ok ? 0 : kExitFailed;
}

void add(CLI::App& root, int& exit_code) {
  auto args = std::make_shared<CtlArgs>();
  CLI::App* sub = root.add_subcommand(
      "ctl", "Put a process's device memory to sleep on the host, wake it, or show where it is");
  sub->add_option("pid", args->pid, "The process (as this shell numbers it)")
      ->required()
      ->check(CLI::PositiveNumber);
  sub->add_option("action", args->action,
                  "sleep: move its device memory to the host and hold its launches; wake: bring "
                  "it back; status: where it is")
      ->required()
      ->check(CLI::IsMember({"sleep", "wake", "status"}));
  sub->add_option("--timeout", args->timeout_s, "Seconds to wait for the answer (default 600)")
      ->check(CLI::Range(0.1, 86400.0));
  sub->add_flag("--json", args->json, "One JSON object instead of a line");
  sub->footer("Only the process's own user and root may. Example: allocshim ctl 4242 sleep");
  sub->callback([args, &exit_code] { exit_code = ctl(*args); });
}

}  // namespace
}  // namespace allocshim::tool

ALLOCSHIM_COMMAND(allocshim::tool::add);
