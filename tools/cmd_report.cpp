// allocshim report: symbolize one or more traces and print the allocation hot spots.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "analysis/load.h"
#include "analysis/report.h"
#include "analysis/step_view.h"

namespace allocshim::tool {
namespace {

struct ReportArgs {
  std::vector<std::string> traces;
  std::string step;  // a stats file: print its learned step instead of a trace report
  analysis::SymbolOptions symbols;
  std::vector<std::string> formats, outputs;  // paired in order
  std::string sort;
  std::size_t top = 10, frames = 6;
  bool runtime_frames = false, native_frames = false;
};

// Writes one output; "-" or nothing: standard output.
bool write_one(analysis::Format format, const std::string& path, const analysis::Analysis& a,
               const analysis::ReportOptions& o) {
  if (path.empty() || path == "-") {
    analysis::write_report(format, a, o, std::cout);
    std::cout.flush();
    return static_cast<bool>(std::cout);
  }
  std::ofstream out(path, std::ios::binary);
  analysis::write_report(format, a, o, out);
  out.close();
  if (!out) std::fprintf(stderr, "allocshim report: cannot write %s\n", path.c_str());
  return static_cast<bool>(out);
}

int step_view(const ReportArgs& args) {
  if (!args.traces.empty()) {
    std::fprintf(stderr, "allocshim report: --step reads a stats file, not traces\n");
    return kExitUsage;
  }
  if (!readable_inputs({args.step}, "report")) return kExitUsage;
  std::string error;
  if (!analysis::write_step_view(args.step, std::cout, error)) {
    std::fprintf(stderr, "allocshim report: %s\n", error.c_str());
    return kExitFailed;
  }
  return 0;
}

int report(const ReportArgs& args) {
  if (!args.step.empty()) return step_view(args);
  if (args.traces.empty()) {
    std::fprintf(stderr, "allocshim report: traces is required (or --step STATS)\n");
    return kExitUsage;
  }
  // Every output comes from one reading of the traces: --format and -o pair up in order.
  std::vector<std::string> formats = args.formats;
  if (formats.empty()) formats.assign(std::max<std::size_t>(args.outputs.size(), 1), "table");
  if (formats.size() > 1 && formats.size() != args.outputs.size()) {
    std::fprintf(stderr,
                 "allocshim report: %zu formats and %zu outputs: give one -o FILE per --format\n",
                 formats.size(), args.outputs.size());
    return kExitUsage;
  }
  if (formats.size() == 1 && args.outputs.size() > 1) {
    std::fprintf(stderr,
                 "allocshim report: %zu outputs for one format: give one --format per -o FILE\n",
                 args.outputs.size());
    return kExitUsage;
  }
  std::vector<analysis::Format> parsed(formats.size());
  for (std::size_t i = 0; i < formats.size(); ++i)
    if (!analysis::parse_format(formats[i], parsed[i])) {
      std::fprintf(
          stderr,
          "allocshim report: unknown format \"%s\" (table, collapsed, speedscope, perfetto, json, html, memory-snapshot)\n",
          formats[i].c_str());
      return kExitUsage;
    }
  analysis::ReportOptions o;
  o.top = args.top;
  o.frames = args.frames;
  if (!args.sort.empty()) {
    if (!analysis::parse_metric(args.sort, o.sort)) {
      std::fprintf(
          stderr, "allocshim report: unknown metric \"%s\" (bytes, calls, peak, time, temporary)\n",
          args.sort.c_str());
      return kExitUsage;
    }
    o.sorted = true;
  }
  if (!readable_inputs(args.traces, "report")) return kExitUsage;
  analysis::AnalyzeOptions ao;
  ao.keep_runtime_frames = args.runtime_frames;
  ao.native_frames = args.native_frames;
  ao.symbols = args.symbols;
  std::string error;
  std::unique_ptr<analysis::Analysis> a = analysis::load_and_analyze(args.traces, ao, error);
  if (!a) {
    std::fprintf(stderr, "allocshim report: %s\n", error.c_str());
    return kExitFailed;
  }
  const bool tty = isatty(2);
  bool ok = true;
  for (std::size_t i = 0; i < parsed.size(); ++i) {
    const std::string path = i < args.outputs.size() ? args.outputs[i] : "";
    if (tty && !path.empty() && path != "-")
      std::fprintf(stderr, "\r\033[Kwriting %s (%s)", path.c_str(), formats[i].c_str());
    ok = write_one(parsed[i], path, *a, o) && ok;
  }
  if (tty) std::fprintf(stderr, "\r\033[K");
  return ok ? 0 : kExitFailed;
}

void add(CLI::App& root, int& exit_code) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* sub = root.add_subcommand("report", "Symbolize traces and print allocation hot spots");
  sub->add_option("traces", args->traces,
                  "Trace files (one per process; they merge into one report)");
  sub->add_option("--step", args->step,
                  "Instead: the step the shim learned in a run, from its stats file "
                  "(ALLOCSHIM_STATS): each allocation's uses and place over the step");
  sub->add_option(
         "-f,--format", args->formats,
         "table (default), collapsed (flamegraph.pl), speedscope, perfetto (Chrome trace JSON), json, html, "
         "memory-snapshot (PyTorch's pickle for pytorch.org/memory_viz); repeat with -o for several "
         "outputs from one reading")
      ->allow_extra_args(false);
  sub->add_option("-n,--top", args->top, "Sites per section (0: all)");
  sub->add_option(
      "-s,--sort", args->sort,
      "Only this metric (bytes, calls, peak, time, temporary); also the flame graph weight");
  sub->add_option("-o,--output", args->outputs,
                  "Write to FILE instead of standard output (the Nth -o gets the Nth --format)")
      ->allow_extra_args(false);
  sub->add_option("--frames", args->frames, "Frames shown per site in the table");
  sub->add_option(
         "--sysroot", args->symbols.sysroots,
         "A copy of the recording machine's files (DIR/usr/lib/...), used where build-ids match")
      ->check(CLI::ExistingDirectory)
      ->allow_extra_args(false);
  sub->add_option("--debug-dir", args->symbols.debug_dirs,
                  "Its libraries or debug files: DIR/.build-id/xx/yyyy[.debug] or DIR/<file name>")
      ->check(CLI::ExistingDirectory)
      ->allow_extra_args(false);
  sub->add_flag("--runtime-frames", args->runtime_frames,
                "Keep the shim's and CUDA's own frames in stacks");
  sub->add_flag(
      "--native-frames", args->native_frames,
      "Python sites: keep the native frames and the frameworks' Python frames (by default a site "
      "starts at the program's own Python line)");
  sub->footer(
      "Example: allocshim report -f html -o report.html -f json -o report.json train.*.trace");
  sub->callback([args, &exit_code] { exit_code = report(*args); });
}

}  // namespace
}  // namespace allocshim::tool

ALLOCSHIM_COMMAND(allocshim::tool::add);
