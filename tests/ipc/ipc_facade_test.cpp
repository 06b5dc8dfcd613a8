// The process-wide face of IPC (ipc/ipc.h, what the hooks call) across fork: a child is a new
// process to its peers. It inherits no broker (the parent's listening socket is closed in it), and
// its first export starts a broker of its own, under its own pid and nonce.
//
// One test per binary: the process-wide exporter stays bound to the first core that used it.
#include <dirent.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "ipc/ipc.h"
#include "ipc_rig.h"

namespace allocshim::ipc::test {
namespace {

// The inode of the socket bound to `name` (abstract: "@..." in /proc/net/unix), or 0.
unsigned long socket_inode(const HandleFields& f) {
  char name[96];
  std::snprintf(name, sizeof name, "@allocshim-ipc.%u.%u.%016llx", static_cast<unsigned>(geteuid()),
                f.pid, static_cast<unsigned long long>(f.nonce));
  std::ifstream in("/proc/net/unix");
  for (std::string line; std::getline(in, line);) {
    if (line.find(name) == std::string::npos) continue;
    std::istringstream fields(line);
    std::string col;
    for (int i = 0; i < 6; ++i) fields >> col;  // Num RefCount Protocol Flags Type St
    unsigned long inode = 0;
    fields >> inode;
    return inode;
  }
  return 0;
}

bool holds_socket(unsigned long inode) {
  const std::string want = "socket:[" + std::to_string(inode) + "]";
  DIR* d = opendir("/proc/self/fd");
  bool found = false;
  while (dirent* e = d ? readdir(d) : nullptr) {
    char target[128];
    const ssize_t n =
        readlink(("/proc/self/fd/" + std::string(e->d_name)).c_str(), target, sizeof target - 1);
    if (n > 0 && std::string(target, static_cast<std::size_t>(n)) == want) found = true;
  }
  if (d) closedir(d);
  return found;
}

TEST(IpcFacade, AForkedChildHasNoBrokerUntilItExportsUnderItsOwnName) {
  Rig rig(BackendKind::vmm);
  const DevPtr b = rig.alloc(kMiB);
  IpcHandle h;
  bool pass = true;
  ASSERT_EQ(get_mem_handle(rig.core, b, &h, &pass), res::ok);
  ASSERT_FALSE(pass);
  const HandleFields parent = fields(h);
  const unsigned long listener = socket_inode(parent);
  ASSERT_NE(listener, 0u) << "the parent listens after its first export";
  ASSERT_TRUE(holds_socket(listener));

  Channel up, down;
  const pid_t child = spawn([&] {
    up.keep_writing_end();
    down.keep_reading_end();
    if (holds_socket(listener)) return 1;  // the parent's listener is closed here
    const DevPtr c = rig.alloc(kMiB);
    fill(c, kMiB, 21);
    IpcHandle mine;
    bool p = true;
    if (get_mem_handle(rig.core, c, &mine, &p) != res::ok || p) return 2;
    HandleFields f;
    if (decode(mine, &f) != Decoded::ours) return 3;
    if (f.pid != static_cast<std::uint32_t>(getpid()) || f.nonce == parent.nonce) return 4;
    if (!up.send(mine)) return 5;
    int done = 0;
    if (!down.recv(&done)) return 6;
    return holds(c, kMiB, 22) ? 0 : 7;  // the parent's write
  });
  up.keep_reading_end();
  down.keep_writing_end();
  IpcHandle theirs;
  ASSERT_TRUE(up.recv(&theirs));
  DevPtr q = 0;
  ASSERT_EQ(open_mem_handle(rig.core, theirs, 0, &q, &pass), res::ok);
  ASSERT_FALSE(pass);
  EXPECT_TRUE(holds(q, kMiB, 21));
  fill(q, kMiB, 22);
  ASSERT_EQ(close_mem_handle(rig.core, q, &pass), res::ok);
  EXPECT_FALSE(pass);
  ASSERT_TRUE(down.send(1));
  EXPECT_EQ(wait_exit(child), 0);
  // The parent's own broker is untouched by all this.
  EXPECT_EQ(socket_inode(parent), listener);
  EXPECT_EQ(rig.free(b), res::ok);
}

}  // namespace
}  // namespace allocshim::ipc::test
