// Matching: rule order, conditions, inheritance from [defaults], explanations, budgets.
#include <gtest/gtest.h>

#include "policy/glob.h"
#include "policy/policy.h"
#include "test_util.h"

namespace allocshim::policy {
namespace {

using test::backend_name;
using test::must_load;
constexpr std::uint64_t MiB = 1ull << 20;

constexpr const char* kPolicy = R"(
[defaults]
backend = "pool"
free_sync = "barrier"

[backends.pool]
kind = "async_pool"

[backends.big]
kind = "vmm"

[[rules]]
size = ">= 256MiB"
api = "alloc"
device = [0, 1]
backend = "big"
free_sync = "device"

[[rules]]
size = "< 1MiB"
callsite = "*thrust*"
free_sync = "none"

[[rules]]
api = ["managed"]
backend = "managed"

[[rules]]
size = ">= 1MiB"
backend = "native"
)";

TEST(Match, FirstMatchWinsInFileOrder) {
  const Policy p = must_load(kPolicy);
  // 300 MiB matches rule 1 and rule 4; rule 1 comes first.
  Decision d = match(p, 300 * MiB, Api::alloc, 0);
  EXPECT_EQ(d.rule, 0);
  EXPECT_EQ(backend_name(p, d.backend), "big");
  EXPECT_EQ(d.free_sync, FreeSync::device);
  // Not alloc: rule 1 does not apply, rule 4 does.
  d = match(p, 300 * MiB, Api::async, 0);
  EXPECT_EQ(d.rule, 3);
  EXPECT_EQ(backend_name(p, d.backend), "native");
  EXPECT_EQ(d.free_sync, FreeSync::barrier);  // the rule sets no free_sync: the default's
}

TEST(Match, DeviceCondition) {
  const Policy p = must_load(kPolicy);
  EXPECT_EQ(match(p, 300 * MiB, Api::alloc, 1).rule, 0);
  EXPECT_EQ(match(p, 300 * MiB, Api::alloc, 2).rule, 3);
  // Ids outside the mask's range only match rules without a device condition.
  EXPECT_EQ(match(p, 300 * MiB, Api::alloc, -1).rule, 3);
  EXPECT_EQ(match(p, 300 * MiB, Api::alloc, 64).rule, 3);
  EXPECT_EQ(match(p, 300 * MiB, Api::alloc, 1000).rule, 3);
}

TEST(Match, CallsiteRuleNeedsAMatchingFrame) {
  const Policy p = must_load(kPolicy);
  EXPECT_TRUE(p.uses_callsite());
  Decision d = match(p, 4096, Api::alloc, 0, "main\nthrust::detail::allocate\nlibfoo.so");
  EXPECT_EQ(d.rule, 1);
  // A rule without a backend uses the default backend.
  EXPECT_EQ(backend_name(p, d.backend), "pool");
  EXPECT_EQ(d.free_sync, FreeSync::none);
  d = match(p, 4096, Api::alloc, 0, "main\nat::empty");
  EXPECT_EQ(d.rule, -1);
  d = match(p, 4096, Api::alloc, 0);
  EXPECT_EQ(d.rule, -1);
  EXPECT_EQ(backend_name(p, d.backend), "pool");
  EXPECT_EQ(d.free_sync, FreeSync::barrier);
}

TEST(Match, SizeBoundariesAreExact) {
  const Policy p = must_load(kPolicy);
  EXPECT_EQ(match(p, 256 * MiB - 1, Api::alloc, 0).rule, 3);
  EXPECT_EQ(match(p, 256 * MiB, Api::alloc, 0).rule, 0);
  EXPECT_EQ(match(p, MiB - 1, Api::alloc, 0, "thrust").rule, 1);
  EXPECT_EQ(match(p, MiB, Api::alloc, 0, "thrust").rule, 3);
  EXPECT_EQ(match(p, 0, Api::managed, 0).rule, 2);
}

TEST(Match, ApiCondition) {
  const Policy p = must_load(kPolicy);
  const Decision d = match(p, 4096, Api::managed, 0);
  EXPECT_EQ(d.rule, 2);
  EXPECT_EQ(p.backends[static_cast<std::size_t>(d.backend)].kind, BackendKind::managed);
}

TEST(Match, NoRulesServesDefaults) {
  const Policy p = must_load("[defaults]\nbackend = \"vmm\"\nfree_sync = \"none\"\n");
  EXPECT_FALSE(p.uses_callsite());
  const Decision d = match(p, 123, Api::pitch, 3);
  EXPECT_EQ(d.rule, -1);
  EXPECT_EQ(backend_name(p, d.backend), "vmm");
  EXPECT_EQ(d.free_sync, FreeSync::none);
}

TEST(Match, RuleWithoutBackendFollowsAnOverriddenDefault) {
  Policy p = must_load(kPolicy);
  std::vector<Diagnostic> errors;
  LoadOptions all;
  all.kinds = kAllKinds;
  ASSERT_TRUE(apply_overrides(p, nullptr, "backend=big", errors, all));
  const Decision d = match(p, 4096, Api::alloc, 0, "thrust::x");
  EXPECT_EQ(d.rule, 1);
  EXPECT_EQ(backend_name(p, d.backend), "big");
}

// The shim caches each stack's callsite results as bits; matching on them must decide exactly as
// matching on the frames does.
TEST(Match, CallsiteBitsAgreeWithFrames) {
  const Policy p = must_load(kPolicy);
  const char* stacks[] = {"", "main", "main\nthrust::sort", "thrust"};
  for (const char* frames : stacks) {
    // A bit for every rule whose glob matches the stack, whatever its other conditions.
    std::uint64_t bits = 0;
    for (std::size_t i = 0; i < p.rules.size(); ++i)
      if (!p.rules[i].callsite.empty() && callsite_match(p.rules[i].callsite, frames))
        bits |= 1ull << i;
    EXPECT_EQ(bits != 0, std::string_view(frames).find("thrust") != std::string_view::npos);
    for (std::uint64_t size : {std::uint64_t{0}, std::uint64_t{4096}, MiB - 1, MiB, 300 * MiB})
      for (Api api : {Api::alloc, Api::pitch, Api::managed, Api::async})
        for (int device : {0, 1, 2}) {
          const Decision a = match(p, size, api, device, frames);
          const Decision b = match_callsite_bits(p, size, api, device, bits);
          EXPECT_EQ(a.rule, b.rule) << frames << " " << size;
          EXPECT_EQ(a.backend, b.backend);
          EXPECT_EQ(a.free_sync, b.free_sync);
        }
  }
}

TEST(Explain, NamesTheRuleAndWhyEarlierOnesSkipped) {
  const Policy p = must_load(kPolicy, "pol.toml");
  EXPECT_EQ(explain(p, 300 * MiB, Api::alloc, 0),
            "size 300MiB api alloc device 0 -> backend \"big\" (vmm), free_sync device: rule 1 at "
            "pol.toml:12:1 (size >= 256MiB, api alloc, device 0,1)\n");
  EXPECT_EQ(explain(p, 300 * MiB, Api::async, 2),
            "size 300MiB api async device 2 -> backend \"native\" (native), free_sync barrier: "
            "rule 4 at pol.toml:28:1 (size >= 1MiB)\n"
            "  rule 1 at pol.toml:12:1 skipped: api async is not listed\n"
            "  rule 2 at pol.toml:19:1 skipped: size 300MiB is not < 1MiB\n"
            "  rule 3 at pol.toml:24:1 skipped: api async is not listed\n");
  EXPECT_EQ(explain(p, 4096, Api::alloc, 0, "main\nfoo"),
            "size 4KiB api alloc device 0 callsite \"main\" \"foo\" -> backend \"pool\" "
            "(async_pool), free_sync barrier: defaults (no rule matched)\n"
            "  rule 1 at pol.toml:12:1 skipped: size 4KiB is not >= 256MiB\n"
            "  rule 2 at pol.toml:19:1 skipped: no frame matches \"*thrust*\"\n"
            "  rule 3 at pol.toml:24:1 skipped: api alloc is not listed\n"
            "  rule 4 at pol.toml:28:1 skipped: size 4KiB is not >= 1MiB\n");
  EXPECT_NE(explain(p, 300 * MiB, Api::alloc, 5).find("skipped: device 5 is not listed"),
            std::string::npos);
}

TEST(Budget, PerDeviceEntriesOverrideTheGlobalValue) {
  constexpr std::uint64_t GiB = 1ull << 30;
  const Policy p = must_load(R"(
[budget]
device = { 0 = "40GiB", 1 = "50%", default = "75%" }
)");
  EXPECT_EQ(budget_for(p.budget, 0, 80 * GiB), 40 * GiB);
  EXPECT_EQ(budget_for(p.budget, 1, 80 * GiB), 40 * GiB);
  EXPECT_EQ(budget_for(p.budget, 2, 80 * GiB), 60 * GiB);
  EXPECT_EQ(budget_for(p.budget, 2, 0), 0u);

  const Policy flat = must_load("[budget]\ndevice = \"8GiB\"\n");
  EXPECT_EQ(budget_for(flat.budget, 0, 80 * GiB), 8 * GiB);
  EXPECT_EQ(budget_for(flat.budget, 7, 80 * GiB), 8 * GiB);

  const Policy none = must_load("");
  EXPECT_EQ(budget_for(none.budget, 0, 80 * GiB), kUnlimited);

  const Policy only_one = must_load("[budget.device]\n3 = \"1GiB\"\n");
  EXPECT_EQ(budget_for(only_one.budget, 3, 80 * GiB), GiB);
  EXPECT_EQ(budget_for(only_one.budget, 0, 80 * GiB), kUnlimited);
}

}  // namespace
}  // namespace allocshim::policy
