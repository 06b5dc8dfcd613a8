// Size and percentage parsing. Exact integer arithmetic throughout: "1.5GiB" is 1610612736 bytes,
// not whatever a double rounds it to, and a value past 64 bits is an error, never a wrap.
#include "policy/size.h"

#include <charconv>
#include <limits>

namespace allocshim::policy {
namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
constexpr const char* kUnitList = "B, KiB, MiB, GiB, TiB, KB, MB, GB or TB";

struct Unit {
  std::string_view name;
  std::uint64_t bytes;
};
constexpr Unit kUnits[] = {
    {"B", 1},
    {"KiB", 1ull << 10},
    {"MiB", 1ull << 20},
    {"GiB", 1ull << 30},
    {"TiB", 1ull << 40},
    {"KB", 1000ull},
    {"MB", 1000ull * 1000},
    {"GB", 1000ull * 1000 * 1000},
    {"TB", 1000ull * 1000 * 1000 * 1000},
};

bool is_space(char c) { return c == ' ' || c == '\t'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// A decimal number "123" or "1.25" as integer part + fraction digits. Consumes from `s`.
struct Decimal {
  unsigned __int128 whole = 0;
  unsigned __int128 frac = 0;   // fraction digits as an integer
  unsigned __int128 scale = 1;  // 10^(number of fraction digits)
};
bool take_decimal(std::string_view& s, Decimal& d, std::string& error) {
  std::size_t i = 0;
  bool any = false;
  // 39 digits overflow __int128; anything near that is rejected as too large below anyway.
  for (; i < s.size() && is_digit(s[i]); ++i, any = true) {
    if (d.whole > kMax) continue;  // keep scanning; reported as too large by the caller
    d.whole = d.whole * 10 + static_cast<unsigned>(s[i] - '0');
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    bool frac_digits = false;
    for (; i < s.size() && is_digit(s[i]); ++i, frac_digits = true) {
      if (d.scale > kMax) {
        error = "too many digits after the decimal point";
        return false;
      }
      d.frac = d.frac * 10 + static_cast<unsigned>(s[i] - '0');
      d.scale *= 10;
    }
    if (!frac_digits) {
      error = "expected digits after the decimal point";
      return false;
    }
  }
  if (!any) {
    error = std::string("expected a number, then a unit (") + kUnitList + ")";
    return false;
  }
  s.remove_prefix(i);
  return true;
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

bool parse_size(std::string_view text, std::uint64_t& bytes, std::string& error) {
  std::string_view s = trim(text);
  if (s.empty()) {
    error = "empty size";
    return false;
  }
  if (s.front() == '-') {
    error = "a size cannot be negative";
    return false;
  }
  if (s.front() == '+') s.remove_prefix(1);
  Decimal d;
  if (!take_decimal(s, d, error)) return false;
  const std::string_view unit_text = trim(s);
  std::uint64_t mult = 1;  // a bare number is bytes
  if (!unit_text.empty()) {
    const Unit* found = nullptr;
    for (const Unit& u : kUnits)
      if (iequals(u.name, unit_text)) found = &u;
    if (!found) {
      error = "unknown unit \"" + std::string(unit_text) + "\" (use " + kUnitList + ")";
      return false;
    }
    mult = found->bytes;
  }
  if (d.whole > kMax) {
    error = "too large for 64 bits";
    return false;
  }
  const unsigned __int128 frac_bytes = d.frac * mult;
  if (frac_bytes % d.scale != 0) {
    error = "not a whole number of bytes";
    return false;
  }
  const unsigned __int128 total = d.whole * mult + frac_bytes / d.scale;
  if (total > kMax) {
    error = "too large for 64 bits";
    return false;
  }
  bytes = static_cast<std::uint64_t>(total);
  return true;
}

bool parse_percent(std::string_view text, double& percent, std::string& error) {
  std::string_view s = trim(text);
  if (s.empty() || s.back() != '%') {
    error = "expected a percentage such as \"60%\"";
    return false;
  }
  s = trim(s.substr(0, s.size() - 1));
  if (!s.empty() && s.front() == '-') {
    error = "must be between 0% and 100%";
    return false;
  }
  double v = 0;
  const auto [end, ec] =
      std::from_chars(s.data(), s.data() + s.size(), v, std::chars_format::fixed);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) {
    error = "expected a percentage such as \"60%\"";
    return false;
  }
  if (!(v >= 0.0 && v <= 100.0)) {
    error = "must be between 0% and 100%";
    return false;
  }
  percent = v;
  return true;
}

bool parse_size_range(std::string_view text, std::uint64_t& min, std::uint64_t& max,
                      std::string& error) {
  const std::string_view s = trim(text);
  std::uint64_t lo = 0, hi = kMax, v = 0;
  auto operand = [&](std::size_t skip) {
    std::string e;
    if (!parse_size(s.substr(skip), v, e)) {
      error = e;
      return false;
    }
    return true;
  };
  if (s.starts_with(">=")) {
    if (!operand(2)) return false;
    lo = v;
  } else if (s.starts_with("<=")) {
    if (!operand(2)) return false;
    hi = v;
  } else if (s.starts_with("==")) {
    if (!operand(2)) return false;
    lo = hi = v;
  } else if (s.starts_with(">")) {
    if (!operand(1)) return false;
    if (v == kMax) {
      error = "matches no size";
      return false;
    }
    lo = v + 1;
  } else if (s.starts_with("<")) {
    if (!operand(1)) return false;
    if (v == 0) {
      error = "matches no size";
      return false;
    }
    hi = v - 1;
  } else if (s.starts_with("=")) {
    if (!operand(1)) return false;
    lo = hi = v;
  } else if (const auto dots = s.find(".."); dots != std::string_view::npos) {
    const std::string_view a = trim(s.substr(0, dots));
    const std::string_view b = trim(s.substr(dots + 2));
    std::string e;
    if (!a.empty() && !parse_size(a, lo, e)) {
      error = e;
      return false;
    }
    if (!b.empty()) {
      std::uint64_t end = 0;
      if (!parse_size(b, end, e)) {
        error = e;
        return false;
      }
      if (end <= lo) {
        error = "matches no size (the upper end is exclusive)";
        return false;
      }
      hi = end - 1;
    }
  } else {
    error = "needs a comparison: \">= X\", \"< X\", \"= X\" or a range \"A..B\"";
    return false;
  }
  min = lo;
  max = hi;
  return true;
}

std::string format_size(std::uint64_t bytes) {
  // Binary units first (what allocations are made of), then decimal ones ("1GB" stays "1GB").
  static constexpr Unit kOrder[] = {{"TiB", 1ull << 40},          {"GiB", 1ull << 30},
                                    {"MiB", 1ull << 20},          {"KiB", 1ull << 10},
                                    {"TB", 1'000'000'000'000ull}, {"GB", 1'000'000'000ull},
                                    {"MB", 1'000'000ull},         {"KB", 1'000ull}};
  if (bytes != 0)
    for (const Unit& u : kOrder)
      if (bytes % u.bytes == 0) return std::to_string(bytes / u.bytes) + std::string(u.name);
  return std::to_string(bytes) + "B";
}

namespace {
// True when `bytes` needs no unit larger than B: "> 1GiB" reads better than ">= 1073741825B".
bool plain_bytes(std::uint64_t bytes) {
  const std::string s = format_size(bytes);
  return s.size() >= 2 && is_digit(s[s.size() - 2]);  // "1025B", not "1KiB"
}
}  // namespace

std::string format_size_range(std::uint64_t min, std::uint64_t max) {
  if (min == 0 && max == kMax) return {};
  if (min == max) return "= " + format_size(min);
  if (max == kMax) {
    if (plain_bytes(min) && !plain_bytes(min - 1)) return "> " + format_size(min - 1);
    return ">= " + format_size(min);
  }
  if (min == 0) {
    if (plain_bytes(max + 1) && !plain_bytes(max)) return "<= " + format_size(max);
    return "< " + format_size(max + 1);
  }
  return format_size(min) + ".." + format_size(max + 1);
}

std::string format_float(double value) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // TOML: "1" would be an integer
  return s;
}

std::string format_percent(double percent) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, percent);
  return std::string(buf, ec == std::errc() ? end : buf) + "%";
}

}  // namespace allocshim::policy
