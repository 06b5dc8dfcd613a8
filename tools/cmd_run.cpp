// allocshim run: start a program with the shim preloaded.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "policy/policy.h"

namespace allocshim::tool {
namespace {

struct RunOptions {
  bool quiet = false;
  bool watch = false;
  std::string policy, trace, stats, backend, conf;
  std::vector<std::string> command;
};

std::string absolute(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) ? std::string(buf) : path;
}

// Runs `argv` and returns its exit status; a child killed by a signal is reported the shell's way
// (128 + signal) after the same signal has been re-raised here, so callers see what they would
// have seen without allocshim.
int run_child(std::vector<std::string>& command) {
  std::vector<char*> argv;
  for (auto& a : command) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    std::fprintf(stderr, "allocshim run: fork failed: %s\n", std::strerror(errno));
    return kExitFailed;
  }
  if (pid == 0) {
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "allocshim run: cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
  }
  // Like system(): the terminal's SIGINT/SIGQUIT reach the child; the parent waits for its verdict.
  signal(SIGINT, SIG_IGN);
  signal(SIGQUIT, SIG_IGN);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    signal(sig, SIG_DFL);
    raise(sig);
    return 128 + sig;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

// The value the shim will read: the option when given, else what the environment already holds
// (empty counts as unset, as in the shim).
const char* effective(const std::string& option, const char* variable) {
  if (!option.empty()) return option.c_str();
  const char* v = std::getenv(variable);
  return v && *v ? v : nullptr;
}

// Builds the policy the shim will build in the program (policy::load_file, then
// policy::apply_overrides: the same library, the same order), so that a mistake stops here with
// every error located, before the program starts, instead of being logged by the shim while the
// program runs on a fallback.
bool valid_policy(const RunOptions& o) {
  std::vector<policy::Diagnostic> errors;
  policy::Policy p = policy::default_policy();
  const char* path = effective(o.policy, "ALLOCSHIM_POLICY");
  struct stat st;
  if (path && stat(path, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
    // The program reads its policy again, and so does each child it starts: a stream read here
    // would be gone by then (or waited on there). Refused before anything is read.
    std::fprintf(stderr,
                 "allocshim run: %s is a pipe or FIFO: the program reads its policy itself, so it "
                 "must be a file; not starting %s\n",
                 path, o.command[0].c_str());
    return false;
  }
  const bool file_ok = !path || policy::load_file(path, p, errors);
  if (file_ok)
    policy::apply_overrides(p, effective(o.backend, "ALLOCSHIM_BACKEND"),
                            effective(o.conf, "ALLOCSHIM_CONF"), errors);
  if (errors.empty()) return true;
  for (policy::Diagnostic& e : errors) {
    // Locate what the user typed: the option, where one was given, rather than the variable.
    if (e.file == "ALLOCSHIM_BACKEND" && !o.backend.empty()) e.file = "--backend";
    if (e.file == "ALLOCSHIM_CONF" && !o.conf.empty()) e.file = "--conf";
    std::fprintf(stderr, "%s\n", e.str().c_str());
  }
  std::fprintf(stderr, "allocshim run: %s %s; not starting %s\n",
               file_ok ? "invalid" : "invalid policy", file_ok ? "overrides" : path,
               o.command[0].c_str());
  return false;
}

int run(RunOptions& o) {
  if (o.command.empty()) {
    std::fprintf(
        stderr,
        "allocshim run: no command given (usage: allocshim run [OPTIONS] -- CMD ARGS...)\n");
    return kExitUsage;
  }
  // The option parser hands an option it does not know over as the command: say what it is.
  if (o.command[0].size() > 1 && o.command[0][0] == '-') {
    std::fprintf(stderr, "allocshim run: unknown option %s (see allocshim run --help)\n",
                 o.command[0].c_str());
    return kExitUsage;
  }
  const std::string lib = library_path();
  struct stat st;
  if (stat(lib.c_str(), &st) != 0) {
    std::fprintf(stderr, "allocshim run: the shim library is missing: %s\n", lib.c_str());
    return kExitUsage;
  }
  if (!valid_policy(o)) return kExitUsage;
  if (!o.policy.empty()) setenv("ALLOCSHIM_POLICY", absolute(o.policy).c_str(), 1);
  // Prepend, so the shim is searched before whatever else the user preloads; children inherit it.
  std::string preload = absolute(lib);
  if (const char* old = std::getenv("LD_PRELOAD"); old && *old) preload += std::string(":") + old;
  setenv("LD_PRELOAD", preload.c_str(), 1);
  if (o.quiet) setenv("ALLOCSHIM_QUIET", "1", 1);
  if (o.watch) setenv("ALLOCSHIM_WATCH", "1", 1);
  if (!o.trace.empty()) setenv("ALLOCSHIM_TRACE", o.trace.c_str(), 1);
  if (!o.stats.empty()) setenv("ALLOCSHIM_STATS", o.stats.c_str(), 1);
  if (!o.backend.empty()) setenv("ALLOCSHIM_BACKEND", o.backend.c_str(), 1);
  if (!o.conf.empty()) setenv("ALLOCSHIM_CONF", o.conf.c_str(), 1);
  return run_child(o.command);
}

void add(CLI::App& root, int& exit_code) {
  auto opts = std::make_shared<RunOptions>();
  CLI::App* sub = root.add_subcommand("run", "Run a command with liballocshim.so preloaded");
  sub->add_flag("-q,--quiet", opts->quiet, "Do not print the exit summary");
  sub->add_option("-p,--policy", opts->policy, "Policy file (validated before the command starts)");
  sub->add_option("-t,--trace", opts->trace, "Record a trace to FILE (%p becomes the pid)");
  sub->add_option("--stats", opts->stats,
                  "Write the statistics as JSON to FILE at exit (%p becomes the pid)");
  sub->add_option("-b,--backend", opts->backend,
                  "Serve everything from this backend kind or name (ALLOCSHIM_BACKEND)");
  sub->add_option("-c,--conf", opts->conf,
                  "Policy overrides, e.g. \"free_sync=none,budget.device=8GiB\" (ALLOCSHIM_CONF)");
  sub->add_flag("-w,--watch", opts->watch, "Reload the policy file when it changes");
  // Everything from the first non-option argument (or after "--") is the command, untouched.
  sub->prefix_command();
  sub->footer("Example: allocshim run --policy pool.toml -- ./train --epochs 3");
  sub->callback([opts, sub, &exit_code] {
    opts->command = sub->remaining();
    for (const auto& arg : trailing_arguments()) opts->command.push_back(arg);
    exit_code = run(*opts);
  });
}

}  // namespace
}  // namespace allocshim::tool

ALLOCSHIM_COMMAND(allocshim::tool::add);
