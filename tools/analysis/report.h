// Report writers over an Analysis: the table (default), collapsed stacks for flamegraph.pl,
// speedscope JSON, Chrome/Perfetto trace JSON (memory counters and a slice per allocation), plain
// JSON, a self-contained HTML page, and PyTorch's memory snapshot.
#pragma once

#include <cstddef>
#include <ostream>
#include <string>
#include <string_view>

#include "analysis/analysis.h"

namespace allocshim::analysis {

struct ReportOptions {
  std::size_t top = 10;  // sites per section (0: all)
  bool sorted = false;   // true: only the `sort` section (table) / weight (stacks)
  Metric sort =
      Metric::bytes;       // also the weight of collapsed stacks, speedscope and the flame graph
  std::size_t frames = 6;  // frames shown per site in the table
};

enum class Format { table, collapsed, speedscope, perfetto, json, html, memory_snapshot };
bool parse_format(const std::string& s, Format& out);

void write_table(const Analysis& a, const ReportOptions& o, std::ostream& out);
void write_collapsed(const Analysis& a, const ReportOptions& o, std::ostream& out);
void write_speedscope(const Analysis& a, const ReportOptions& o, std::ostream& out);
void write_perfetto(const Analysis& a, const ReportOptions& o, std::ostream& out);
void write_json(const Analysis& a, const ReportOptions& o, std::ostream& out);
void write_html(const Analysis& a, const ReportOptions& o, std::ostream& out);
// PyTorch's memory snapshot pickle, for https://pytorch.org/memory_viz (binary).
void write_memory_snapshot(const Analysis& a, const ReportOptions& o, std::ostream& out);
void write_report(Format f, const Analysis& a, const ReportOptions& o, std::ostream& out);

// `s` with each byte that is not part of valid UTF-8 replaced by U+FFFD: paths and names come from
// the traced machine as raw bytes, and the JSON, HTML and pickle outputs must be valid UTF-8.
std::string valid_utf8(std::string_view s);

}  // namespace allocshim::analysis
