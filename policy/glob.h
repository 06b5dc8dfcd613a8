// Callsite globs: fnmatch-style `*`, `?` and `[...]` over the names of a call stack's frames.
#pragma once

#include <string>
#include <string_view>

namespace allocshim::policy {

// True when `pattern` matches all of `name`. `*` matches any run of characters (including '/' and
// ':', so "*thrust*" matches "thrust::detail::..."), `?` one character, `[abc]`, `[a-z]`, `[!x]`
// (or `[^x]`) one character of (or not of) a set; `\x` matches x literally.
bool glob_match(std::string_view pattern, std::string_view name);

// True when `pattern` matches one of the '\n'-separated names in `frames`.
bool callsite_match(std::string_view pattern, std::string_view frames);

// Checks a pattern's syntax (an unterminated `[`, a trailing `\`); sets `error` when invalid.
bool glob_valid(std::string_view pattern, std::string& error);

// True when the pattern is only stars: it matches every name.
bool glob_matches_all(std::string_view pattern);

}  // namespace allocshim::policy
