// allocshim check: validate a policy file and print it normalized, print the embedded default, or
// explain which rule and backend would serve a given allocation.
//
// Exit status: 0 valid, 1 invalid (every error on stderr as FILE:LINE:COLUMN: message: the
// verdict), 2 usage error or unreadable file (as in every command).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "policy/policy.h"
#include "policy/size.h"

namespace allocshim::tool {
namespace {

struct CheckOptions {
  std::string file;
  bool print_default = false;
  std::string explain_size;
  std::string api = "alloc";
  int device = 0;
  std::vector<std::string> callsite;  // frame names, innermost first
  bool no_env = false;
};

void print_errors(const std::vector<policy::Diagnostic>& errors) {
  for (const policy::Diagnostic& d : errors) std::fprintf(stderr, "%s\n", d.str().c_str());
}

bool parse_api(const std::string& s, Api& api) {
  for (Api a : {Api::alloc, Api::pitch, Api::managed, Api::async})
    if (s == api_name(a)) {
      api = a;
      return true;
    }
  return false;
}

// The frames as match() takes them: one name per line.
std::string frames(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : "\n") + n;
  return out;
}

int check(const CheckOptions& o) {
  if (o.print_default) {
    std::fwrite(policy::default_policy_text().data(), 1, policy::default_policy_text().size(),
                stdout);
    return 0;
  }
  // Check the explain arguments first: a usage error should not wait behind policy errors.
  std::uint64_t size = 0;
  Api api = Api::alloc;
  if (!o.explain_size.empty()) {
    std::string error;
    if (!policy::parse_size(o.explain_size, size, error)) {
      std::fprintf(stderr, "allocshim check: bad --explain size \"%s\": %s\n",
                   o.explain_size.c_str(), error.c_str());
      return kExitUsage;
    }
    if (!parse_api(o.api, api)) {
      std::fprintf(stderr, "allocshim check: bad --api \"%s\" (alloc, pitch, managed or async)\n",
                   o.api.c_str());
      return kExitUsage;
    }
  }

  policy::Policy p;
  std::vector<policy::Diagnostic> errors;
  if (o.file.empty()) {
    // The shim's own fallback, so `--explain` works without a file too.
    p = policy::default_policy();
  } else {
    if (!readable_inputs({o.file}, "check")) return kExitUsage;
    // Read here rather than by load_file: a file that cannot be read is a usage error (2), not
    // an invalid policy (1).
    std::string text, error;
    if (!policy::read_policy_file(o.file, text, error)) {
      std::fprintf(stderr, "allocshim check: %s: %s\n", o.file.c_str(), error.c_str());
      return kExitUsage;
    }
    if (!policy::load_string(text, o.file, p, errors)) {
      print_errors(errors);
      return kExitFailed;
    }
  }

  if (!o.no_env) {
    const char* backend_env = std::getenv("ALLOCSHIM_BACKEND");
    const char* conf_env = std::getenv("ALLOCSHIM_CONF");
    if (!policy::apply_overrides(p, backend_env, conf_env, errors)) {
      print_errors(errors);
      return kExitFailed;
    }
    // Say so: the output is not the file alone any more.
    if (backend_env && *backend_env)
      std::fprintf(stderr, "allocshim check: applied ALLOCSHIM_BACKEND=%s\n", backend_env);
    if (conf_env && *conf_env)
      std::fprintf(stderr, "allocshim check: applied ALLOCSHIM_CONF=%s\n", conf_env);
  }

  const std::string out = o.explain_size.empty()
                              ? policy::to_toml(p)
                              : policy::explain(p, size, api, o.device, frames(o.callsite));
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

void add(CLI::App& root, int& exit_code) {
  auto o = std::make_shared<CheckOptions>();
  CLI::App* sub = root.add_subcommand(
      "check",
      "Validate a policy file and print it normalized (exit 1 with every error if invalid)");
  sub->add_option("file", o->file, "Policy file (default: the embedded default policy)");
  sub->add_flag("--print-default", o->print_default, "Print the embedded default policy and exit");
  sub->add_option("--explain", o->explain_size,
                  "Explain which rule and backend serve an allocation of this size (e.g. 300MiB)");
  sub->add_option("--api", o->api, "With --explain: alloc, pitch, managed or async")
      ->capture_default_str();
  sub->add_option("--device", o->device, "With --explain: device id")
      ->capture_default_str()
      ->check(CLI::Range(0, 63));
  sub->add_option("--callsite", o->callsite,
                  "With --explain: a frame name of the call stack (repeat for more frames)");
  sub->add_flag("--no-env", o->no_env, "Ignore ALLOCSHIM_BACKEND and ALLOCSHIM_CONF");
  sub->callback([o, &exit_code] { exit_code = check(*o); });
}

}  // namespace
}  // namespace allocshim::tool

ALLOCSHIM_COMMAND(allocshim::tool::add);
