// Loading: located errors, "all of them", implemented kinds, normalization, the default policy.
#include <gtest/gtest.h>

#include "policy/policy.h"
#include "test_util.h"

namespace allocshim::policy {
namespace {

using test::backend_name;
using test::errors_of;
using test::must_load;

TEST(Diagnostic, Format) {
  EXPECT_EQ((Diagnostic{"a.toml", 3, 7, "bad"}).str(), "a.toml:3:7: bad");
  EXPECT_EQ((Diagnostic{"a.toml", 0, 0, "cannot read policy file: x"}).str(),
            "a.toml: cannot read policy file: x");
}

TEST(Load, ReportsEveryErrorSortedByPosition) {
  const std::string errors =
      errors_of("[log]\nlevel = \"loud\"\n[defaults]\nfree_sync = \"never\"\nbackend = 3\n");
  EXPECT_EQ(
      errors,
      "t.toml:2:9: \"level\" must be \"error\", \"warn\", \"info\" or \"debug\", not \"loud\"\n"
      "t.toml:4:13: \"free_sync\" must be \"device\", \"barrier\" or \"none\", not \"never\"\n"
      "t.toml:5:11: \"backend\" must be a string naming a backend or a kind, not an integer\n");
}

// pin_ahead fills the host reserve for demotions: refused where neither exists, accepted with both,
// whichever of [budget] and [backends.host] comes first.
TEST(Load, PinAheadNeedsAutoMigrationAndAHostReserve) {
  const char* head = "[budget]\ndevice = \"8GiB\"\nspill = \"host\"\n";
  EXPECT_EQ(
      errors_of(std::string(head) +
                "migrate = \"auto\"\n[backends.host]\nhost_reserve = 0\npin_ahead = true\n"),
      "t.toml:7:13: pin_ahead = true needs a host_reserve above 0 (what it pins ahead is kept "
      "there)\n");
  EXPECT_EQ(errors_of(std::string(head) + "[backends.host]\npin_ahead = true\n"),
            "t.toml:5:13: pin_ahead = true needs migrate = \"auto\" in [budget] (it prepares host "
            "memory for demotions)\n");
  EXPECT_EQ(errors_of("[backends.host]\npin_ahead = true\n" + std::string(head) +
                      "migrate = \"promote\"\n"),
            "t.toml:2:13: pin_ahead = true needs migrate = \"auto\" in [budget] (it prepares host "
            "memory for demotions)\n");
  EXPECT_EQ(errors_of("[backends.host]\npin_ahead = \"yes\"\n"),
            "t.toml:2:13: \"pin_ahead\" must be a boolean, not a string\n");
  const Policy p = must_load("[backends.host]\npin_ahead = true\npin_ahead_idle_ms = 500\n" +
                             std::string(head) + "migrate = \"auto\"\n");
  EXPECT_TRUE(p.host_side().pin_ahead);
  EXPECT_EQ(p.host_side().pin_ahead_idle_ms, 500u);
  EXPECT_FALSE(must_load("").host_side().pin_ahead) << "off by default";
  EXPECT_EQ(must_load("").host_side().host_reserve, std::uint64_t{4} << 30);
}

// The host side of the spill target left [budget]: an old policy is told where each key went, once.
TEST(Load, TheSpillTargetsHostSettingsLiveInBackendsHost) {
  EXPECT_EQ(errors_of("[budget]\nhost_reserve = \"1GiB\"\npin_threads = 2\n"),
            "t.toml:2:16: \"host_reserve\" is a setting of the host spill target now: set it in "
            "[backends.host] (with kind = \"host\")\n"
            "t.toml:3:15: \"pin_threads\" is a setting of the host spill target now: set it in "
            "[backends.host] (with kind = \"host\")\n");
  EXPECT_EQ(errors_of("[backends.other]\nkind = \"host\"\nhost_reserve = \"1GiB\"\n"),
            "t.toml:3:1: option \"host_reserve\" sets the budget's host spill target: only "
            "[backends.host] takes it\n");
  EXPECT_EQ(
      errors_of("[backends.vmm]\nhost_reserve = \"1GiB\"\n"),
      "t.toml:2:1: option \"host_reserve\" is not valid for kind \"vmm\" (its options: chunk, "
      "reserve, release_threshold, thread_cache)\n");
  const Policy p = must_load("[backends.host]\nhost_reserve = \"1GiB\"\npin_threads = 2\n");
  EXPECT_EQ(p.host_side().host_reserve, std::uint64_t{1} << 30);
  EXPECT_EQ(p.host_side().pin_threads, 2u);
}

TEST(Load, LeavesTheOutputUntouchedOnError) {
  Policy p = must_load("[defaults]\nbackend = \"vmm\"\n");
  const std::string before = to_toml(p);
  std::vector<Diagnostic> errors;
  EXPECT_FALSE(load_string("[defaults]\nbackend = \"nope\"\n", "x", p, errors));
  EXPECT_EQ(to_toml(p), before);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].line, 2);
  EXPECT_EQ(errors[0].column, 11);
}

TEST(Load, KindsThisBuildLacksAreRejectedWhereNamed) {
  const std::uint32_t native_only = 1u << static_cast<unsigned>(BackendKind::native);
  EXPECT_EQ(errors_of("[backends.big]\nkind = \"vmm\"\n", "p.toml", native_only),
            "p.toml:2:8: backend kind \"vmm\" is not implemented yet in this build\n");
  EXPECT_EQ(errors_of("[defaults]\nbackend = \"async_pool\"\n\n[[rules]]\napi = \"managed\"\n"
                      "backend = \"managed\"\n",
                      "p.toml", native_only),
            "p.toml:2:11: backend kind \"async_pool\" is not implemented yet in this build\n"
            "p.toml:6:11: backend kind \"managed\" is not implemented yet in this build\n");
  // Native is always there.
  Policy p;
  std::vector<Diagnostic> errors;
  LoadOptions options;
  options.kinds = native_only;
  EXPECT_TRUE(load_string("[defaults]\nbackend = \"native\"\n", "p.toml", p, errors, options));
}

TEST(Load, DefaultOptionsFollowKindImplemented) {
  EXPECT_TRUE(kind_implemented(BackendKind::native));
  EXPECT_EQ(LoadOptions{}.kinds, implemented_kinds());
  for (int k = 0; k < kBackendKindCount; ++k) {
    const auto kind = static_cast<BackendKind>(k);
    const std::string text =
        std::string("[backends.b]\nkind = \"") + backend_kind_name(kind) + "\"\n";
    Policy p;
    std::vector<Diagnostic> errors;
    EXPECT_EQ(load_string(text, "k.toml", p, errors), kind_implemented(kind))
        << backend_kind_name(kind);
    if (!kind_implemented(kind)) {
      ASSERT_EQ(errors.size(), 1u);
      EXPECT_EQ(errors[0].str(), std::string("k.toml:2:8: backend kind \"") +
                                     backend_kind_name(kind) +
                                     "\" is not implemented yet in this build");
    }
  }
}

TEST(Load, BackendsKeepFileOrderAndKindNamesAreImplicit) {
  const Policy p = must_load(R"(
[backends.zeta]
kind = "vmm"
[backends.alpha]
kind = "async_pool"
[[rules]]
size = "< 1KiB"
backend = "managed"
)");
  ASSERT_EQ(p.backends.size(), 4u);
  EXPECT_EQ(p.backends[0].name, "zeta");
  EXPECT_EQ(p.backends[1].name, "alpha");
  EXPECT_EQ(p.backends[2].name, "vmm");  // the implicit default: the embedded default's
  EXPECT_EQ(p.backends[2].kind, BackendKind::vmm);
  EXPECT_EQ(p.backends[3].name, "managed");
  EXPECT_EQ(p.backends[3].kind, BackendKind::managed);
  EXPECT_EQ(backend_name(p, p.default_backend), "vmm");
  EXPECT_EQ(p.default_free_sync, FreeSync::device);
}

// No file and an empty file are the same policy: a file starts from the embedded default.
TEST(Load, AnEmptyFileIsTheEmbeddedDefault) {
  const Policy empty = must_load("");
  EXPECT_EQ(to_toml(empty).substr(to_toml(empty).find('\n')),
            to_toml(default_policy()).substr(to_toml(default_policy()).find('\n')));
  // A backend of the file named like the default's kind is the file's tuning of it.
  const Policy tuned = must_load("[backends.vmm]\nkind = \"vmm\"\nchunk = \"4MiB\"\n");
  ASSERT_EQ(tuned.backends.size(), 1u);
  EXPECT_EQ(tuned.default_backend, 0);
  EXPECT_EQ(tuned.backends[0].chunk, 4u << 20);
}

TEST(Load, KindOptionsLandInTheSpec) {
  const Policy p = must_load(R"(
[backends.pool]
kind = "async_pool"
release_threshold = "1GiB"
initial = "512MiB"
ipc = true
[backends.big]
kind = "vmm"
chunk = "4MiB"
reserve = "64GiB"
release_threshold = "max"
thread_cache = "8MiB"
[backends.um]
kind = "managed"
read_mostly = true
preferred_location = "host"
accessed_by = true
prefetch = true
stripe = 0.25
[backends.um2]
kind = "managed"
stripe = "auto"
)");
  const BackendSpec& pool = p.backends[0];
  EXPECT_EQ(pool.release_threshold, 1ull << 30);
  EXPECT_EQ(pool.initial, 512ull << 20);
  EXPECT_EQ(pool.ipc, std::optional<bool>(true));
  const BackendSpec& big = p.backends[1];
  EXPECT_EQ(big.chunk, 4ull << 20);
  EXPECT_EQ(big.reserve, 64ull << 30);
  EXPECT_EQ(big.vmm_release_threshold, kUnlimited);
  EXPECT_EQ(big.thread_cache, 8ull << 20);
  EXPECT_EQ(big.release_threshold, kUnlimited);  // the async_pool field is left alone
  const BackendSpec& um = p.backends[2];
  EXPECT_TRUE(um.read_mostly);
  EXPECT_EQ(um.preferred_location, BackendSpec::Preferred::host);
  EXPECT_TRUE(um.accessed_by);
  EXPECT_TRUE(um.prefetch);
  EXPECT_EQ(um.stripe, 0.25);
  EXPECT_EQ(p.backends[3].stripe, kStripeAuto);
}

// Inputs that reach undefined behaviour inside toml++ 3.3 (its unicode whitespace table) are
// stopped before it with located errors. Under UBSan these tests would abort otherwise.
TEST(Load, NonAsciiWhereToml33MisbehavesIsAnError) {
  EXPECT_EQ(errors_of("\xcc\xaa"),
            "t.toml:1:1: syntax error: unexpected character U+032A (outside strings and comments "
            "TOML allows only ASCII)\n");
  EXPECT_EQ(errors_of("a = 1 \xef\xba\xbf"),
            "t.toml:1:7: syntax error: unexpected character U+FEBF (outside strings and comments "
            "TOML allows only ASCII)\n");
  EXPECT_EQ(errors_of("s = \"\"\"\\\n\xc2\xa7\"\"\"\n"),
            "t.toml:2:1: a line continued with a backslash inside a \"\"\" string cannot start "
            "with U+00A7 (a toml++ 3.3 bug); write it as a \\u escape\n");
  EXPECT_EQ(errors_of("s = \"\"\"\\\xc2\xa7\"\"\"\n"),
            "t.toml:1:9: syntax error: invalid escape sequence \"\\U+00A7\" in a \"\"\" string\n");
  // Inside a bare value toml++ scans on past '=', quotes and brackets up to a terminator.
  EXPECT_EQ(errors_of(" 0d =0x=\"\"\"\"\x0e\xc2\xa7="),
            "t.toml:1:14: syntax error: unexpected character U+00A7 (outside strings and comments "
            "TOML allows only ASCII)\n");
  EXPECT_EQ(errors_of("a = 0[\"\"\"\xc2\xa7\"\"\"\n"),
            "t.toml:1:10: syntax error: unexpected character U+00A7 (outside strings and comments "
            "TOML allows only ASCII)\n");
  // The same characters inside strings and comments are fine.
  const Policy p = must_load(
      "# \xc2\xa7\n[trace]\npath = '\xc2\xa7' # \xcc\xaa\n"
      "[[rules]]\ncallsite = \"\"\"\xc2\xa7\\u00e9\"\"\"\nbackend = \"vmm\"\n");
  EXPECT_EQ(p.trace.path, "\xc2\xa7");
  EXPECT_EQ(p.rules[0].callsite, "\xc2\xa7\xc3\xa9");
}

TEST(Load, UnreadableFile) {
  Policy p;
  std::vector<Diagnostic> errors;
  EXPECT_FALSE(load_file("/nonexistent/policy.toml", p, errors));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].str(),
            "/nonexistent/policy.toml: cannot read policy file: No such file or directory");
  errors.clear();
  EXPECT_FALSE(load_file("/", p, errors));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].str(), "/: cannot read policy file: is a directory");
}

TEST(Load, NormalizedFormLoadsBackToTheSamePolicy) {
  const char* texts[] = {
      "",
      "[defaults]\nbackend = \"pool\"\n[backends.pool]\nkind = \"async_pool\"\nipc = true\n",
      // One element (clang's -Wstring-concatenation would take two literals for a missing comma).
      ("[[rules]]\nsize = \"> 1MiB\"\napi = [\"pitch\", \"alloc\"]\ndevice = [3, 1]\n"
       "callsite = \"*\\\"quoted\\\"*\"\nfree_sync = \"none\"\n"),
      "[budget]\ndevice = { 2 = \"12.5%\", default = \"1.5GiB\", 0 = 4096 }\nspill = \"host\"\n",
      "[trace]\npath = \"a\\tb\"\nstacks = \"python\"\nsample = 7\n[reload]\nwatch = true\n",
  };
  for (const char* text : texts) {
    const Policy p = must_load(text, "n.toml");
    const std::string once = to_toml(p);
    const Policy q = must_load(once, "n.toml");
    EXPECT_EQ(to_toml(q), once) << text;
  }
}

TEST(DefaultPolicy, IsParsedFromItsTextWithThisBuildsKinds) {
  // With the build's own kinds: a default naming a kind not implemented yet would fall back to
  // plain native silently at run time, so it fails here instead.
  Policy fresh;
  std::vector<Diagnostic> errors;
  ASSERT_TRUE(load_string(default_policy_text(), "<default>", fresh, errors))
      << (errors.empty() ? "" : errors[0].str());
  const Policy& d = default_policy();
  EXPECT_EQ(to_toml(d), to_toml(fresh));
  EXPECT_EQ(d.source, "<default>");
  ASSERT_FALSE(d.backends.empty());
  EXPECT_FALSE(d.uses_callsite());   // the default never costs a stack capture
  EXPECT_EQ(&default_policy(), &d);  // built once
}

}  // namespace
}  // namespace allocshim::policy
