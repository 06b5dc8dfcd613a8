// Located errors, "did you mean" suggestions and typed value access for the loader. Every getter
// reports its own error at the offending node, so a section loader reads as a list of keys.
#include <algorithm>
#include <charconv>
#include <cstdio>

#include "policy/loader.h"
#include "policy/size.h"

namespace allocshim::policy {

std::string Diagnostic::str() const {
  if (line <= 0) return file + ": " + message;  // no position: an unreadable file
  return file + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + message;
}

namespace detail {
namespace {

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// Optimal string alignment distance: insertions, deletions, substitutions and transpositions of
// neighbours each cost one, so "devcie" is one step from "device". Keys are short; O(n*m) is fine.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::size_t> d((n + 1) * (m + 1));
  auto at = [&](std::size_t i, std::size_t j) -> std::size_t& { return d[i * (m + 1) + j]; };
  for (std::size_t i = 0; i <= n; ++i) at(i, 0) = i;
  for (std::size_t j = 0; j <= m; ++j) at(0, j) = j;
  for (std::size_t i = 1; i <= n; ++i)
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      std::size_t v = std::min({at(i - 1, j) + 1, at(i, j - 1) + 1, at(i - 1, j - 1) + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) &&
          lower(a[i - 2]) == lower(b[j - 1]))
        v = std::min(v, at(i - 2, j - 2) + 1);
      at(i, j) = v;
    }
  return at(n, m);
}

template <typename Range>
std::string_view closest_in(std::string_view word, const Range& candidates) {
  // A third of the word's length may be wrong (at least one character): "sise" -> "size",
  // "releas_threshold" -> "release_threshold", but "x" suggests nothing for "ipc".
  const std::size_t limit = std::max<std::size_t>(1, word.size() / 3);
  std::string_view best;
  std::size_t best_d = limit + 1;
  for (const auto& c : candidates) {
    const std::string_view cand(c);
    const std::size_t dist = edit_distance(word, cand);
    if (dist < best_d && dist < std::max(word.size(), cand.size())) {
      best = cand;
      best_d = dist;
    }
  }
  return best;
}

std::string node_text(const toml::node& v) {
  if (const auto* s = v.as_string()) return toml_quote(s->get());
  if (const auto* i = v.as_integer()) return std::to_string(i->get());
  if (const auto* f = v.as_floating_point()) return format_float(f->get());
  if (const auto* b = v.as_boolean()) return b->get() ? "true" : "false";
  return type_name(v);
}

}  // namespace

void Reporter::at(const toml::source_region& where, std::string message) {
  at(static_cast<int>(where.begin.line), static_cast<int>(where.begin.column), std::move(message));
}

void Reporter::at(int line, int column, std::string message) {
  if (mapped_) {
    column = column <= key_columns_ ? key_column_ : value_column_;
    line = 1;
  }
  out_.push_back(Diagnostic{file_, line, column, std::move(message)});
  ++count_;
}

std::string_view closest(std::string_view word, Names candidates) {
  return closest_in(word, candidates);
}
std::string_view closest(std::string_view word, const std::vector<std::string>& candidates) {
  return closest_in(word, candidates);
}

std::string did_you_mean(std::string_view word, Names candidates) {
  const std::string_view c = closest(word, candidates);
  return c.empty() ? std::string() : "; did you mean \"" + std::string(c) + "\"?";
}

std::string type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

std::string quoted(std::string_view name) {
  std::string out = "\"";
  out += name;
  out += '"';
  return out;
}

std::string quoted_list(Names names) {
  std::string out;
  std::size_t i = 0;
  for (std::string_view n : names) {
    if (i > 0) out += (i + 1 == names.size()) ? " or " : ", ";
    out += quoted(n);
    ++i;
  }
  return out;
}

std::string toml_quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void check_keys(const toml::table& table, Names allowed, std::string_view where, Loader& L) {
  for (auto&& [key, value] : table) {
    (void)value;
    const std::string_view k = key.str();
    if (std::find(allowed.begin(), allowed.end(), k) != allowed.end()) continue;
    std::string msg = "unknown key \"" + std::string(k) + "\" " + std::string(where);
    const std::string_view c = closest(k, allowed);
    if (!c.empty()) {
      msg += "; did you mean \"" + std::string(c) + "\"?";
    } else {
      msg += " (expected ";
      std::size_t i = 0;
      for (std::string_view a : allowed) {
        if (i > 0) msg += (i + 1 == allowed.size()) ? " or " : ", ";
        msg += a;
        ++i;
      }
      msg += ")";
    }
    L.report.at(key, std::move(msg));
  }
}

std::optional<bool> get_bool(const toml::node& v, std::string_view key, Loader& L) {
  if (const auto* b = v.as_boolean()) return b->get();
  if (const auto* s = v.as_string(); s && L.env) {
    if (s->get() == "true" || s->get() == "1") return true;
    if (s->get() == "false" || s->get() == "0") return false;
    L.report.at(v, quoted(key) + " must be true or false, not " + node_text(v));
    return std::nullopt;
  }
  L.report.at(v, quoted(key) + " must be a boolean, not " + type_name(v));
  return std::nullopt;
}

std::optional<std::string> get_string(const toml::node& v, std::string_view key, Loader& L) {
  if (const auto* s = v.as_string()) return s->get();
  L.report.at(v, quoted(key) + " must be a string, not " + type_name(v));
  return std::nullopt;
}

std::optional<std::int64_t> get_int(const toml::node& v, std::string_view key, std::int64_t min,
                                    std::int64_t max, Loader& L) {
  std::int64_t x = 0;
  if (const auto* i = v.as_integer()) {
    x = i->get();
  } else if (const auto* s = v.as_string(); s && L.env) {
    const std::string& t = s->get();
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), x);
    if (ec != std::errc() || end != t.data() + t.size()) {
      L.report.at(v, quoted(key) + " must be an integer, not " + node_text(v));
      return std::nullopt;
    }
  } else {
    L.report.at(v, quoted(key) + " must be an integer, not " + type_name(v));
    return std::nullopt;
  }
  if (x < min || x > max) {
    L.report.at(v, quoted(key) + " must be between " + std::to_string(min) + " and " +
                       std::to_string(max) + ", not " + std::to_string(x));
    return std::nullopt;
  }
  return x;
}

std::optional<std::uint64_t> get_size(const toml::node& v, std::string_view key, Loader& L) {
  if (const auto* i = v.as_integer()) {
    if (i->get() < 0) {
      L.report.at(v, "bad size " + std::to_string(i->get()) + " for \"" + std::string(key) +
                         "\": a size cannot be negative");
      return std::nullopt;
    }
    return static_cast<std::uint64_t>(i->get());
  }
  if (const auto* s = v.as_string()) {
    std::uint64_t bytes = 0;
    std::string error;
    if (parse_size(s->get(), bytes, error)) return bytes;
    L.report.at(v,
                "bad size " + toml_quote(s->get()) + " for \"" + std::string(key) + "\": " + error);
    return std::nullopt;
  }
  L.report.at(v, quoted(key) + " must be a size such as \"2MiB\", not " + type_name(v));
  return std::nullopt;
}

std::optional<std::uint64_t> get_size_or_max(const toml::node& v, std::string_view key, Loader& L) {
  if (const auto* s = v.as_string(); s && iequals(s->get(), "max")) return kUnlimited;
  if (!v.is_string() && !v.is_integer()) {
    L.report.at(v,
                quoted(key) + " must be a size such as \"1GiB\" or \"max\", not " + type_name(v));
    return std::nullopt;
  }
  return get_size(v, key, L);
}

std::optional<int> get_enum(const toml::node& v, std::string_view key, Names names, Loader& L) {
  const auto* s = v.as_string();
  if (!s) {
    L.report.at(v, quoted(key) + " must be " + quoted_list(names) + ", not " + type_name(v));
    return std::nullopt;
  }
  int i = 0;
  for (std::string_view n : names) {
    if (n == s->get()) return i;
    ++i;
  }
  L.report.at(v, quoted(key) + " must be " + quoted_list(names) + ", not " + toml_quote(s->get()) +
                     did_you_mean(s->get(), names));
  return std::nullopt;
}

}  // namespace detail
}  // namespace allocshim::policy
