// allocshim report: symbolize one or more traces and print the allocation hot spots.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "trace/load.h"
#include "trace/report.h"

namespace allocshim::tool {
namespace {

struct ReportArgs {
  std::vector<std::string> traces;
  trace::SymbolOptions symbols;
  std::string format = "table", sort, output;
  std::size_t top = 10, frames = 6;
  bool runtime_frames = false;
};

int report(const ReportArgs& args) {
  trace::Format format;
  if (!trace::parse_format(args.format, format)) {
    std::fprintf(stderr, "allocshim report: unknown format \"%s\" (table, collapsed, speedscope, perfetto, json, html)\n",
                 args.format.c_str());
    return 2;
  }
  trace::ReportOptions o;
  o.top = args.top;
  o.frames = args.frames;
  if (!args.sort.empty()) {
    if (!trace::parse_metric(args.sort, o.sort)) {
      std::fprintf(stderr, "allocshim report: unknown metric \"%s\" (bytes, calls, peak, time, temporary)\n",
                   args.sort.c_str());
      return 2;
    }
    o.sorted = true;
  }
  trace::AnalyzeOptions ao;
  ao.keep_runtime_frames = args.runtime_frames;
  ao.symbols = args.symbols;
  std::string error;
  std::unique_ptr<trace::Analysis> a = trace::load_and_analyze(args.traces, ao, error);
  if (!a) {
    std::fprintf(stderr, "allocshim report: %s\n", error.c_str());
    return 1;
  }
  if (args.output.empty() || args.output == "-") {
    trace::write_report(format, *a, o, std::cout);
    std::cout.flush();
    return std::cout ? 0 : 1;
  }
  std::ofstream out(args.output, std::ios::binary);
  trace::write_report(format, *a, o, out);
  out.close();
  if (!out) {
    std::fprintf(stderr, "allocshim report: cannot write %s\n", args.output.c_str());
    return 1;
  }
  return 0;
}

void add(CLI::App& root, int& exit_code) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* sub = root.add_subcommand("report", "Symbolize traces and print allocation hot spots");
  sub->add_option("traces", args->traces, "Trace files (one per process; they merge into one report)")
      ->required();
  sub->add_option("-f,--format", args->format,
                  "table (default), collapsed (flamegraph.pl), speedscope, perfetto (Chrome trace JSON), json, html");
  sub->add_option("-n,--top", args->top, "Sites per section (0: all)");
  sub->add_option("-s,--sort", args->sort,
                  "Only this metric (bytes, calls, peak, time, temporary); also the flame graph weight");
  sub->add_option("-o,--output", args->output, "Write to FILE instead of standard output");
  sub->add_option("--frames", args->frames, "Frames shown per site in the table");
  sub->add_option("--sysroot", args->symbols.sysroots,
                  "A copy of the recording machine's files (DIR/usr/lib/...), used where build-ids match")
      ->check(CLI::ExistingDirectory);
  sub->add_option("--debug-dir", args->symbols.debug_dirs,
                  "Its libraries or debug files: DIR/.build-id/xx/yyyy[.debug] or DIR/<file name>")
      ->check(CLI::ExistingDirectory);
  sub->add_flag("--runtime-frames", args->runtime_frames, "Keep the shim's and CUDA's own frames in stacks");
  sub->footer("Example: allocshim report --top 5 --format html -o report.html trace.*.bin");
  sub->callback([args, &exit_code] { exit_code = report(*args); });
}

}  // namespace
}  // namespace allocshim::tool

ALLOCSHIM_COMMAND(allocshim::tool::add);
