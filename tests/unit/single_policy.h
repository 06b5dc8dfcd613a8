// Policies for core tests on the fake driver: the one most start from (single), and one read from
// TOML text (parsed).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "policy/policy.h"

namespace allocshim::testing {

inline policy::Policy single(BackendKind kind, FreeSync sync = FreeSync::device) {
  policy::Policy p;
  policy::BackendSpec s;
  s.name = backend_kind_name(kind);
  s.kind = kind;
  p.backends.push_back(s);
  p.default_backend = 0;
  p.default_free_sync = sync;
  p.source = "<test>";
  return p;
}

// The policy in `text`, every backend kind allowed (routing is under test, not which kinds this
// build has switched on); each diagnostic fails the calling test, named after `file`.
inline policy::Policy parsed(const std::string& text, const char* file) {
  policy::Policy p;
  std::vector<policy::Diagnostic> errors;
  EXPECT_TRUE(policy::load_string(text, file, p, errors, policy::LoadOptions{policy::kAllKinds}));
  for (const auto& e : errors) ADD_FAILURE() << e.str();
  return p;
}

}  // namespace allocshim::testing
