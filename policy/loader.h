// Internals of the policy loader, shared by the file loader (load*.cpp) and the ALLOCSHIM_CONF
// overrides (overrides.cpp). The only header in the project that exposes toml types; it never
// leaves policy/.
#pragma once

// toml++ 3.3 asserts on some malformed input (e.g. "[" then a newline reaches parse_key, which
// asserts it starts at a key) and then reports a parse error anyway. An assert in a debug build
// would abort the program the shim is preloaded into over a typo in its policy, so the parser's
// own error reporting is relied on instead. (Release builds with GCC compile these out anyway.)
#ifndef TOML_ASSERT
#define TOML_ASSERT(expr) static_assert(true)
#endif
#include <toml++/toml.h>

#include <cstdint>
#include <span>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "policy/policy.h"

namespace allocshim::policy::detail {

// A list of accepted names: keys of a section, values of an enum. Always a static array.
using Names = std::span<const std::string_view>;

// Collects located errors for one source (a file, or the ALLOCSHIM_CONF string).
class Reporter {
 public:
  Reporter(std::string file, std::vector<Diagnostic>& out) : file_(std::move(file)), out_(out) {}

  void at(const toml::source_region& where, std::string message);
  void at(const toml::node& node, std::string message) { at(node.source(), std::move(message)); }
  void at(const toml::key& key, std::string message) { at(key.source(), std::move(message)); }
  void at(int line, int column, std::string message);

  // ALLOCSHIM_CONF items are parsed as a one-line TOML fragment `KEY = "VALUE"`: columns up to
  // `key_columns` belong to the key, which starts at `key_column` in the variable; the rest to the
  // value, at `value_column`.
  void map_fragment(int key_columns, int key_column, int value_column) {
    mapped_ = true;
    key_columns_ = key_columns;
    key_column_ = key_column;
    value_column_ = value_column;
  }

  std::size_t count() const { return count_; }
  const std::string& file() const { return file_; }

 private:
  std::string file_;
  std::vector<Diagnostic>& out_;
  std::size_t count_ = 0;
  bool mapped_ = false;
  int key_columns_ = 0, key_column_ = 0, value_column_ = 0;
};

// The closest of `candidates` to `word` by edit distance (case-insensitive), if close enough to be
// a plausible typo; empty otherwise.
std::string_view closest(std::string_view word, Names candidates);
std::string_view closest(std::string_view word, const std::vector<std::string>& candidates);
// "; did you mean \"x\"?" or "".
std::string did_you_mean(std::string_view word, Names candidates);
// "a string", "an integer", ...
std::string type_name(const toml::node& node);
// `"a"`: a name quoted in a message. Appended, not `"\"" + std::string(a)`: inlined at -O3, that
// operator+ (an insert at 0) trips GCC 12's false -Wrestrict warning (GCC bug 105651).
std::string quoted(std::string_view name);
// `"a", "b" or "c"`.
std::string quoted_list(Names names);
// A TOML basic string literal with the quotes: "a\"b".
std::string toml_quote(std::string_view text);

struct Loader {
  Reporter& report;
  Policy& policy;
  const LoadOptions& options;
  // Values come from ALLOCSHIM_CONF: every value is a string, converted to the type its key wants.
  bool env = false;
  // Set when [defaults] names a backend (otherwise the file's default is the embedded default's).
  bool default_backend_set = false;
  // Where [backends.host] set pin_ahead, checked against [budget] once both are read.
  const toml::node* pin_ahead_at = nullptr;

  // The index in policy.backends of the backend called `name`, or -1. A hash index (caught up with
  // backends appended since the last call), so loading stays linear in the number of backends.
  int find_backend(std::string_view name);
  // Names compared by find_backend: a test checks that the work per backend stays constant.
  std::size_t name_comparisons = 0;

  // find_backend's state (a Loader is never copied: the index counts into its own member).
  struct CountingEqual {
    std::size_t* count;
    bool operator()(const std::string& a, const std::string& b) const {
      ++*count;
      return a == b;
    }
  };
  std::unordered_map<std::string, int, std::hash<std::string>, CountingEqual> backend_index{
      16, std::hash<std::string>{}, CountingEqual{&name_comparisons}};
  std::size_t backends_indexed = 0;
};

// Reports each key of `table` not in `allowed` ("unknown key ... in WHERE; did you mean ...").
void check_keys(const toml::table& table, Names allowed, std::string_view where, Loader& L);

// Typed values. Each reports a located error and returns nullopt when the value does not fit.
std::optional<bool> get_bool(const toml::node& v, std::string_view key, Loader& L);
std::optional<std::string> get_string(const toml::node& v, std::string_view key, Loader& L);
std::optional<std::int64_t> get_int(const toml::node& v, std::string_view key, std::int64_t min,
                                    std::int64_t max, Loader& L);
// A size: an integer (bytes) or a string such as "256MiB".
std::optional<std::uint64_t> get_size(const toml::node& v, std::string_view key, Loader& L);
// A size or "max" (kUnlimited).
std::optional<std::uint64_t> get_size_or_max(const toml::node& v, std::string_view key, Loader& L);
// One of `names`: returns its index.
std::optional<int> get_enum(const toml::node& v, std::string_view key, Names names, Loader& L);

// A backend reference: the name of a [backends.NAME] table or a kind (which then gets an implicit
// backend of that name with default options). Returns the index in policy.backends, or -1.
int resolve_backend(const toml::node& value, Loader& L);
// Reports `kind` at `where` when the options forbid it; true when allowed.
bool check_kind_allowed(BackendKind kind, const toml::node& where, Loader& L);

// Sections. Each sets only the keys present, so the overrides reuse them on a loaded policy.
void load_backends(const toml::table& backends, Loader& L);
void load_defaults(const toml::table& defaults, Loader& L);
void load_rules(const toml::node& rules, Loader& L);
void load_budget(const toml::table& budget, Loader& L);
// A whole document or an override fragment: every top-level section in dependency order.
void load_root(const toml::table& root, Loader& L);

}  // namespace allocshim::policy::detail
