// Glob matching without allocation or recursion: the classic single-backtrack algorithm (on a
// mismatch, retry from the last `*` one character further), linear for patterns with one star and
// never worse than O(pattern x name). It runs on the allocation path when a callsite rule exists.
#include "policy/glob.h"

#include <cstddef>

namespace allocshim::policy {
namespace {

// Matches the set starting at pattern[p] == '[' against `c`. Returns the index after ']' or npos
// when the set is unterminated (then '[' is taken literally, as fnmatch does).
std::size_t match_set(std::string_view pattern, std::size_t p, char c, bool& matched) {
  std::size_t i = p + 1;
  bool negate = false;
  if (i < pattern.size() && (pattern[i] == '!' || pattern[i] == '^')) {
    negate = true;
    ++i;
  }
  bool hit = false;
  bool first = true;
  for (; i < pattern.size(); ++i) {
    char lo = pattern[i];
    if (lo == ']' && !first) {
      matched = hit != negate;
      return i + 1;
    }
    first = false;
    if (lo == '\\' && i + 1 < pattern.size()) lo = pattern[++i];
    char hi = lo;
    if (i + 2 < pattern.size() && pattern[i + 1] == '-' && pattern[i + 2] != ']') {
      hi = pattern[i + 2];
      if (hi == '\\' && i + 3 < pattern.size()) {
        hi = pattern[i + 3];
        ++i;
      }
      i += 2;
    }
    if (static_cast<unsigned char>(c) >= static_cast<unsigned char>(lo) &&
        static_cast<unsigned char>(c) <= static_cast<unsigned char>(hi))
      hit = true;
  }
  return std::string_view::npos;
}

}  // namespace

bool glob_match(std::string_view pattern, std::string_view name) {
  std::size_t p = 0, n = 0;
  std::size_t star_p = std::string_view::npos, star_n = 0;
  while (n < name.size()) {
    if (p < pattern.size()) {
      const char pc = pattern[p];
      if (pc == '*') {
        star_p = p++;
        star_n = n;
        continue;
      }
      if (pc == '?') {
        ++p;
        ++n;
        continue;
      }
      if (pc == '[') {
        bool matched = false;
        const std::size_t next = match_set(pattern, p, name[n], matched);
        if (next != std::string_view::npos) {
          if (matched) {
            p = next;
            ++n;
            continue;
          }
        } else if (name[n] == '[') {
          ++p;
          ++n;
          continue;
        }
      } else {
        char lit = pc;
        std::size_t width = 1;
        if (pc == '\\' && p + 1 < pattern.size()) {
          lit = pattern[p + 1];
          width = 2;
        }
        if (lit == name[n]) {
          p += width;
          ++n;
          continue;
        }
      }
    }
    // Mismatch: let the last star swallow one more character, or fail.
    if (star_p == std::string_view::npos) return false;
    p = star_p + 1;
    n = ++star_n;
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool callsite_match(std::string_view pattern, std::string_view frames) {
  while (!frames.empty()) {
    const std::size_t nl = frames.find('\n');
    const std::string_view frame = frames.substr(0, nl);
    if (!frame.empty() && glob_match(pattern, frame)) return true;
    if (nl == std::string_view::npos) break;
    frames.remove_prefix(nl + 1);
  }
  return false;
}

bool glob_valid(std::string_view pattern, std::string& error) {
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\') {
      if (i + 1 == pattern.size()) {
        error = "ends with a lone '\\'";
        return false;
      }
      ++i;
    } else if (pattern[i] == '[') {
      bool matched = false;
      const std::size_t next = match_set(pattern, i, 'x', matched);
      if (next == std::string_view::npos) {
        error = "has a '[' without a closing ']'";
        return false;
      }
      i = next - 1;
    } else if (pattern[i] == '\n') {
      error = "contains a newline (frame names never do)";
      return false;
    }
  }
  return true;
}

bool glob_matches_all(std::string_view pattern) {
  if (pattern.empty()) return false;
  for (char c : pattern)
    if (c != '*') return false;
  return true;
}

}  // namespace allocshim::policy
