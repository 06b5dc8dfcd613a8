// A pre-pass that keeps toml++ 3.3 (Debian's) away from inputs that reach undefined behaviour in
// it: its is_non_ascii_horizontal_whitespace() hits TOML_UNREACHABLE for many non-ASCII code
// points (upstream issues #190 and #295, fixed after 3.3). That only happens where the parser asks
// "is this whitespace?" of a non-ASCII character: outside strings and comments (where TOML allows
// no non-ASCII character at all) and in a """ string right after a backslash. The pre-pass finds
// those places and reports them as located errors instead; our fuzzer found the bug.
#pragma once

#include <string>
#include <string_view>

namespace allocshim::policy::detail {

// True when `text` is safe to give toml++; otherwise false with the position (line and column
// from 1, columns counting characters as toml++ does) and a message.
bool toml_guard(std::string_view text, int& line, int& column, std::string& message);

}  // namespace allocshim::policy::detail
