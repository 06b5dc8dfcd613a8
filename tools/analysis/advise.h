// allocshim advise: a policy drafted from a trace's evidence, starting from the embedded default.
// Each choice carries a comment with the numbers that motivated it; the output is a policy file
// `allocshim check` accepts.
#pragma once

#include <string>

#include "analysis/analysis.h"

namespace allocshim::analysis {

struct AdviseOptions {
  std::size_t small_limit = 16u << 20;   // blocks up to this size can churn
  std::size_t large_limit = 256u << 20;  // blocks from this size on are large
  std::size_t evidence_sites = 3;        // sites quoted per rule
};

std::string advise(const Analysis& a, const AdviseOptions& o = {});

}  // namespace allocshim::analysis
