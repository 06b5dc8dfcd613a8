// Loading traces for the commands (see load.h).
#include "trace/load.h"

#include <unistd.h>

#include <cstdio>

namespace allocshim::trace {

bool load_traces(const std::vector<std::string>& paths, std::vector<Trace>& out, std::string& error) {
  const bool tty = isatty(2);
  for (const std::string& path : paths) {
    Trace t;
    int last = -1;
    Progress progress;
    if (tty) {
      progress = [&](std::size_t done, std::size_t total) {
        const int pct = total ? static_cast<int>(done * 100 / total) : 100;
        if (pct == last) return;
        last = pct;
        std::fprintf(stderr, "\rreading %s: %d%%", path.c_str(), pct);
      };
    }
    const bool ok = read_trace(path, t, error, progress);
    if (tty && last >= 0) std::fprintf(stderr, "\r\033[K");
    if (!ok) return false;
    out.push_back(std::move(t));
  }
  return true;
}

std::unique_ptr<Analysis> load_and_analyze(const std::vector<std::string>& paths,
                                           const AnalyzeOptions& options, std::string& error) {
  std::vector<Trace> traces;
  if (!load_traces(paths, traces, error)) return nullptr;
  if (isatty(2)) std::fprintf(stderr, "symbolizing and analyzing...");
  auto a = analyze(std::move(traces), options);
  if (isatty(2)) std::fprintf(stderr, "\r\033[K");
  return a;
}

}  // namespace allocshim::trace
