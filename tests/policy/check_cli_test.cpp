// `allocshim check` end to end: exit codes, what goes to stdout and to stderr.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "policy/policy.h"

namespace {

struct Result {
  int status = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Runs `allocshim ARGS` in `dir` with a clean override environment plus `env`.
Result check(const std::string& args, const std::string& env = "",
             const std::string& dir = POLICY_CORPUS) {
  const std::string err_file = std::filesystem::temp_directory_path() /
                               ("allocshim-check-" + std::to_string(getpid()) + ".err");
  const std::string cmd = "cd '" + dir + "' && env -u ALLOCSHIM_BACKEND -u ALLOCSHIM_CONF " + env +
                          " '" + ALLOCSHIM_BIN + "' check " + args + " 2>'" + err_file + "'";
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = slurp(err_file);
  std::remove(err_file.c_str());
  return r;
}

// What `allocshim ARGS` prints on stdout; the test fails unless it exits 0.
std::string output_of(const std::string& args) {
  const Result r = check(args);
  EXPECT_EQ(r.status, 0) << args << ":\n" << r.err;
  return r.out;
}

TEST(CheckCli, ValidFilePrintsTheNormalizedPolicy) {
  const Result r = check("ranges.toml");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, slurp(std::string(POLICY_CORPUS) + "/ranges.expected"));
  EXPECT_EQ(r.err, "");
}

TEST(CheckCli, InvalidFilePrintsEveryErrorOnStderrAndExitsOne) {
  const Result r = check("unknown_keys.toml");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, slurp(std::string(POLICY_CORPUS) + "/unknown_keys.expected"));
}

TEST(CheckCli, UsageErrorsAndUnreadableFilesExitTwo) {
  EXPECT_EQ(check("no-such-file.toml").status, 2);
  EXPECT_EQ(check("--explain 12XB").status, 2);
  EXPECT_EQ(check("--explain 1MiB --api malloc").status, 2);
  EXPECT_EQ(check("--bogus").status, 2);
  const Result r = check("--explain 12XB");
  EXPECT_NE(r.err.find("bad --explain size \"12XB\""), std::string::npos) << r.err;
}

TEST(CheckCli, PrintDefault) {
  EXPECT_EQ(output_of("--print-default"), allocshim::policy::default_policy_text());
}

TEST(CheckCli, Explain) {
  EXPECT_EQ(output_of("issue_example.toml --explain 300MiB --device 1 --callsite main "
                      "--callsite 'thrust::sort'"),
            "size 300MiB api alloc device 1 callsite \"main\" \"thrust::sort\" -> backend \"big\" "
            "(vmm), free_sync device: rule 1 at issue_example.toml:13:1 (size >= 256MiB, api "
            "alloc, device 0,1, callsite \"*thrust*\")\n");
  EXPECT_EQ(output_of("issue_example.toml --explain 1KiB --api async"),
            "size 1KiB api async device 0 -> backend \"pool\" (async_pool), free_sync barrier: "
            "defaults (no rule matched)\n"
            "  rule 1 at issue_example.toml:13:1 skipped: size 1KiB is not >= 256MiB\n");
  // Without a file: the embedded default.
  EXPECT_NE(output_of("--explain 1GiB").find("defaults (no rule matched)"), std::string::npos);
}

TEST(CheckCli, EnvironmentOverridesApplyUnlessNoEnv) {
  Result r = check("ranges.toml", "ALLOCSHIM_CONF=free_sync=none");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("free_sync = \"none\"\n\n[backends"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "allocshim check: applied ALLOCSHIM_CONF=free_sync=none\n");
  r = check("ranges.toml --no-env", "ALLOCSHIM_CONF=free_sync=none");
  EXPECT_EQ(r.out, slurp(std::string(POLICY_CORPUS) + "/ranges.expected"));
  r = check("ranges.toml", "ALLOCSHIM_CONF=free_sync=nope");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err,
            "ALLOCSHIM_CONF:1:11: \"free_sync\" must be \"device\", \"barrier\" or \"none\", "
            "not \"nope\"; did you mean \"none\"?\n");
}

// The literal promise of examples/policies/: `allocshim check FILE` passes.
TEST(CheckCli, EveryExamplePolicyPassesCheck) {
  int examples = 0;
  for (const auto& e : std::filesystem::directory_iterator(POLICY_EXAMPLES)) {
    if (e.path().extension() != ".toml") continue;
    ++examples;
    const Result r = check("'" + e.path().string() + "'");
    EXPECT_EQ(r.status, 0) << e.path() << ":\n" << r.err;
  }
  EXPECT_GE(examples, 4);
}

}  // namespace
