// allocshim: run programs under the shim, check policies, diagnose the machine, read traces.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "allocshim_version.h"  // ALLOCSHIM_VERSION, with the commit (tools/package/version.cmake)
#include "command.h"

namespace allocshim::tool {
namespace {
std::vector<std::string> g_trailing;

std::vector<AddCommand>& commands() {
  static std::vector<AddCommand> list;
  return list;
}
}  // namespace

const std::vector<std::string>& trailing_arguments() { return g_trailing; }

CommandRegistrar::CommandRegistrar(AddCommand add) { commands().push_back(add); }

std::string executable_dir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<std::size_t>(n));
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool readable_inputs(const std::vector<std::string>& paths, const char* command) {
  for (const std::string& path : paths) {
    // Checked here, before any reader sees it: a stream opened on a directory "opens" and then
    // throws from its first read. A FIFO is not opened here: opening it would wait for a writer,
    // and closing it again would make its writer fail.
    struct stat st;
    const char* why = nullptr;
    if (stat(path.c_str(), &st) != 0) {
      why = std::strerror(errno);
    } else if (S_ISDIR(st.st_mode)) {
      why = "is a directory, not a file";
    } else if (S_ISFIFO(st.st_mode)) {
      if (access(path.c_str(), R_OK) != 0) why = std::strerror(errno);
    } else {
      const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
      if (fd < 0)
        why = std::strerror(errno);
      else
        close(fd);
    }
    if (why) {
      std::fprintf(stderr, "allocshim %s: %s: %s\n", command, path.c_str(), why);
      return false;
    }
  }
  return true;
}

std::string library_path() {
  if (const char* env = std::getenv("ALLOCSHIM_LIBRARY"); env && *env) return env;
  return executable_dir() + "/../lib/liballocshim.so";
}

}  // namespace allocshim::tool

int main(int argc, char** argv) {
  CLI::App app{
      "allocshim: serve an unmodified CUDA program's device allocations from the backend a policy picks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("allocshim ") + ALLOCSHIM_VERSION);
  int exit_code = 0;
  for (auto add : allocshim::tool::commands()) add(app, exit_code);
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) != "--") continue;
    allocshim::tool::g_trailing.assign(argv + i + 1, argv + argc);
    argc = i;
    break;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : allocshim::tool::kExitUsage;
  } catch (const std::exception& e) {
    // The commands check their inputs; whatever still throws (out of memory, an I/O error in the
    // middle of a read) ends with a message and a status, never an abort.
    std::fprintf(stderr, "allocshim: %s\n", e.what());
    return allocshim::tool::kExitFailed;
  }
  return exit_code;
}
