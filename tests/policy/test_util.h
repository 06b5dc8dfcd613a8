// Helpers shared by the policy tests.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "policy/policy.h"

namespace allocshim::policy::test {

// Loads `text` accepting every backend kind, so the tests do not depend on which kinds this build
// implements (the tests of that use explicit LoadOptions).
inline Policy must_load(std::string_view text, const std::string& name = "t.toml") {
  Policy p;
  std::vector<Diagnostic> errors;
  LoadOptions all;
  all.kinds = kAllKinds;
  const bool ok = load_string(text, name, p, errors, all);
  std::string joined;
  for (const Diagnostic& d : errors) joined += d.str() + "\n";
  EXPECT_TRUE(ok) << joined;
  return p;
}

// The diagnostics of a policy that must not load, one per line.
inline std::string errors_of(std::string_view text, const std::string& name = "t.toml",
                             std::uint32_t kinds = kAllKinds) {
  Policy p;
  std::vector<Diagnostic> errors;
  LoadOptions options;
  options.kinds = kinds;
  EXPECT_FALSE(load_string(text, name, p, errors, options)) << "loaded:\n" << text;
  std::string joined;
  for (const Diagnostic& d : errors) joined += d.str() + "\n";
  return joined;
}

inline const std::string& backend_name(const Policy& p, int index) {
  return p.backends.at(static_cast<std::size_t>(index)).name;
}

}  // namespace allocshim::policy::test
