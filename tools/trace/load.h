// Loading several traces for the commands, with progress on a terminal.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "trace/analysis.h"

namespace allocshim::trace {

// Reads every trace (progress on stderr when it is a terminal) and analyzes them together. Null
// with `error` set when a file cannot be read.
std::unique_ptr<Analysis> load_and_analyze(const std::vector<std::string>& paths,
                                           const AnalyzeOptions& options, std::string& error);
// Reads the traces only.
bool load_traces(const std::vector<std::string>& paths, std::vector<Trace>& out, std::string& error);

}  // namespace allocshim::trace
