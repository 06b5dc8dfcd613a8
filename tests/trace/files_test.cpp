// The trace file's name often points into /tmp and the traced program may run as root: a name
// another user prepared never receives the trace, and the user's own file of an earlier run is
// replaced (os/private_file.h).
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "test_util.h"
#include "analysis/reader.h"
#include "trace/recorder.h"

namespace fs = std::filesystem;

namespace {

Recorder* try_start(const std::string& path, std::string& error) {
  Config c;
  c.path = path;
  c.stacks = StackMode::off;
  return Recorder::start(c, error);
}

TEST(TraceFile, APlantedSymlinkIsNotFollowed) {
  const std::string victim = test::temp_path("victim");
  { std::ofstream(victim) << "precious"; }
  chmod(victim.c_str(), 0644);
  const std::string link = test::temp_path("planted.trace");
  fs::create_symlink(victim, link);
  std::string error;
  EXPECT_EQ(try_start(link, error), nullptr);
  EXPECT_NE(error.find("symbolic link"), std::string::npos) << error;
  Recorder::stop();
  EXPECT_EQ(test::read_text(victim), "precious");
  struct stat st {};
  ASSERT_EQ(stat(victim.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u) << "the victim's mode was changed";
  EXPECT_TRUE(fs::is_symlink(link));
}

TEST(TraceFile, AFilePreparedByAnotherUserReceivesNoTrace) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a file owned by another user";
  const std::string bait = test::temp_path("bait.trace");
  { std::ofstream{bait}; }
  ASSERT_EQ(chown(bait.c_str(), 65534, 65534), 0);
  ASSERT_EQ(chmod(bait.c_str(), 0666), 0);
  std::string error;
  EXPECT_EQ(try_start(bait, error), nullptr);
  EXPECT_NE(error.find("belongs to uid 65534"), std::string::npos) << error;
  Recorder::stop();
  EXPECT_EQ(fs::file_size(bait), 0u) << "root's trace went into the other user's file";
}

TEST(TraceFile, AnEarlierRunsTraceIsReplaced) {
  const std::string path = test::temp_path("again.trace");
  for (int run = 0; run < 2; ++run) {
    std::string error;
    Recorder* r = try_start(path, error);
    ASSERT_NE(r, nullptr) << error;
    r->on_alloc(0x1000 + static_cast<allocshim::DevPtr>(run), 16, 0, 0, Api::alloc, 1);
    Recorder::stop();
  }
  Trace t;
  std::string error;
  ASSERT_TRUE(read_trace(path, t, error)) << error;
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_EQ(t.events[0].addr, 0x1001u);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

}  // namespace
