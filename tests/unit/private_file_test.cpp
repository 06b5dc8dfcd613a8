// The files the shim writes (os/private_file.h): a name another user prepared in a shared directory
// never makes the shim write through it, and the user's own file from an earlier run is replaced.
#include "os/private_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace allocshim::os {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void put(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

class PrivateFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string d = (fs::temp_directory_path() / "allocshim_private_XXXXXX").string();
    ASSERT_NE(mkdtemp(d.data()), nullptr);
    dir_ = d;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Creates `name` through create_private and writes `text` into it; the result's error.
  std::string write(const fs::path& path, const std::string& text) {
    PrivateFile f = create_private(path.string());
    if (f.fd >= 0) {
      EXPECT_TRUE(write_all(f.fd, text.data(), text.size()));
      close(f.fd);
    }
    return f.fd >= 0 ? "" : f.error;
  }
  static mode_t mode_of(const fs::path& p) {
    struct stat st {};
    EXPECT_EQ(lstat(p.c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  }

  fs::path dir_;
};

TEST_F(PrivateFileTest, ANewFileIsPrivateWhateverTheUmask) {
  const mode_t old = umask(0);  // would leave 0600 as it is
  EXPECT_EQ(write(dir_ / "a", "data"), "");
  umask(0277);  // would take the owner's write bit off
  EXPECT_EQ(write(dir_ / "b", "data"), "");
  umask(old);
  EXPECT_EQ(mode_of(dir_ / "a"), 0600u);
  EXPECT_EQ(mode_of(dir_ / "b"), 0600u);
  EXPECT_EQ(slurp(dir_ / "b"), "data");
}

TEST_F(PrivateFileTest, APlantedSymlinkIsNotFollowed) {
  const fs::path victim = dir_ / "victim";
  put(victim, "precious");
  chmod(victim.c_str(), 0644);
  fs::create_symlink(victim, dir_ / "out");
  const std::string error = write(dir_ / "out", "trace bytes");
  EXPECT_NE(error.find("symbolic link"), std::string::npos) << error;
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_EQ(mode_of(victim), 0644u) << "the victim's mode was changed";
  EXPECT_TRUE(fs::is_symlink(dir_ / "out"));
  // A dangling one would otherwise create its target wherever it points.
  fs::create_symlink(dir_ / "elsewhere", dir_ / "dangling");
  EXPECT_NE(write(dir_ / "dangling", "x"), "");
  EXPECT_FALSE(fs::exists(dir_ / "elsewhere"));
}

TEST_F(PrivateFileTest, AFileOfAnotherUserGetsNoData) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a file owned by another user";
  const fs::path bait = dir_ / "stats.json";
  put(bait, "");
  ASSERT_EQ(chown(bait.c_str(), 65534, 65534), 0);
  ASSERT_EQ(chmod(bait.c_str(), 0666), 0);
  const std::string error = write(bait, "root's data");
  EXPECT_NE(error.find("belongs to uid 65534"), std::string::npos) << error;
  EXPECT_EQ(slurp(bait), "") << "the other user's file received the data";
  struct stat st {};
  ASSERT_EQ(stat(bait.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);
}

TEST_F(PrivateFileTest, AnEarlierFileOfOursIsReplacedNotWrittenThrough) {
  const fs::path path = dir_ / "stats.json";
  put(path, "last run");
  chmod(path.c_str(), 0644);
  fs::create_hard_link(path, dir_ / "other-name");  // e.g. another user's hard link to it
  const int reader = open(path.c_str(), O_RDONLY);
  ASSERT_GE(reader, 0);
  EXPECT_EQ(write(path, "this run"), "");
  EXPECT_EQ(slurp(path), "this run");
  EXPECT_EQ(mode_of(path), 0600u);
  EXPECT_EQ(slurp(dir_ / "other-name"), "last run") << "written through the old file's other name";
  char buf[16] = {};
  EXPECT_EQ(pread(reader, buf, sizeof buf, 0), 8);
  EXPECT_EQ(std::string(buf), "last run");
  close(reader);
  // Nothing left beside it.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) files += e.is_regular_file();
  EXPECT_EQ(files, 2);
}

TEST_F(PrivateFileTest, WhatIsNotARegularFileIsRefusedWithoutBlocking) {
  ASSERT_EQ(mkfifo((dir_ / "fifo").c_str(), 0666),
            0);  // opening it to write would wait for a reader
  EXPECT_NE(write(dir_ / "fifo", "x").find("not a regular file"), std::string::npos);
  fs::create_directory(dir_ / "sub");
  EXPECT_NE(write(dir_ / "sub", "x").find("not a regular file"), std::string::npos);
  EXPECT_NE(write(dir_ / "missing" / "x", "x").find("cannot open"), std::string::npos);
  EXPECT_NE(write(dir_ / "sub/", "x").find("not a file name"), std::string::npos);
}

// Issue 45, row 2: ALLOCSHIM_STATS=/tmp/x/home/dir/STATS.json where `dir` is another user's
// symbolic link to a directory of root's. Root's file there keeps its contents and mode: a link
// anywhere on the path that another user made is not followed.
TEST_F(PrivateFileTest, APathThroughAnotherUsersSymlinkIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a link owned by another user";
  const fs::path root_dir = dir_ / "root-owned";
  fs::create_directory(root_dir);
  put(root_dir / "STATS.json", "root's");
  chmod((root_dir / "STATS.json").c_str(), 0644);
  const fs::path home = dir_ / "x" / "home";
  fs::create_directories(home);
  ASSERT_EQ(chown((dir_ / "x").c_str(), 65534, 65534), 0);
  ASSERT_EQ(chown(home.c_str(), 65534, 65534), 0);
  fs::create_directory_symlink(root_dir, home / "dir");
  ASSERT_EQ(lchown((home / "dir").c_str(), 65534, 65534),
            0);  // as the other user would have made it
  const std::string error = write(home / "dir" / "STATS.json", "root's data");
  EXPECT_NE(error.find("is a symbolic link of uid 65534"), std::string::npos) << error;
  EXPECT_EQ(slurp(root_dir / "STATS.json"), "root's");
  EXPECT_EQ(mode_of(root_dir / "STATS.json"), 0644u);
  // A relative path through it is refused the same way.
  const fs::path cwd = fs::current_path();
  fs::current_path(home);
  EXPECT_NE(write("dir/STATS.json", "x").find("symbolic link of uid 65534"), std::string::npos);
  fs::current_path(cwd);
  EXPECT_EQ(slurp(root_dir / "STATS.json"), "root's");
}

// Links this user (or root) made are followed, however they chain: /var/run -> /run and a user's
// own links keep working.
TEST_F(PrivateFileTest, AncestorLinksOfThisUserAreFollowed) {
  fs::create_directories(dir_ / "real" / "deep");
  fs::create_directory_symlink(dir_ / "real", dir_ / "abs");  // absolute target
  fs::create_directory_symlink("abs/deep", dir_ / "rel");     // relative, to another link
  EXPECT_EQ(write(dir_ / "rel" / ".." / "deep" / "out.json", "data"), "");
  EXPECT_EQ(slurp(dir_ / "real" / "deep" / "out.json"), "data");
  fs::create_directory_symlink("loop", dir_ / "loop");
  EXPECT_NE(write(dir_ / "loop" / "x", "x").find("too many symbolic links"), std::string::npos);
}

}  // namespace
}  // namespace allocshim::os
