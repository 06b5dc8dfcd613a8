// See toml_guard.h. A small TOML tokenizer that only tracks whether it is inside a comment or one
// of the four string kinds, which is all it needs to know where toml++ tests for whitespace.
#include "policy/toml_guard.h"

#include <cstdio>

namespace allocshim::policy::detail {
namespace {

bool ascii_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
bool non_ascii(char c) { return static_cast<unsigned char>(c) >= 0x80; }

// The code point starting at text[i], for the message ("U+00E9"); best effort on bad UTF-8.
std::string code_point_at(std::string_view text, std::size_t i) {
  const auto b = [&](std::size_t k) {
    return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0u;
  };
  unsigned cp = b(0);
  if ((cp & 0xE0) == 0xC0)
    cp = ((cp & 0x1F) << 6) | (b(1) & 0x3F);
  else if ((cp & 0xF0) == 0xE0)
    cp = ((cp & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  else if ((cp & 0xF8) == 0xF0)
    cp = ((cp & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", cp);
  return buf;
}

class Guard {
 public:
  explicit Guard(std::string_view text) : t_(text) {}

  bool run(int& line, int& column, std::string& message) {
    if (t_.starts_with("\xEF\xBB\xBF")) i_ = 3;  // a byte-order mark; toml++ skips it
    while (i_ < t_.size()) {
      const char c = t_[i_];
      if (in_bare_value_ && !bare_value_ends(c)) {
        // toml++ scans a bare value (number, boolean, date) up to a terminator and tests every
        // character for whitespace, quotes, '=' and brackets included.
        if (non_ascii(c))
          return fail(line, column, message,
                      "syntax error: unexpected character " + code_point_at(t_, i_) +
                          " (outside strings and comments TOML allows only ASCII)");
        step();
        continue;
      }
      in_bare_value_ = false;
      if (c == '#') {
        skip_to_line_end();
      } else if (c == '"' && string_can_start()) {
        if (!string_at('"', line, column, message)) return false;
      } else if (c == '\'' && string_can_start()) {
        string_at('\'', line, column, message);
      } else if (non_ascii(c)) {
        return fail(line, column, message,
                    "syntax error: unexpected character " + code_point_at(t_, i_) +
                        " (outside strings and comments TOML allows only ASCII)");
      } else {
        in_bare_value_ = starts_bare_value(c);
        track_structure(c);
        step();
      }
    }
    return true;
  }

 private:
  // A quote right after a value character ("0\"...", "true'...") does not open a string for
  // toml++: it keeps scanning that value up to a terminator, testing each character for
  // whitespace. So such a quote is treated as plain text here, and a non-ASCII character after it
  // is reported.
  // After a '.', only in a key ("a"."b"): in a value, "-0."+quote is a number toml++ scans on.
  bool string_can_start() const {
    if (i_ == 0) return true;
    const char p = t_[i_ - 1];
    return p == ' ' || p == '\t' || p == '\n' || p == '\r' || p == '=' || p == '[' || p == '{' ||
           p == ',' || (p == '.' && key_mode_) || (i_ == 3 && t_.starts_with("\xEF\xBB\xBF"));
  }

  // A value that is not a string, array or inline table starts here.
  bool starts_bare_value(char c) const {
    return !key_mode_ && !header_ && !bare_value_ends(c) && c != '=' && c != '[' && c != '{';
  }
  // toml++'s value terminators (is_value_terminator), ASCII part.
  static bool bare_value_ends(char c) {
    return ascii_space(c) || c == ']' || c == '}' || c == ',' || c == '#';
  }

  // Whether the text at hand is a key (start of a line, a table header, an inline table's
  // entries before '=') or a value, from brackets and '=' outside strings and comments.
  void track_structure(char c) {
    const bool first_on_line = line_start_;
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n') line_start_ = false;
    switch (c) {
      case '\n':
        line_start_ = true;
        header_ = false;
        key_mode_ = depth_.empty();
        break;
      case '[':
        if (first_on_line && depth_.empty()) {
          header_ = true;
          key_mode_ = true;
        } else if (!header_) {
          depth_.push_back('[');
          key_mode_ = false;
        }
        break;
      case '{':
        depth_.push_back('{');
        key_mode_ = true;
        break;
      case ']':
      case '}':
        if (!header_ && !depth_.empty()) depth_.pop_back();
        if (!header_) key_mode_ = false;
        break;
      case ',': key_mode_ = !depth_.empty() && depth_.back() == '{'; break;
      case '=':
        if (!header_) key_mode_ = false;
        break;
      default: break;
    }
  }

  void step() {
    if (i_ >= t_.size()) return;
    const auto u = static_cast<unsigned char>(t_[i_]);
    if (t_[i_] == '\n') {
      ++line_;
      column_ = 1;
    } else if ((u & 0xC0) != 0x80) {
      ++column_;  // count characters, not continuation bytes
    }
    ++i_;
  }
  // Advances over a continuation byte without counting it as a column.
  void step_char() {
    step();
    while (i_ < t_.size() && (static_cast<unsigned char>(t_[i_]) & 0xC0) == 0x80) ++i_;
  }
  void skip_to_line_end() {
    while (i_ < t_.size() && t_[i_] != '\n') step_char();
  }
  std::size_t run_of(char q) const {
    std::size_t n = 0;
    while (i_ + n < t_.size() && t_[i_ + n] == q) ++n;
    return n;
  }
  bool fail(int& line, int& column, std::string& message, std::string text) const {
    line = line_;
    column = column_;
    message = std::move(text);
    return false;
  }

  // At an opening quote `q`: skips the string; false where toml++ would misbehave.
  bool string_at(char q, int& line, int& column, std::string& message) {
    const bool basic = q == '"';
    line_start_ = false;
    if (run_of(q) >= 3) {
      for (int k = 0; k < 3; ++k) step();
      while (i_ < t_.size()) {
        const std::size_t n = run_of(q);
        if (n >= 3) {
          // """ closes; up to two more quotes right before it belong to the content.
          for (std::size_t k = 0; k < (n > 5 ? 5 : n); ++k) step();
          return true;
        }
        if (n > 0) {
          for (std::size_t k = 0; k < n; ++k) step();
          continue;
        }
        if (basic && t_[i_] == '\\') {
          step();
          if (i_ >= t_.size()) return true;
          if (ascii_space(t_[i_])) {
            // A line-ending backslash: toml++ skips the whitespace, then tests the next
            // character for whitespace again.
            while (i_ < t_.size() && ascii_space(t_[i_])) step();
            if (i_ < t_.size() && non_ascii(t_[i_]))
              return fail(line, column, message,
                          "a line continued with a backslash inside a \"\"\" string cannot start "
                          "with " +
                              code_point_at(t_, i_) +
                              " (a toml++ 3.3 bug); write it as a \\u escape");
            continue;
          }
          if (non_ascii(t_[i_]))
            return fail(line, column, message,
                        "syntax error: invalid escape sequence \"\\" + code_point_at(t_, i_) +
                            "\" in a \"\"\" string");
          step_char();
          continue;
        }
        step_char();
      }
      return true;
    }
    // A one-line string: toml++ asks nothing about whitespace inside it. A newline ends it (as an
    // error toml++ reports).
    step();
    while (i_ < t_.size() && t_[i_] != '\n') {
      if (t_[i_] == q) {
        step();
        return true;
      }
      if (basic && t_[i_] == '\\') step();
      step_char();
    }
    return true;
  }

  std::string_view t_;
  std::size_t i_ = 0;
  int line_ = 1, column_ = 1;
  bool line_start_ = true, header_ = false, key_mode_ = true, in_bare_value_ = false;
  std::string depth_;  // open '[' (arrays) and '{' (inline tables) of values
};

}  // namespace

bool toml_guard(std::string_view text, int& line, int& column, std::string& message) {
  return Guard(text).run(line, column, message);
}

}  // namespace allocshim::policy::detail
