// Sizes, percentages and size conditions as users write them in a policy ("256MiB", "60%",
// ">= 1MiB", "64KiB..16MiB"), and their canonical spelling for `allocshim check`.
//
// Plain functions over strings (no toml types): the loader, the ALLOCSHIM_CONF parser and the
// tests share them. Errors are short phrases the caller places after the offending text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace allocshim::policy {

// "256MiB", "1.5 GiB", "4096", "2MB" (decimal), "0B". Units are case-insensitive: B, KiB, MiB,
// GiB, TiB (powers of 1024) and KB, MB, GB, TB (powers of 1000). A fraction must give a whole
// number of bytes. On failure returns false and sets `error` (e.g. `unknown unit "XB"`).
bool parse_size(std::string_view text, std::uint64_t& bytes, std::string& error);

// "60%", "12.5 %": 0 to 100 inclusive.
bool parse_percent(std::string_view text, double& percent, std::string& error);

// A size condition: ">= X", "> X", "<= X", "< X", "= X" (or "== X"), or "A..B" (A inclusive, B
// exclusive, so "..16MiB" and ">= 16MiB" meet without overlap). Sets the inclusive [min, max].
// A condition no size satisfies ("< 0B", "4MiB..1MiB") is an error.
bool parse_size_range(std::string_view text, std::uint64_t& min, std::uint64_t& max,
                      std::string& error);

// The largest binary unit that divides `bytes` exactly: "256MiB", "1536KiB", "1000B", "0B".
std::string format_size(std::uint64_t bytes);
// The inverse of parse_size_range, in its canonical spelling; empty for [0, max] (any size).
std::string format_size_range(std::uint64_t min, std::uint64_t max);
// "60%", "12.5%".
std::string format_percent(double percent);
// Shortest round-trip spelling of a double that TOML reads back as a float ("0.25", "1.0").
std::string format_float(double value);

// Case-insensitive ASCII comparison.
bool iequals(std::string_view a, std::string_view b);

}  // namespace allocshim::policy
