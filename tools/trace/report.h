// Report writers over an Analysis: the table (default), collapsed stacks for flamegraph.pl,
// speedscope JSON, Chrome/Perfetto trace JSON with memory counters, plain JSON, and a
// self-contained HTML page.
#pragma once

#include <cstddef>
#include <ostream>
#include <string>

#include "trace/analysis.h"

namespace allocshim::trace {

struct ReportOptions {
  std::size_t top = 10;         // sites per section (0: all)
  bool sorted = false;          // true: only the `sort` section (table) / weight (stacks)
  Metric sort = Metric::bytes;  // also the weight of collapsed stacks, speedscope and the flame graph
  std::size_t frames = 6;       // frames shown per site in the table
};

enum class Format { table, collapsed, speedscope, perfetto, json, html };
bool parse_format(const std::string& s, Format& out);

void write_table(const Analysis& a, const ReportOptions& o, std::ostream& out);
void write_collapsed(const Analysis& a, const ReportOptions& o, std::ostream& out);
void write_speedscope(const Analysis& a, const ReportOptions& o, std::ostream& out);
void write_perfetto(const Analysis& a, const ReportOptions& o, std::ostream& out);
void write_json(const Analysis& a, const ReportOptions& o, std::ostream& out);
void write_html(const Analysis& a, const ReportOptions& o, std::ostream& out);
void write_report(Format f, const Analysis& a, const ReportOptions& o, std::ostream& out);

}  // namespace allocshim::trace
