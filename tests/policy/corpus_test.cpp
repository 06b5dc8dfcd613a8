// The policy corpus: every tests/policy/corpus/NAME.toml loads (every backend kind allowed) to
// exactly NAME.expected: the normalized policy when valid, every diagnostic otherwise. Run with
// ALLOCSHIM_UPDATE_CORPUS=1 to rewrite the .expected files after a deliberate change, then review
// the diff. Also: the example policies, and the fuzzer's seeds through the fuzzer's own checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_load.h"
#include "policy/policy.h"

namespace allocshim::policy {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<fs::path> files_in(const char* dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".toml") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string outcome(const std::string& text, const std::string& name, std::uint32_t kinds) {
  Policy p;
  std::vector<Diagnostic> errors;
  LoadOptions options;
  options.kinds = kinds;
  if (load_string(text, name, p, errors, options)) return to_toml(p);
  std::string joined;
  for (const Diagnostic& d : errors) joined += d.str() + "\n";
  return joined;
}

TEST(Corpus, EveryFileGivesExactlyItsExpectedOutput) {
  const bool update = std::getenv("ALLOCSHIM_UPDATE_CORPUS") != nullptr;
  const auto files = files_in(POLICY_CORPUS);
  ASSERT_GE(files.size(), 10u);
  int valid = 0, invalid = 0;
  for (const fs::path& file : files) {
    const std::string name = file.filename().string();
    const std::string got = outcome(read(file), name, kAllKinds);
    (got.starts_with("# allocshim policy") ? valid : invalid)++;
    fs::path expected_path = file;
    expected_path.replace_extension(".expected");
    if (update) {
      std::ofstream(expected_path, std::ios::binary) << got;
      continue;
    }
    ASSERT_TRUE(fs::exists(expected_path)) << expected_path << " is missing";
    EXPECT_EQ(got, read(expected_path)) << "for " << name;
  }
  // The corpus must keep exercising both outcomes.
  EXPECT_GE(valid, 3);
  EXPECT_GE(invalid, 8);
}

TEST(Corpus, ValidFilesRoundTripThroughTheirNormalizedForm) {
  for (const fs::path& file : files_in(POLICY_CORPUS)) {
    const std::string name = file.filename().string();
    const std::string once = outcome(read(file), name, kAllKinds);
    if (!once.starts_with("# allocshim policy")) continue;
    EXPECT_EQ(outcome(once, name, kAllKinds), once) << name;
  }
}

// Each example is a file people copy: it must be valid. With this build's kinds it must load too,
// unless the only complaint is a kind that has not landed yet (then it says which).
TEST(Examples, EveryExamplePolicyChecks) {
  const auto files = files_in(POLICY_EXAMPLES);
  ASSERT_GE(files.size(), 4u);
  for (const fs::path& file : files) {
    const std::string text = read(file);
    const std::string name = file.filename().string();
    Policy p;
    std::vector<Diagnostic> errors;
    LoadOptions all;
    all.kinds = kAllKinds;
    EXPECT_TRUE(load_string(text, name, p, errors, all))
        << name << ": " << (errors.empty() ? "" : errors[0].str());
    errors.clear();
    if (load_string(text, name, p, errors)) continue;
    for (const Diagnostic& d : errors) {
      EXPECT_NE(d.message.find("is not implemented yet in this build"), std::string::npos)
          << d.str();
      std::printf("note: %s\n", d.str().c_str());
    }
  }
}

TEST(FuzzSeeds, LoadOrGiveLocatedErrors) {
  int seeds = 0;
  for (const char* dir : {POLICY_CORPUS, POLICY_EXAMPLES}) {
    for (const fs::path& file : files_in(dir)) {
      const std::string text = read(file);
      std::string failure;
      EXPECT_TRUE(
          test::fuzz_one(reinterpret_cast<const std::uint8_t*>(text.data()), text.size(), failure))
          << file << ": " << failure;
      // The same file with overrides appended, as the fuzzer mutates them.
      const std::string with_conf = text + '\0' + "free_sync=none,budget.device=8GiB,log.leve=x";
      EXPECT_TRUE(test::fuzz_one(reinterpret_cast<const std::uint8_t*>(with_conf.data()),
                                 with_conf.size(), failure))
          << file << " + conf: " << failure;
      ++seeds;
    }
  }
  EXPECT_GE(seeds, 14);
}

// Inputs the fuzzer once crashed on, kept so the normal test suite guards the fix.
TEST(FuzzSeeds, RegressionsStayFixed) {
  int inputs = 0;
  for (const auto& e : fs::directory_iterator(POLICY_FUZZ_REGRESSIONS)) {
    const std::string data = read(e.path());
    std::string failure;
    EXPECT_TRUE(
        test::fuzz_one(reinterpret_cast<const std::uint8_t*>(data.data()), data.size(), failure))
        << e.path() << ": " << failure;
    ++inputs;
  }
  EXPECT_GE(inputs, 1);
}

}  // namespace
}  // namespace allocshim::policy
