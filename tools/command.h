// Subcommands of the `allocshim` tool register themselves here: each tools/cmd_*.cpp file defines
// one command with ALLOCSHIM_COMMAND, so adding a command touches no shared file.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace allocshim::tool {

// Exit statuses, the same for every command (README.md, "The allocshim command"). `run` returns
// its program's status once the program has started.
inline constexpr int kExitFailed = 1;  // inputs read but invalid, or the work itself failed
inline constexpr int kExitUsage = 2;   // bad command line, or an input that cannot be read

// Adds a subcommand to `root`. Its callback stores the command's exit status in `exit_code`.
using AddCommand = void (*)(CLI::App& root, int& exit_code);

struct CommandRegistrar {
  explicit CommandRegistrar(AddCommand add);
};

// The arguments after the first "--" on the command line, which main() keeps away from the option
// parser so that a wrapped command's own options are passed on untouched.
const std::vector<std::string>& trailing_arguments();

// True when every path names a file this process can read (not a directory); otherwise says why
// on stderr, as "allocshim COMMAND: PATH: reason", and returns false (then exit kExitUsage).
bool readable_inputs(const std::vector<std::string>& paths, const char* command);

// Path of liballocshim.so as installed beside this executable (<dir>/../lib/liballocshim.so).
std::string library_path();
// Path of this executable's directory.
std::string executable_dir();

}  // namespace allocshim::tool

#define ALLOCSHIM_COMMAND_CONCAT2(a, b) a##b
#define ALLOCSHIM_COMMAND_CONCAT(a, b) ALLOCSHIM_COMMAND_CONCAT2(a, b)
#define ALLOCSHIM_COMMAND(add_fn) \
  static ::allocshim::tool::CommandRegistrar ALLOCSHIM_COMMAND_CONCAT(registrar_, __LINE__)(add_fn)
