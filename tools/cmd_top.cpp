// allocshim top: who holds what of each shared budget, live (docs/operators.md).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <httplib.h>

#include "command.h"
#include "node/node_region.h"
#include "top/view.h"

namespace allocshim::tool {
namespace {

struct TopArgs {
  std::string dir, textfile, listen;
  int interval_ms = 1000;
  bool once = false, json = false, quiet = false;
};

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

// Writes the metrics to DIR/allocshim.prom through a new file renamed over it, so that the
// node exporter's textfile collector never reads half a file.
bool write_textfile(const std::string& dir, const std::string& text, std::string& error) {
  std::string temp = dir + "/.allocshim.prom.XXXXXX";
  const int fd = mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0) {
    error = dir + ": cannot create a file there (" + std::strerror(errno) + ")";
    return false;
  }
  bool ok = fchmod(fd, 0644) == 0;  // the exporter reads it, as another user
  for (std::size_t at = 0; ok && at < text.size();) {
    const ssize_t n = write(fd, text.data() + at, text.size() - at);
    ok = n > 0;
    at += n > 0 ? static_cast<std::size_t>(n) : 0;
  }
  ok = close(fd) == 0 && ok;
  if (ok) ok = rename(temp.c_str(), (dir + "/allocshim.prom").c_str()) == 0;
  if (!ok) {
    error = dir + "/allocshim.prom: cannot write it (" + std::strerror(errno) + ")";
    unlink(temp.c_str());
  }
  return ok;
}

// "HOST:PORT" (HOST may be empty for every address, or [v6]).
bool split_address(const std::string& a, std::string& host, int& port) {
  const std::size_t colon = a.rfind(':');
  if (colon == std::string::npos) return false;
  host = a.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty()) host = "0.0.0.0";
  try {
    std::size_t used = 0;
    port = std::stoi(a.substr(colon + 1), &used);
    return used == a.size() - colon - 1 && port >= 0 && port <= 65535;
  } catch (...) {
    return false;
  }
}

int top(const TopArgs& args) {
  const std::string dir = args.dir.empty() ? node::share_dir() : args.dir;
  if (args.once && !args.listen.empty()) {
    std::fprintf(stderr,
                 "allocshim top: --listen serves until stopped; it does not go with --once\n");
    return kExitUsage;
  }
  std::string host;
  int port = 0;
  if (!args.listen.empty() && !split_address(args.listen, host, port)) {
    std::fprintf(stderr,
                 "allocshim top: --listen wants HOST:PORT (e.g. 127.0.0.1:9402), not \"%s\"\n",
                 args.listen.c_str());
    return kExitUsage;
  }
  struct stat st {};
  if (!args.textfile.empty() && (stat(args.textfile.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))) {
    std::fprintf(stderr, "allocshim top: --textfile %s: not a directory\n", args.textfile.c_str());
    return kExitUsage;
  }
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);

  std::mutex metrics_mutex;
  std::string metrics;
  httplib::Server server;
  std::thread serving;
  if (!args.listen.empty()) {
    server.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
      std::lock_guard lock(metrics_mutex);
      res.set_content(metrics, "text/plain; version=0.0.4; charset=utf-8");
    });
    if (port == 0)
      port = server.bind_to_any_port(host);
    else if (!server.bind_to_port(host, port))
      port = -1;
    if (port < 0) {
      std::fprintf(stderr, "allocshim top: --listen %s: cannot listen there\n",
                   args.listen.c_str());
      return kExitFailed;
    }
    std::fprintf(stderr, "allocshim top: metrics on http://%s:%d/metrics\n", host.c_str(), port);
    serving = std::thread([&] { server.listen_after_bind(); });
  }

  int status = 0;
  std::unique_ptr<top::Snapshot> previous;
  for (bool first = true; !g_stop.load(); first = false) {
    if (!first) {
      for (int waited = 0; waited < args.interval_ms && !g_stop.load(); waited += 50)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (g_stop.load()) break;
    }
    auto now = std::make_unique<top::Snapshot>(top::take(dir, previous.get()));
    const std::string text = top::to_prometheus(*now);
    {
      std::lock_guard lock(metrics_mutex);
      metrics = text;
    }
    std::string error;
    if (!args.textfile.empty() && !write_textfile(args.textfile, text, error)) {
      std::fprintf(stderr, "allocshim top: %s\n", error.c_str());
      status = kExitFailed;
      break;
    }
    if (args.json) {
      std::cout << top::to_json(*now).dump() << std::endl;
    } else if (!args.quiet) {
      if (!args.once && isatty(STDOUT_FILENO))
        std::cout << "\033[H\033[2J";  // a screen per refresh
      top::write_table(*now, std::cout);
      std::cout << std::flush;
    }
    previous = std::move(now);
    if (args.once) break;
  }
  if (serving.joinable()) {
    server.stop();
    serving.join();
  }
  return status;
}

void add(CLI::App& root, int& exit_code) {
  auto args = std::make_shared<TopArgs>();
  CLI::App* sub =
      root.add_subcommand("top", "Show every process's share of each shared budget, live");
  sub->add_option("--dir", args->dir,
                  "Where the regions are (default: ALLOCSHIM_SHARE_DIR, else /dev/shm)");
  sub->add_option("--interval", args->interval_ms, "Milliseconds between refreshes (default 1000)")
      ->check(CLI::Range(50, 3600000));
  sub->add_flag("--once", args->once, "One snapshot, then exit (move rates need two: null)");
  sub->add_flag("--json", args->json, "JSON, one line per snapshot");
  sub->add_flag("--quiet", args->quiet, "No table (with --textfile or --listen)");
  sub->add_option(
      "--textfile", args->textfile,
      "Also write DIR/allocshim.prom (Prometheus text, for node-exporter's textfile collector)");
  sub->add_option("--listen", args->listen,
                  "Also serve the metrics at http://HOST:PORT/metrics (PORT 0: any)");
  sub->footer("Example: allocshim top --once --json");
  sub->callback([args, &exit_code] { exit_code = top(*args); });
}

}  // namespace
}  // namespace allocshim::tool

ALLOCSHIM_COMMAND(allocshim::tool::add);
