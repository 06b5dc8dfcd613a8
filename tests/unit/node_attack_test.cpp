// What another user, a stale file or a race can do to a shared budget's region (issue 24; the
// "Row N" comments are that table): overwritten, truncated or planted files, false leases
// and requests, locks held too long, symlinks, readers racing reconfiguration, forks during a
// join. A member keeps what it holds, takes no more, says so once, and never crashes or hangs.
// The tests acting as another user need root (setresuid) and skip without it.
#include "node_budget_peer.h"

#include <filesystem>

namespace allocshim {
namespace {

constexpr uid_t kOtherUser = 65534;

// In a child: becomes user 65534 with group `gid` and no supplementary groups. False if it could not.
bool become_other_user(gid_t gid) {
  return ::setgroups(0, nullptr) == 0 && ::setresgid(gid, gid, gid) == 0 &&
         ::setresuid(kOtherUser, kOtherUser, kOtherUser) == 0;
}

// 512 MiB per device shared by every user of the node (a 0666 file), or by a group (0660).
std::string shared_by(const char* scope, int wait_ms = 0) {
  return "[defaults]\nbackend = \"native\"\n\n[budget]\ndevice = \"512MiB\"\nspill = \"none\"\nshare = \"" +
         std::string(scope) + "\"\nshare_wait_ms = " + std::to_string(wait_ms) + "\n";
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Takes the region lock of the file at `path` on an open file description of its own (OFD locks
// of two descriptions conflict even within one process): another process holding it. -1 if not.
int hold_region_lock(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  l.l_start = node::kRegionLockByte;
  l.l_len = 1;
  if (::fcntl(fd, F_OFD_SETLK, &l) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// What `body` writes to stderr.
template <class Body>
std::string stderr_of(Body body) {
  ::testing::internal::CaptureStderr();
  body();
  return ::testing::internal::GetCapturedStderr();
}

// The permission bits of `path` (0 if it cannot be looked at).
mode_t mode_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_mode & 0777 : 0;
}

// Allocates `bytes` as *a with a lease 64 MiB larger (one more allocation, freed: a free keeps
// slack under two units).
void lease_with_slack(Core& core, std::size_t bytes, DevPtr* a) {
  DevPtr c = 0;
  ASSERT_EQ(try_alloc(core, bytes, a), res::ok);
  ASSERT_EQ(try_alloc(core, 64 * kMiB, &c), res::ok);
  ASSERT_EQ(core.free(c, FreeRequest{}), res::ok);
  ASSERT_EQ(core.budget().node().lease(0), bytes + 64 * kMiB);
}

class OtherUserTest : public NodeBudgetTest {
 protected:
  void SetUp() override {
    NodeBudgetTest::SetUp();
    ::chmod(dir_.c_str(),
            01777);  // like /dev/shm: anyone may create files, only owners remove them
    if (::geteuid() != 0)
      GTEST_SKIP() << "acting as another user needs root (setresuid); run as root";
  }
  void TearDown() override {
    member_.reset();
    NodeBudgetTest::TearDown();
  }
  // This process's core, a member of the region every user shares (512 MiB per device), on a
  // simulated device of its own (driver()).
  Core& join_all() {
    member_ = std::make_unique<Member>();
    return member_->core;
  }
  const Driver& driver() const { return member_->fake.driver(); }
  // Runs `write(fd)` for its exit status in a child process that became another user, on the
  // region shared by every user, opened for writing.
  template <class Write>
  void as_other_user(Write write) {
    const std::string file = region("all");
    Peer peer;
    spawn(peer, [&](Peer&) {
      CHILD_CHECK(become_other_user(kOtherUser));
      const int fd = ::open(file.c_str(), O_RDWR);
      CHILD_CHECK(fd >= 0);
      const int status = write(fd);
      ::close(fd);
      return status;
    });
    ASSERT_EQ(peer.join(), 0);
  }

 private:
  struct Member {
    FakeDriver fake;
    Core core{fake.driver(), load(shared_by("device"))};
  };
  std::unique_ptr<Member> member_;
};

// Row 1: another user overwrites the whole region with bytes of its choosing. The member keeps
// what it holds, takes no more, says so once; nothing it reads is used as a pointer.
TEST_F(OtherUserTest, ARegionOverwrittenByAnotherUserCannotCrashAMember) {
  Core& core = join_all();
  DevPtr a = 0, b = 0;
  lease_with_slack(core, 192 * kMiB, &a);  // a lease of 256 MiB, 192 backed
  as_other_user([](int fd) {
    std::vector<unsigned char> junk(1 << 20, 0xa5);
    CHILD_CHECK(::pwrite(fd, junk.data(), junk.size(), 0) == static_cast<ssize_t>(junk.size()));
    return 0;
  });
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(try_alloc(core, 128 * kMiB, &b), res::out_of_memory)
      << "past its lease: refused (spill = none)";
  EXPECT_EQ(try_alloc(core, 128 * kMiB, &b), res::out_of_memory);
  ASSERT_EQ(try_alloc(core, 64 * kMiB, &b), res::ok) << "within its lease";
  EXPECT_FALSE(core.budget().node().asked());
  std::size_t free = 0, total = 0;
  EXPECT_EQ(core.mem_get_info(&free, &total), res::ok);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(err, "is damaged or gone"), 1u) << err;
  EXPECT_GE(core.budget().node().damaged(), 1u);
  free_and_leave(core, {a, b});
}

// Row 1 again, with a region that still looks valid: another user raises the GPU's limit. The
// member still never goes past its own policy's 512 MiB, in the region's lease as in what it backs.
TEST_F(OtherUserTest, ALimitRaisedByAnotherUserIsNotTrusted) {
  Core& core = join_all();
  DevPtr a = 0, b = 0;
  ASSERT_EQ(try_alloc(core, 64 * kMiB, &a), res::ok);
  as_other_user([](int fd) {
    node::Entry e{};
    CHILD_CHECK(::pread(fd, &e, sizeof e, offsetof(node::Layout, entries)) == sizeof e);
    e.limit = ~std::uint64_t{0};
    CHILD_CHECK(::pwrite(fd, &e, sizeof e, offsetof(node::Layout, entries)) == sizeof e);
    return 0;
  });
  ASSERT_EQ(try_alloc(core, 448 * kMiB, &b), res::ok);
  DevPtr c = 0;
  EXPECT_EQ(try_alloc(core, 64 * kMiB, &c), res::out_of_memory) << "its own 512 MiB hold";
  EXPECT_LE(core.budget().node().lease(0), 512 * kMiB);
  free_and_leave(core, {a, b});
}

// Item 4 of issue 24, the device scope: another user writes a valid-looking region that zeroes the
// member's lease and asks it for every byte. The member gives back only what it does not back,
// writes its own lease back, and never holds more than its own policy's 512 MiB.
TEST_F(OtherUserTest, FalseLeasesAndRequestsOfAnotherUserCannotPushAMemberPastItsOwnLimit) {
  Core& core = join_all();
  DevPtr a = 0, b = 0, c = 0;
  lease_with_slack(core, 192 * kMiB, &a);  // a lease of 256 MiB, 192 backed, in slot 0 of entry 0
  fake::testing::fill(driver(), a, 4 * kMiB, 3);
  as_other_user([](int fd) {
    const std::uint64_t zero = 0, all = ~std::uint64_t{0};
    std::uint64_t asked = 1;
    CHILD_CHECK(::pwrite(fd, &zero, 8, offsetof(node::Layout, lease)) == 8);
    CHILD_CHECK(::pwrite(fd, &all, 8, offsetof(node::Layout, want)) == 8);
    CHILD_CHECK(
        ::pwrite(fd, &asked, 8, offsetof(node::Layout, slots) + offsetof(node::Slot, asked)) == 8);
    return 0;
  });
  for (int i = 0; i < 5 && core.budget().node().lease(0) != 192 * kMiB; ++i) {
    core.at_safe_point(-1);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the poll interval
  }
  EXPECT_EQ(core.budget().node().lease(0), 192 * kMiB) << "gave back its slack, not what it backs";
  EXPECT_TRUE(fake::testing::verify(driver(), a, 4 * kMiB, 3));
  const int fd = ::open(region("all").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::uint64_t written = 0;
  ASSERT_EQ(::pread(fd, &written, 8, offsetof(node::Layout, lease)), 8);
  ::close(fd);
  EXPECT_EQ(written, 192 * kMiB) << "its own lease written back";
  EXPECT_EQ(try_alloc(core, 384 * kMiB, &b), res::out_of_memory)
      << "576 MiB would pass its own 512";
  ASSERT_EQ(try_alloc(core, 256 * kMiB, &b), res::ok);
  EXPECT_EQ(try_alloc(core, 128 * kMiB, &c), res::out_of_memory);
  EXPECT_LE(core.budget().node().lease(0), 512 * kMiB);
  free_and_leave(core, {a, b});
}

// Row 2: another user truncates the region to 0 bytes. No SIGBUS (nothing is mapped): the member
// keeps its lease, is refused more, says so once, and polling for requests reads nothing.
TEST_F(OtherUserTest, ARegionTruncatedByAnotherUserCannotCrashAMember) {
  Core& core = join_all();
  DevPtr a = 0, b = 0;
  ASSERT_EQ(try_alloc(core, 256 * kMiB, &a), res::ok);
  as_other_user([](int fd) {
    CHILD_CHECK(::ftruncate(fd, 0) == 0);
    return 0;
  });
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(core.budget().node().asked());
    core.at_safe_point(-1);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the poll interval
  }
  EXPECT_EQ(try_alloc(core, 128 * kMiB, &b), res::out_of_memory);
  std::size_t free = 0, total = 0;
  EXPECT_EQ(core.mem_get_info(&free, &total), res::ok);
  EXPECT_EQ(total, 512 * kMiB);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(err, "is damaged or gone"), 1u) << err;
  free_and_leave(core, {a});
  EXPECT_NE(::access(region("all").c_str(), F_OK), 0) << "the last member removed the damaged file";
}

// Row 3: another user holds the region's lock and never lets go. The member waits for it once
// (then tries once per slow path), keeps its lease, is refused more and says so once; once the
// lock is free it grows again.
TEST_F(OtherUserTest, ALockHeldByAnotherUserDelaysOnceAndNeverHangs) {
  Core& core = join_all();
  DevPtr a = 0, b = 0;
  lease_with_slack(core, 128 * kMiB, &a);  // a lease of 192 MiB, 128 backed
  const std::string file = region("all");
  Peer peer;
  spawn(peer, [&](Peer& p) {
    CHILD_CHECK(become_other_user(kOtherUser));
    CHILD_CHECK(hold_region_lock(file) >= 0);
    p.send(p.to_parent[1], 'l');
    CHILD_CHECK(p.recv(p.to_child[0]) == 'x');
    return 0;  // the lock goes with the process
  });
  ASSERT_EQ(peer.hear_from_child(), 'l');
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(try_alloc(core, 256 * kMiB, &b), res::out_of_memory) << "past its lease";
  EXPECT_EQ(try_alloc(core, 256 * kMiB, &b), res::out_of_memory);
  ASSERT_EQ(try_alloc(core, 64 * kMiB, &b), res::ok) << "within its lease";
  std::size_t free = 0, total = 0;
  EXPECT_EQ(core.mem_get_info(&free, &total), res::ok);
  EXPECT_LE(free, 128 * kMiB) << "no more than its lease leaves";
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(err, "was not released"), 1u) << err;
  EXPECT_GE(core.budget().node().lock_timeouts(), 2u);
  peer.tell_child('x');
  EXPECT_EQ(peer.join(), 0);
  DevPtr c = 0;
  ASSERT_EQ(try_alloc(core, 256 * kMiB, &c), res::ok) << "the lock is free again";
  free_and_leave(core, {a, b, c});
}

// Row 7: share = "group" between two users of one group. The other user's member, which can
// write the file (mode 0660), joins it and counts the first member's lease; a user of another
// group can neither join nor write it.
TEST_F(OtherUserTest, AGroupRegionIsSharedByEveryUserWhoCanWriteIt) {
  FakeDriver fake;
  Core core(fake.driver(), load(shared_by("group")));
  DevPtr a = 0;
  ASSERT_EQ(try_alloc(core, 384 * kMiB, &a), res::ok);
  const gid_t group = ::getegid();
  const std::string file = region("g" + std::to_string(group));
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  Peer same;
  spawn(same, [&](Peer&) {
    CHILD_CHECK(become_other_user(group));
    Core c(fake.driver(), load(shared_by("group")));  // on its copy of the simulated device
    DevPtr x = 0;
    CHILD_CHECK(try_alloc(c, 256 * kMiB, &x) == res::out_of_memory);  // 384 of 512 MiB are root's
    CHILD_CHECK(try_alloc(c, 128 * kMiB, &x) == res::ok);
    CHILD_CHECK(c.stats_json().find("\"joined\":true") != std::string::npos);
    CHILD_CHECK(c.free(x, FreeRequest{}) == res::ok);
    return 0;
  });
  EXPECT_EQ(same.join(), 0);
  Peer other;
  spawn(other, [&](Peer&) {
    CHILD_CHECK(become_other_user(kOtherUser));
    CHILD_CHECK(::open(file.c_str(), O_RDWR) < 0 &&
                errno == EACCES);  // refused, and cannot write it
    return 0;
  });
  EXPECT_EQ(other.join(), 0);
  free_and_leave(core, {a});
}

// Row 8: share = "user" where another user created the per-user file first. The member leaves it
// alone, says why in one line, and keeps its own policy's budget (never the whole GPU).
TEST_F(OtherUserTest, APerUserRegionPlantedByAnotherUserIsRefusedAndTheBudgetHolds) {
  const std::string file = region("u" + std::to_string(::geteuid()));
  Peer peer;
  spawn(peer, [&](Peer&) {
    CHILD_CHECK(become_other_user(kOtherUser));
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_EXCL, 0644);
    CHILD_CHECK(fd >= 0);
    ::close(fd);
    return 0;
  });
  ASSERT_EQ(peer.join(), 0);
  {
    ::testing::internal::CaptureStderr();
    FakeDriver fake;
    Core core(fake.driver(), load(kShared));
    DevPtr a = 0, b = 0;
    ASSERT_EQ(try_alloc(core, 448 * kMiB, &a), res::ok);
    EXPECT_EQ(try_alloc(core, 128 * kMiB, &b), res::out_of_memory) << "its own 512 MiB hold";
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(count(err, "belongs to uid 65534, not this user"), 1u) << err;
    EXPECT_EQ(count(err, "\n"), 1u) << "one line: " << err;
    ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
  }
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kOtherUser);
  EXPECT_EQ(st.st_size, 0) << "another user's file is left as it was";
  ASSERT_EQ(::unlink(file.c_str()), 0);
}

// Row 8, as issue 45 has it: a file of this user at the region's name that the shim did not make
// (empty, the mode a umask gave it) is refused and left exactly as it was; each process keeps a
// budget of its own. Regions are created complete, so no run of the shim leaves such a file.
TEST_F(NodeBudgetTest, AFileAtTheNameThatIsNotARegionIsRefusedAndLeftAsItWas) {
  const std::string file = user_region();
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "precious", 8), 8);
  ::close(fd);
  ::testing::internal::CaptureStderr();
  {
    FakeDriver fake;
    Core one(fake.driver(), load(kShared)), two(fake.driver(), load(kShared));
    DevPtr a = 0, b = 0;
    ASSERT_EQ(try_alloc(one, 384 * kMiB, &a), res::ok);
    ASSERT_EQ(try_alloc(two, 256 * kMiB, &b), res::ok) << "a budget of its own each";
    ASSERT_EQ(one.free(a, FreeRequest{}), res::ok);
    ASSERT_EQ(two.free(b, FreeRequest{}), res::ok);
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(err, "is not a budget region (wrong size or header): not touching it"), 2u)
      << err;
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 8) << "the file was not rewritten";
  ASSERT_EQ(::unlink(file.c_str()), 0);
}

// Issue 45, row 1: another user hard-links a file of root's (mode 0644, not a region) at the name
// of the region every user shares. Root's member refuses it (two names), keeps a budget of its own,
// and changes neither the file's mode nor its contents. Where fs.protected_hardlinks stops the
// other user from making the link, root makes it: the member must refuse it all the same.
TEST_F(OtherUserTest, AHardLinkAtTheRegionsNameIsRefusedAndTheFileIsUntouched) {
  const std::string victim = dir_ + "/victim";
  {
    const int fd = ::open(victim.c_str(), O_RDWR | O_CREAT | O_EXCL, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, "precious", 8), 8);
    ::fchmod(fd, 0644);
    ::close(fd);
  }
  const std::string file = region("all");
  Peer peer;
  spawn(peer, [&](Peer&) {
    CHILD_CHECK(become_other_user(kOtherUser));
    return ::link(victim.c_str(), file.c_str()) == 0 ? 0 : errno == EPERM ? 1 : 2;
  });
  const int linked = peer.join();
  ASSERT_NE(linked, 2);
  if (linked == 1) {  // fs.protected_hardlinks = 1
    ASSERT_EQ(::link(victim.c_str(), file.c_str()), 0);
  }
  const std::string err = stderr_of([&] {
    FakeDriver fake;
    Core core(fake.driver(), load(shared_by("device")));
    DevPtr a = 0, b = 0;
    ASSERT_EQ(try_alloc(core, 448 * kMiB, &a), res::ok);
    EXPECT_EQ(try_alloc(core, 128 * kMiB, &b), res::out_of_memory) << "its own 512 MiB hold";
    ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
  });
  EXPECT_EQ(count(err, "has 2 names (hard links): not a region this shim made"), 1u) << err;
  EXPECT_EQ(mode_of(victim), 0644u) << "mode unchanged";
  EXPECT_EQ(std::filesystem::file_size(victim), 8u) << "contents unchanged";
  ASSERT_EQ(::unlink(file.c_str()), 0);
  ASSERT_EQ(::unlink(victim.c_str()), 0);
}

// Issue 45, row 1 with fs.protected_hardlinks = 1: another user may still link a file it can
// write, such as the region every user shares (0666), at root's per-user name. Root's per-user
// member refuses the link and leaves the shared region's mode alone, so other users still join it.
TEST_F(OtherUserTest, ASharedRegionLinkedAtAPerUserNameKeepsItsMode) {
  Core& core = join_all();  // root's member of the region every user shares
  DevPtr a = 0;
  ASSERT_EQ(try_alloc(core, 64 * kMiB, &a), res::ok);
  const std::string all = region("all"), mine = user_region();
  Peer peer;
  spawn(peer, [&](Peer&) {
    CHILD_CHECK(become_other_user(kOtherUser));
    CHILD_CHECK(::link(all.c_str(), mine.c_str()) == 0);
    return 0;
  });
  ASSERT_EQ(peer.join(), 0);
  const std::string err = stderr_of([&] {
    Core own(driver(), load(kShared));  // share = "user", on the same simulated device
    DevPtr b = 0;
    ASSERT_EQ(try_alloc(own, 64 * kMiB, &b), res::ok);
    ASSERT_EQ(own.free(b, FreeRequest{}), res::ok);
  });
  EXPECT_EQ(count(err, "has 2 names (hard links)"), 1u) << err;
  EXPECT_EQ(mode_of(all), 0666u) << "the shared region stays open to its scope";
  ASSERT_EQ(::unlink(mine.c_str()), 0);
  // Another user's member of the shared region still joins it.
  Peer other;
  spawn(other, [&](Peer&) {
    CHILD_CHECK(become_other_user(kOtherUser));
    Core c(driver(), load(shared_by("device")));  // the simulated device, inherited
    DevPtr x = 0;
    CHILD_CHECK(try_alloc(c, 64 * kMiB, &x) == res::ok);
    CHILD_CHECK(c.budget().node().joined());
    CHILD_CHECK(c.free(x, FreeRequest{}) == res::ok);
    return 0;
  });
  EXPECT_EQ(other.join(), 0);
  free_and_leave(core, {a});
}

// Issue 45, row 9: slots of dead processes scribbled with leases no GPU has. What the member
// reports as reclaimed stays within what the GPU's limit allows each of them (it read 2^64 - 174:
// an unsaturated sum of a saturated count).
TEST_F(NodeBudgetTest, ReclaimedBytesOfScribbledSlotsStayWithinTheLimit) {
  UserMember member(64 * kMiB);
  Core& core = member.core;
  const int fd = ::open(user_region().c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  // A slot no process holds, marked in use with a lease: the next member to take the lock reclaims it.
  const auto scribble = [&](std::size_t slot, std::uint64_t lease_e0, std::uint64_t lease_e9) {
    node::Slot s{};
    s.in_use = 1;
    s.pid = 1;
    ASSERT_EQ(::pwrite(fd, &s, sizeof s, offsetof(node::Layout, slots) + slot * sizeof s),
              (ssize_t)sizeof s);
    const off_t e0 = offsetof(node::Layout, lease) + slot * 8;
    const off_t e9 = offsetof(node::Layout, lease) + (9 * node::kSlots + slot) * 8;
    ASSERT_EQ(::pwrite(fd, &lease_e0, 8, e0), 8);
    ASSERT_EQ(::pwrite(fd, &lease_e9, 8, e9), 8);  // an entry no GPU uses
  };
  DevPtr b = 0;
  // Each allocation grows the lease past what it was: a region operation, which reclaims.
  scribble(100, ~std::uint64_t{0} - 100, 1u << 30);
  ASSERT_EQ(try_alloc(core, 192 * kMiB, &b), res::ok);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
  scribble(101, 500, ~std::uint64_t{0});
  ASSERT_EQ(try_alloc(core, 384 * kMiB, &b), res::ok);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
  ::close(fd);
  EXPECT_EQ(core.budget().node().reclaimed_processes(), 2u);
  EXPECT_EQ(core.budget().node().reclaimed_bytes(), 512 * kMiB + 500)
      << "each lease at most the GPU's limit";
  free_and_leave(core, {member.block});
}

// A symbolic link or a FIFO at the region's name is never followed, opened for long or written.
TEST_F(NodeBudgetTest, ASymlinkOrFifoAtTheRegionsNameIsRefused) {
  const std::string file = user_region();
  const std::string target = dir_ + "/target";
  const int fd = ::open(target.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  for (const bool fifo : {false, true}) {
    SCOPED_TRACE(fifo ? "fifo" : "symlink");
    ASSERT_EQ(fifo ? ::mkfifo(file.c_str(), 0600) : ::symlink(target.c_str(), file.c_str()), 0);
    ::testing::internal::CaptureStderr();
    {
      FakeDriver fake;
      Core core(fake.driver(), load(kShared));
      DevPtr a = 0;
      ASSERT_EQ(try_alloc(core, 448 * kMiB, &a), res::ok);
      EXPECT_EQ(try_alloc(core, 128 * kMiB, &a), res::out_of_memory) << "its own budget holds";
    }
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find(fifo ? "is not a regular file" : "is a symbolic link"), std::string::npos)
        << err;
    ASSERT_EQ(::unlink(file.c_str()), 0);
  }
  struct stat st {};
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "the link's target was not written";
  ASSERT_EQ(::unlink(target.c_str()), 0);
}

// Row 4: asked(), room() and the lease are read by other threads (frees, safe points,
// cuMemGetInfo) while a reload changes the share and the exit leaves the region: nothing they
// read is ever unmapped (the region is not mapped at all).
TEST_F(NodeBudgetTest, ReadersRaceReconfigurationAndLeaving) {
  FakeDriver fake;
  NodeBudget a(fake.driver()), b(fake.driver());
  using Share = policy::Budget::Share;
  a.configure(Share::user, 0);
  join_user_region(b);
  ASSERT_EQ(b.grow(0, 448 * kMiB, false), 448 * kMiB);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> reads{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t)
    readers.emplace_back([&] {
      while (!stop.load()) {
        (void)a.asked();
        (void)a.room(0);
        (void)a.covers(0, kMiB);
        (void)a.lease(0);
        a.take_request(0);
        reads.fetch_add(1);
      }
    });
  for (int i = 0; i < 200; ++i) {
    a.configure(Share::user, 0);
    ASSERT_EQ(a.attach(0, 512 * kMiB), 512 * kMiB);
    a.grow(0, 256 * kMiB, false, true);  // asks b; b's answer is never needed here
    a.configure(Share::process, 0);
  }
  a.configure(Share::user, 0);
  a.attach(0, 512 * kMiB);
  a.leave();
  stop.store(true);
  for (std::thread& t : readers) t.join();
  EXPECT_GT(reads.load(), 0u);
  b.leave();
}

// Row 10: an allocation waiting share_wait_ms for room holds no lock meanwhile: cuMemGetInfo
// (room), frees (settle) and safe points (take_request) of other threads go on and return while it
// still waits.
TEST_F(NodeBudgetTest, AWaitForRoomHoldsNoLockOthersNeed) {
  FakeDriver fake;
  NodeBudget holder(fake.driver()), waiter(fake.driver());
  join_user_region(holder);
  join_user_region(waiter, 2000);
  ASSERT_EQ(holder.grow(0, 448 * kMiB, false), 448 * kMiB);  // and never answers
  std::atomic<bool> done{false};
  std::thread t([&] {
    waiter.grow(0, 256 * kMiB, true);
    done.store(true);
  });
  // Until the waiter has asked (then it waits).
  const auto asked = [&] {
    const auto r = waiter.device_reports();
    return !r.empty() && r[0].asks != 0;
  };
  while (!asked() && !done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_LE(waiter.room(0), 64 * kMiB) << "what the holder leaves";
  waiter.settle(0, 0, 0);
  EXPECT_EQ(waiter.take_request(0), 0u);
  EXPECT_FALSE(done.load()) << "the calls above returned only once the wait was over";
  t.join();
  const auto r = waiter.device_reports();
  ASSERT_FALSE(r.empty());
  EXPECT_EQ(r[0].timeouts, 1u);
  holder.leave();
  waiter.leave();
}

// Item 3 of issue 24: a process's first join waits for a region lock that another process holds;
// meanwhile cuMemGetInfo of another device returns. Before, the join held the budget's mutex for
// its whole wait, so the lock was released only after the join had given up.
TEST_F(NodeBudgetTest, AJoinWaitingForTheRegionLockHoldsNoLockOthersNeed) {
  FakeDriver fake(FakeConfig{.devices = 2});
  NodeBudget first(fake.driver());
  join_user_region(first);  // the region exists
  const int lock = hold_region_lock(user_region());
  ASSERT_GE(lock, 0);
  // Device 0 has a shared budget, device 1 none.
  Core core(
      fake.driver(),
      load("[defaults]\nbackend = \"native\"\n\n[budget]\nspill = \"none\"\nshare = \"user\"\n\n"
           "[budget.device]\n0 = \"512MiB\"\n"));
  std::atomic<std::thread::id> allocator{};
  std::atomic<bool> resolving{false}, done{false};
  // The allocating thread asks for device 0's memory size just before it joins.
  fake.on_call(FakeOp::device_total_mem, [&] {
    if (std::this_thread::get_id() == allocator.load()) resolving.store(true);
  });
  DevPtr a = 0;
  Result r = res::ok;
  std::thread t([&] {
    allocator.store(std::this_thread::get_id());
    r = try_alloc(core, 64 * kMiB, &a);
    done.store(true);
  });
  while (!resolving.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  fake.set_current_device(1);
  std::size_t free = 0, total = 0;
  EXPECT_EQ(core.mem_get_info(&free, &total), res::ok);
  EXPECT_EQ(total, kGiB) << "device 1 has no budget";
  EXPECT_FALSE(done.load()) << "cuMemGetInfo returned only once the join was over";
  ::close(lock);  // the other process lets go: the join goes on
  t.join();
  fake.on_call(FakeOp::device_total_mem, nullptr);
  ASSERT_EQ(r, res::ok);
  EXPECT_TRUE(core.budget().node().joined())
      << "the join gave up while the lock was held: " << core.summary();
  EXPECT_EQ(core.budget().node().lease(0), 64 * kMiB);
  free_and_leave(core, {a});
  first.leave();
}

// A child forked while another thread's first join waits for the region lock keeps no descriptor
// of the region: its copy would hold the joining slot's lock, so that slot would look alive for
// as long as the child lives. Before, only the region already joined was closed in the child.
TEST_F(NodeBudgetTest, AChildForkedDuringAJoinKeepsNoDescriptorOfTheRegion) {
  FakeDriver fake;
  using Share = policy::Budget::Share;
  NodeBudget first(fake.driver());
  join_user_region(first);  // the region exists
  const std::string path = user_region();
  const int lock = hold_region_lock(path);
  ASSERT_GE(lock, 0);
  const int before = descriptors_of(path);
  // The join gives up on the lock after a while: a fork that comes too late proves nothing, and
  // the test tries again with another member.
  bool forked_during_join = false;
  for (int attempt = 0; attempt < 3 && !forked_during_join; ++attempt) {
    NodeBudget second(fake.driver());
    second.configure(Share::user, 0);
    std::thread t([&] { second.attach(0, 256 * kMiB); });
    for (int i = 0; i < 5000 && descriptors_of(path) == before; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const pid_t pid = testing::fork_child([&] {
      ::close(lock);
      return descriptors_of(path);
    });
    forked_during_join = descriptors_of(path) == before + 1;  // still open after the fork
    EXPECT_EQ(testing::wait_child(pid), 0) << "descriptors of the region left open in the child";
    t.join();
    second.leave();
  }
  EXPECT_TRUE(forked_during_join) << "no fork landed inside the join's wait";
  ::close(lock);
  first.leave();
}

// The same at exit: leaving waits for a region lock another process holds, while the other
// threads' calls find nothing shared and return. Before, leave() held the mutex they need for its
// whole wait, gave up, and left the file behind.
TEST_F(NodeBudgetTest, LeavingWaitsForTheRegionLockHoldingNoLockOthersNeed) {
  FakeDriver fake(FakeConfig{.devices = 2});
  NodeBudget member(fake.driver());
  join_user_region(member);
  ASSERT_EQ(member.grow(0, 128 * kMiB, false), 128 * kMiB);
  const std::string file = user_region();
  const int lock = hold_region_lock(file);
  ASSERT_GE(lock, 0);
  std::atomic<bool> left{false};
  std::thread t([&] {
    member.leave();
    left.store(true);
  });
  while (member.active()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(member.attach(1, 256 * kMiB), 256 * kMiB)
      << "a device first used now keeps its own budget";
  EXPECT_EQ(member.room(0), ~std::uint64_t{0}) << "nothing shared any more";
  member.settle(0, 0, 0);
  EXPECT_FALSE(left.load()) << "the calls above returned only once leaving was over";
  ::close(lock);
  t.join();
  EXPECT_NE(::access(file.c_str(), F_OK), 0)
      << "the last member left with the lock and removed the file";
}

}  // namespace
}  // namespace allocshim
