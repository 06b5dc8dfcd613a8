// ALLOCSHIM_BACKEND / ALLOCSHIM_CONF overrides.
#include <gtest/gtest.h>

#include "policy/policy.h"
#include "test_util.h"

namespace allocshim::policy {
namespace {

using test::backend_name;
using test::must_load;

constexpr const char* kFile = R"(
[defaults]
backend = "pool"
free_sync = "barrier"
[backends.pool]
kind = "async_pool"
release_threshold = "1GiB"
[[rules]]
size = ">= 256MiB"
backend = "vmm"
[budget]
device = "40GiB"
)";

LoadOptions all_kinds() {
  LoadOptions o;
  o.kinds = kAllKinds;
  return o;
}

std::string fail(Policy& p, const char* backend, const char* conf) {
  std::vector<Diagnostic> errors;
  EXPECT_FALSE(apply_overrides(p, backend, conf, errors, all_kinds()));
  std::string joined;
  for (const Diagnostic& d : errors) joined += d.str() + "\n";
  return joined;
}

void ok(Policy& p, const char* backend, const char* conf) {
  std::vector<Diagnostic> errors;
  EXPECT_TRUE(apply_overrides(p, backend, conf, errors, all_kinds()))
      << (errors.empty() ? "" : errors[0].str());
}

TEST(Overrides, NothingSetChangesNothing) {
  Policy p = must_load(kFile);
  const std::string before = to_toml(p);
  ok(p, nullptr, nullptr);
  ok(p, "", "");
  ok(p, nullptr, " , ,");
  EXPECT_EQ(to_toml(p), before);
}

TEST(Overrides, BackendServesEverything) {
  Policy p = must_load(kFile);
  ok(p, "managed", nullptr);
  EXPECT_TRUE(p.rules.empty());
  EXPECT_EQ(backend_name(p, p.default_backend), "managed");
  EXPECT_EQ(match(p, 1ull << 30, Api::alloc, 0).backend, p.default_backend);
  // A backend the file defines, by name.
  Policy q = must_load(kFile);
  ok(q, " pool ", nullptr);
  EXPECT_EQ(backend_name(q, q.default_backend), "pool");
  EXPECT_EQ(q.backends[0].release_threshold, 1ull << 30);
}

TEST(Overrides, ConfSetsDottedKeys) {
  Policy p = must_load(kFile);
  ok(p, nullptr,
     "free_sync=none, budget.device=8GiB,backends.pool.release_threshold=max,"
     "backends.pool.ipc=true,trace.path=/tmp/t-%p,trace.sample=4,log.level=debug,"
     "reload.watch=1,reload.interval_ms=100,budget.spill=managed");
  EXPECT_EQ(p.default_free_sync, FreeSync::none);
  EXPECT_EQ(p.budget.device, 8ull << 30);
  EXPECT_EQ(p.budget.spill, Budget::Spill::managed);
  EXPECT_EQ(p.backends[0].release_threshold, kUnlimited);
  EXPECT_EQ(p.backends[0].ipc, std::optional<bool>(true));
  EXPECT_EQ(p.trace.path, "/tmp/t-%p");
  EXPECT_EQ(p.trace.sample, 4u);
  EXPECT_EQ(p.log.level, Log::Level::debug);
  EXPECT_TRUE(p.reload.watch);
  EXPECT_EQ(p.reload.interval_ms, 100u);
  EXPECT_EQ(p.rules.size(), 1u);  // untouched
}

TEST(Overrides, PerDeviceBudgetAndNewBackends) {
  Policy p = must_load(kFile);
  ok(p, nullptr,
     "budget.device.1=50%,backends.huge.kind=vmm,backends.huge.chunk=64MiB,backend=huge");
  EXPECT_EQ(p.budget.device, 40ull << 30);
  ASSERT_EQ(p.budget.per_device_percent.size(), 1u);
  EXPECT_EQ(p.budget.per_device_percent[0].first, 1);
  EXPECT_EQ(budget_for(p.budget, 1, 80ull << 30), 40ull << 30);
  EXPECT_EQ(backend_name(p, p.default_backend), "huge");
  EXPECT_EQ(p.backends[static_cast<std::size_t>(p.default_backend)].chunk, 64ull << 20);
}

TEST(Overrides, PrecedenceFileThenBackendThenConfLeftToRight) {
  Policy p = must_load(kFile);
  ok(p, "vmm", "backend=pool,backend=managed");
  EXPECT_EQ(backend_name(p, p.default_backend), "managed");
  Policy q = must_load(kFile);
  ok(q, "vmm", "free_sync=device,free_sync=none");
  EXPECT_EQ(backend_name(q, q.default_backend), "vmm");
  EXPECT_EQ(q.default_free_sync, FreeSync::none);
}

TEST(Overrides, ErrorsAreLocatedInTheVariable) {
  Policy p = must_load(kFile);
  //                           1234567890123456789012345678901234567890
  EXPECT_EQ(fail(p, nullptr, "free_sync=nope,budget.devic=8GiB, junk ,budget.device=12XB"),
            "ALLOCSHIM_CONF:1:11: \"free_sync\" must be \"device\", \"barrier\" or \"none\", not "
            "\"nope\"; did you mean \"none\"?\n"
            "ALLOCSHIM_CONF:1:16: unknown key \"devic\" in [budget]; did you mean \"device\"?\n"
            "ALLOCSHIM_CONF:1:35: expected KEY=VALUE, not \"junk\"\n"
            "ALLOCSHIM_CONF:1:55: bad size \"12XB\" for \"budget.device\": unknown unit \"XB\" "
            "(use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)\n");
  EXPECT_EQ(fail(p, "  poool", nullptr),
            "ALLOCSHIM_BACKEND:1:3: unknown backend \"poool\"; did you mean \"pool\"?\n");
  EXPECT_EQ(fail(p, nullptr, "rules.size=1"),
            "ALLOCSHIM_CONF:1:1: rules cannot be set from ALLOCSHIM_CONF (edit the policy file)\n");
  EXPECT_EQ(fail(p, nullptr, "a..b=1"),
            "ALLOCSHIM_CONF:1:1: bad key \"a..b\": expected a dotted name such as "
            "\"budget.device\"\n");
  EXPECT_EQ(fail(p, nullptr, "backends.pool.kind=vmm"),
            "ALLOCSHIM_CONF:1:20: cannot change the kind of backend \"pool\" (async_pool) from "
            "the environment\n");
  EXPECT_EQ(fail(p, nullptr, "backends.pool.chunk=4MiB"),
            "ALLOCSHIM_CONF:1:1: option \"chunk\" is not valid for kind \"async_pool\" (its "
            "options: release_threshold, initial, ipc)\n");
  EXPECT_EQ(fail(p, nullptr, "reload.watch=maybe"),
            "ALLOCSHIM_CONF:1:14: \"watch\" must be true or false, not \"maybe\"\n");
  EXPECT_EQ(fail(p, nullptr, "trace.sample=0x10"),
            "ALLOCSHIM_CONF:1:14: \"sample\" must be an integer, not \"0x10\"\n");
}

TEST(Overrides, AllOrNothing) {
  Policy p = must_load(kFile);
  const std::string before = to_toml(p);
  fail(p, "vmm", "free_sync=none,budget.device=lots");
  EXPECT_EQ(to_toml(p), before);
}

TEST(Overrides, KindsThisBuildLacksAreRejected) {
  Policy p = must_load("");
  std::vector<Diagnostic> errors;
  LoadOptions native_only;
  native_only.kinds = 1u << static_cast<unsigned>(BackendKind::native);
  EXPECT_FALSE(apply_overrides(p, "managed", nullptr, errors, native_only));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].str(),
            "ALLOCSHIM_BACKEND:1:1: backend kind \"managed\" is not implemented yet in this build");
  errors.clear();
  EXPECT_FALSE(apply_overrides(p, nullptr, "x=1,backends.b.kind=async_pool", errors, native_only));
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[1].str(),
            "ALLOCSHIM_CONF:1:21: backend kind \"async_pool\" is not implemented "
            "yet in this build");
}

}  // namespace
}  // namespace allocshim::policy
