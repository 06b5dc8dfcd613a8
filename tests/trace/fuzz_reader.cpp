// See fuzz_reader.h.
#include "fuzz_reader.h"

#include "analysis/reader.h"

namespace allocshim::analysis::fuzz {

std::string check_input(const std::uint8_t* data, std::size_t size) {
  Trace t;
  std::string error;
  if (!parse_trace(data, size, t, error)) return error.empty() ? "rejected without an error" : "";
  for (std::size_t i = 1; i < t.events.size(); ++i)
    if (t.events[i].time_ns < t.events[i - 1].time_ns) return "events out of time order";
  // Walking every stack terminates (ids decrease towards the root).
  for (const auto& [id, node] : t.nodes)
    if (t.frames(id).size() > t.nodes.size()) return "stack walk longer than the trie";
  return {};
}

}  // namespace allocshim::analysis::fuzz
