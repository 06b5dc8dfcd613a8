// Loading is linear in the policy's size: every backend reference resolves through a hash index of
// names, so the names compared stay a small constant per backend and rule however many there are (a
// search through the list compares about n^2 / 2 names; 64k backends took 22 s that way).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "policy/loader.h"

namespace allocshim::policy::detail {
namespace {

// `n` backends and one rule per backend referring to it by name.
std::string many_backends(int n) {
  std::string text;
  for (int i = 0; i < n; ++i) text += "[backends.b" + std::to_string(i) + "]\nkind = \"vmm\"\n";
  text += "[defaults]\nbackend = \"b" + std::to_string(n - 1) + "\"\n";
  for (int i = 0; i < n; ++i)
    text += "[[rules]]\nsize = \"<= " + std::to_string(i + 1) + "MiB\"\nbackend = \"b" +
            std::to_string(i) + "\"\n";
  return text;
}

std::size_t comparisons_to_load(int n) {
  const std::string text = many_backends(n);
  toml::parse_result parsed = toml::parse(std::string_view(text), std::string_view("many.toml"));
  EXPECT_TRUE(static_cast<bool>(parsed));
  std::vector<Diagnostic> errors;
  Reporter report("many.toml", errors);
  Policy p;
  LoadOptions options;
  Loader L{report, p, options};
  load_root(parsed.table(), L);
  EXPECT_EQ(report.count(), 0u) << (errors.empty() ? "" : errors[0].str());
  EXPECT_EQ(p.backends.size(), static_cast<std::size_t>(n));
  EXPECT_EQ(p.rules.size(), static_cast<std::size_t>(n));
  if (p.rules.size() == static_cast<std::size_t>(n)) {
    EXPECT_EQ(p.rules[static_cast<std::size_t>(n / 2)].backend, n / 2);
  }
  return L.name_comparisons;
}

TEST(PolicyScale, NamesComparedGrowLinearlyWithBackends) {
  const std::size_t small = comparisons_to_load(2000);
  const std::size_t large = comparisons_to_load(8000);
  // Each backend and each rule resolves with a hash lookup: a few comparisons each (collisions in
  // a bucket add some); a list search would need millions here.
  EXPECT_LE(small, 4u * 2 * 2000);
  EXPECT_LE(large, 4u * 2 * 8000);
  EXPECT_GE(large, 8000u);  // every rule finds its backend: one comparison at least
}

}  // namespace
}  // namespace allocshim::policy::detail

namespace allocshim::policy {
namespace {

// The shadowed-rule check finds covering rules through per-shape size staircases: it still names
// the first rule that covers, across shapes (an api-less rule covers one with an api).
TEST(PolicyScale, ShadowedRulesNameTheFirstRuleThatCovers) {
  const std::string text =
      "[[rules]]\nsize = \"<= 10MiB\"\nbackend = \"native\"\n"
      "[[rules]]\nsize = \"<= 100MiB\"\nbackend = \"native\"\n"
      "[[rules]]\nsize = \"<= 5MiB\"\napi = \"alloc\"\nbackend = \"native\"\n"
      "[[rules]]\nsize = \">= 200MiB\"\nbackend = \"native\"\n"
      "[[rules]]\nsize = \"<= 50MiB\"\nbackend = \"native\"\n";
  Policy p;
  std::vector<Diagnostic> errors;
  EXPECT_FALSE(load_string(text, "shadow.toml", p, errors));
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[0].str().find("rule 3 can never match: rule 1 (line 1)"), std::string::npos)
      << errors[0].str();
  EXPECT_NE(errors[1].str().find("rule 5 can never match: rule 2 (line 4)"), std::string::npos)
      << errors[1].str();
}

}  // namespace
}  // namespace allocshim::policy
