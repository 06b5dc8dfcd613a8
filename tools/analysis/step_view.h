// The learned step of a run, from its stats file (ALLOCSHIM_STATS; shim/placement/step.h): what
// `allocshim report --step` prints. Each allocation the step names, in allocation order, with its
// size, host part, uses per step, longest idle stretch and its place over the step.
#pragma once

#include <ostream>
#include <string>

namespace allocshim::analysis {

// Writes the view of the stats file at `path`; false with `error` set when it cannot be read or
// has no migration section.
bool write_step_view(const std::string& path, std::ostream& out, std::string& error);

}  // namespace allocshim::analysis
