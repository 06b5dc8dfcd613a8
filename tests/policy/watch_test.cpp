// Reloading a watched policy file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "policy/policy.h"
#include "policy/watch.h"

namespace allocshim::policy {
namespace {

class Watch : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = ::testing::TempDir() + "allocshim-watch-XXXXXX";
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = dir;
    path_ = dir_ + "/policy.toml";
  }
  void TearDown() override {
    std::remove(path_.c_str());
    std::remove((path_ + ".new").c_str());
    rmdir(dir_.c_str());
  }
  // Writes in place (same inode). Sizes differ between versions in these tests, so a change is
  // seen even where the file system's timestamps are coarse.
  void write(const std::string& text) { std::ofstream(path_, std::ios::trunc) << text; }
  // Writes a new file and renames it over the old one, as editors do (new inode).
  void replace(const std::string& text) {
    std::ofstream(path_ + ".new") << text;
    ASSERT_EQ(std::rename((path_ + ".new").c_str(), path_.c_str()), 0);
  }

  std::string dir_, path_;
};

TEST_F(Watch, UnchangedFileIsNotRead) {
  write("[log]\nlevel = \"info\"\n");
  PolicyWatcher w(path_);
  Policy p;
  std::vector<Diagnostic> errors;
  EXPECT_EQ(w.poll(p, errors), PolicyWatcher::Change::none);
  EXPECT_EQ(w.poll(p, errors), PolicyWatcher::Change::none);
  EXPECT_TRUE(errors.empty());
}

TEST_F(Watch, ReloadsAValidChangeAndKeepsReportingNothingAfter) {
  write("[defaults]\nfree_sync = \"device\"\n");
  PolicyWatcher w(path_);
  write("[defaults]\nfree_sync = \"barrier\"\n");
  Policy p;
  std::vector<Diagnostic> errors;
  ASSERT_EQ(w.poll(p, errors), PolicyWatcher::Change::reloaded);
  EXPECT_EQ(p.default_free_sync, FreeSync::barrier);
  EXPECT_EQ(p.source, path_);
  EXPECT_EQ(w.poll(p, errors), PolicyWatcher::Change::none);
}

TEST_F(Watch, InvalidChangeGivesErrorsOnceAndLeavesThePolicy) {
  write("[defaults]\nfree_sync = \"none\"\n");
  PolicyWatcher w(path_);
  Policy p;
  p.default_free_sync = FreeSync::none;
  std::vector<Diagnostic> errors;
  write("[defaults]\nfree_sync = \"sometimes\"\n");
  ASSERT_EQ(w.poll(p, errors), PolicyWatcher::Change::invalid);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].line, 2);
  EXPECT_EQ(p.default_free_sync, FreeSync::none);
  errors.clear();
  EXPECT_EQ(w.poll(p, errors), PolicyWatcher::Change::none);  // same broken file: quiet
  EXPECT_TRUE(errors.empty());
  write("[defaults]\nfree_sync = \"barrier\"\n");  // fixed
  ASSERT_EQ(w.poll(p, errors), PolicyWatcher::Change::reloaded);
  EXPECT_EQ(p.default_free_sync, FreeSync::barrier);
}

TEST_F(Watch, RenamedOverFileIsSeenEvenWithTheSameSize) {
  write("[log]\nlevel = \"warn\"\n");
  PolicyWatcher w(path_);
  replace("[log]\nlevel = \"info\"\n");  // same length, new inode
  Policy p;
  std::vector<Diagnostic> errors;
  ASSERT_EQ(w.poll(p, errors), PolicyWatcher::Change::reloaded);
  EXPECT_EQ(p.log.level, Log::Level::info);
}

TEST_F(Watch, VanishedFileIsInvalidUntilItReturns) {
  write("");
  PolicyWatcher w(path_);
  std::remove(path_.c_str());
  Policy p;
  std::vector<Diagnostic> errors;
  ASSERT_EQ(w.poll(p, errors), PolicyWatcher::Change::invalid);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("No such file"), std::string::npos);
  errors.clear();
  EXPECT_EQ(w.poll(p, errors), PolicyWatcher::Change::none);
  write("[log]\nlevel = \"debug\"\n");
  EXPECT_EQ(w.poll(p, errors), PolicyWatcher::Change::reloaded);
  EXPECT_EQ(p.log.level, Log::Level::debug);
}

TEST_F(Watch, EnvironmentOverridesAreReapplied) {
  write("");
  PolicyWatcher w(path_, 1000, nullptr, "log.level=error");
  write("[log]\nlevel = \"debug\"\n");
  Policy p;
  std::vector<Diagnostic> errors;
  ASSERT_EQ(w.poll(p, errors), PolicyWatcher::Change::reloaded);
  EXPECT_EQ(p.log.level, Log::Level::error);
}

TEST_F(Watch, PollIfDueThrottles) {
  write("");
  PolicyWatcher w(path_, 500);
  Policy p;
  std::vector<Diagnostic> errors;
  EXPECT_EQ(w.poll_if_due(10'000, p, errors), PolicyWatcher::Change::none);  // first: stats
  write("[log]\nlevel = \"info\"\n");
  EXPECT_EQ(w.poll_if_due(10'100, p, errors), PolicyWatcher::Change::none);  // too soon
  EXPECT_EQ(w.poll_if_due(10'499, p, errors), PolicyWatcher::Change::none);
  EXPECT_EQ(w.poll_if_due(10'500, p, errors), PolicyWatcher::Change::reloaded);
}

}  // namespace
}  // namespace allocshim::policy
