// The broker protocol under abuse, on both ends: an exporter fed malformed requests and connections
// from another uid, and an importer fed malformed answers by a rogue exporter. Neither may crash,
// hang past its timeout, leak a file descriptor or count an open it did not serve.
#include <dirent.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>

#include "ipc/wire.h"
#include "ipc_rig.h"

namespace allocshim::ipc::test {
namespace {

std::size_t open_fds() {
  std::size_t n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

struct Exported {
  explicit Exported(ExporterOptions options = {})
      : rig(BackendKind::vmm), exporter(rig.core, options), block(rig.alloc(kMiB)) {
    bool pass = false;
    EXPECT_EQ(exporter.export_block(block, &handle, &pass), res::ok);
  }
  ~Exported() { rig.free(block); }
  int connect() const {
    return wire::connect_to(wire::socket_name(geteuid(), getpid(), exporter.nonce()), geteuid(),
                            2000);
  }
  Rig rig;
  Exporter exporter;
  DevPtr block;
  IpcHandle handle;
};

wire::Request good_request(const HandleFields& f, wire::Type type = wire::Type::open) {
  wire::Request r;
  r.h.type = type;
  r.kind = static_cast<std::uint8_t>(f.kind);
  r.nonce = f.nonce;
  r.export_id = f.export_id;
  r.offset = f.offset;
  r.size = f.size;
  r.secret = f.secret;
  return r;
}

// True if the peer closes the connection (instead of answering or hanging).
bool dropped(int fd) {
  char buf[16];
  const ssize_t n = recv(fd, buf, sizeof buf, 0);
  return n <= 0;
}

TEST(IpcBroker, MalformedRequestsDropTheirConnectionOnly) {
  Exported ex;
  const HandleFields f = fields(ex.handle);
  const std::size_t fds_before = open_fds();
  std::vector<std::function<void(int)>> abuses = {
      [](int fd) { ASSERT_EQ(send(fd, "abc", 3, 0), 3); },  // short
      [&](int fd) {                                         // long
        char big[sizeof(wire::Request) + 10] = {};
        ASSERT_TRUE(wire::send_message(fd, big, sizeof big));
      },
      [&](int fd) {  // wrong magic
        wire::Request r = good_request(f);
        r.h.magic ^= 1;
        ASSERT_TRUE(wire::send_message(fd, &r, sizeof r));
      },
      [&](int fd) {  // wrong version
        wire::Request r = good_request(f);
        r.h.version = 99;
        ASSERT_TRUE(wire::send_message(fd, &r, sizeof r));
      },
      [&](int fd) {  // a type importers never send
        wire::Request r = good_request(f);
        r.h.type = wire::Type::pieces;
        ASSERT_TRUE(wire::send_message(fd, &r, sizeof r));
      },
      [&](int fd) {  // reserved bytes set
        wire::Request r = good_request(f);
        r.reserved[1] = 1;
        ASSERT_TRUE(wire::send_message(fd, &r, sizeof r));
      },
      [&](int fd) {  // a good request carrying file descriptors nobody asked for
        wire::Request r = good_request(f);
        int extra[2] = {dup(0), dup(1)};
        ASSERT_TRUE(wire::send_message(fd, &r, sizeof r, extra, 2));
        wire::close_all(extra, 2);
      },
      [](int fd) { ASSERT_EQ(send(fd, "", 0, 0), 0); },  // empty
  };
  for (std::size_t i = 0; i < abuses.size(); ++i) {
    const int fd = ex.connect();
    ASSERT_GE(fd, 0);
    abuses[i](fd);
    EXPECT_TRUE(dropped(fd)) << "abuse " << i;
    close(fd);
  }
  EXPECT_TRUE(eventually([&] { return ex.exporter.info().connections == 0; }));
  // An empty message reads as the end of the connection (recvmsg returns 0 for both): dropped too,
  // but not counted as malformed.
  EXPECT_EQ(ex.exporter.info().bad_messages, abuses.size() - 1);
  EXPECT_EQ(ex.exporter.info().open_imports, 0u);
  EXPECT_EQ(open_fds(), fds_before) << "the broker closed every fd it was sent";

  // The broker still serves a proper importer.
  Importer importer(ex.rig.driver());
  DevPtr q = 0;
  ASSERT_EQ(importer.open(f, 0, &q), res::ok);
  bool ours = false;
  EXPECT_EQ(importer.close(q, &ours), res::ok);
}

// Reads an open's reply and its one batch of pieces (closing the fd); the reply's status.
int read_open(int fd) {
  wire::Reply rep;
  if (wire::recv_message(fd, &rep, sizeof rep) != 1) return -1;
  if (rep.status != res::ok) return rep.status;
  wire::Pieces pieces;
  int piece_fd = -1;
  if (wire::recv_message(fd, &pieces, sizeof pieces, &piece_fd, 1) != 1) return -2;
  close(piece_fd);
  return rep.status;
}

TEST(IpcBroker, ACloseOfNothingIsAnsweredAndTheConnectionKept) {
  Exported ex;
  const HandleFields f = fields(ex.handle);
  const int fd = ex.connect();
  ASSERT_GE(fd, 0);
  wire::Reply rep;
  wire::Request close_unopened = good_request(f, wire::Type::close);
  ASSERT_TRUE(wire::send_message(fd, &close_unopened, sizeof close_unopened));
  ASSERT_EQ(wire::recv_message(fd, &rep, sizeof rep), 1);
  EXPECT_EQ(rep.status, res::invalid_value) << "a close of nothing opened over this connection";
  // The same connection then opens for real: a reply and one batch with one fd.
  wire::Request open = good_request(f);
  ASSERT_TRUE(wire::send_message(fd, &open, sizeof open));
  EXPECT_EQ(read_open(fd), res::ok);
  EXPECT_EQ(ex.exporter.info().open_imports, 1u);
  close(fd);  // the lease ends with the connection
  EXPECT_TRUE(eventually([&] { return ex.exporter.info().open_imports == 0; }));
  EXPECT_EQ(ex.exporter.info().bad_messages, 0u);
}

// Whoever can reach the socket (its name is in /proc/net/unix) knows the pid and nonce, and export
// ids count from 1: only the handle's secret keeps the memory from a process never given it.
TEST(IpcBroker, AWrongGuessIsRefusedAndEndsTheConnection) {
  Exported ex;
  const HandleFields f = fields(ex.handle);
  std::vector<std::pair<const char*, std::function<void(wire::Request&)>>> guesses = {
      {"secret", [](wire::Request& r) { r.secret ^= 1; }},
      {"no secret", [](wire::Request& r) { r.secret = 0; }},
      {"export id", [](wire::Request& r) { r.export_id += 1; }},
      {"nonce", [](wire::Request& r) { r.nonce ^= 0xff; }},
  };
  for (auto& [what, change] : guesses) {
    const int fd = ex.connect();
    ASSERT_GE(fd, 0);
    wire::Request guess = good_request(f);
    change(guess);
    ASSERT_TRUE(wire::send_message(fd, &guess, sizeof guess));
    EXPECT_EQ(read_open(fd), res::invalid_value) << what;
    EXPECT_TRUE(dropped(fd)) << what << ": the connection stayed open for the next guess";
    close(fd);
  }
  EXPECT_EQ(ex.exporter.info().refused_opens, guesses.size());
  EXPECT_EQ(ex.exporter.info().open_imports, 0u);
  EXPECT_TRUE(eventually([&] { return ex.exporter.info().connections == 0; }));
}

// A guess over a connection that leases an import must not end that import (the exporter would
// give the block back while it is still mapped): the connection only closes what it has open.
TEST(IpcBroker, AGuessOverALeasingConnectionBarsOpensButKeepsTheLease) {
  Exported ex;
  const HandleFields f = fields(ex.handle);
  const int fd = ex.connect();
  ASSERT_GE(fd, 0);
  wire::Request open = good_request(f);
  ASSERT_TRUE(wire::send_message(fd, &open, sizeof open));
  ASSERT_EQ(read_open(fd), res::ok);
  wire::Request guess = good_request(f);
  guess.secret += 1;
  ASSERT_TRUE(wire::send_message(fd, &guess, sizeof guess));
  EXPECT_EQ(read_open(fd), res::invalid_value);
  EXPECT_EQ(ex.exporter.info().open_imports, 1u) << "the lease survived the guess";
  // Its close is served, and ends the connection.
  wire::Request close_it = good_request(f, wire::Type::close);
  ASSERT_TRUE(wire::send_message(fd, &close_it, sizeof close_it));
  wire::Reply rep;
  ASSERT_EQ(wire::recv_message(fd, &rep, sizeof rep), 1);
  EXPECT_EQ(rep.status, res::ok);
  EXPECT_TRUE(dropped(fd));
  close(fd);
  EXPECT_EQ(ex.exporter.info().open_imports, 0u);

  // A barred connection that asks to open again is dropped, its lease with it.
  const int fd2 = ex.connect();
  ASSERT_TRUE(wire::send_message(fd2, &open, sizeof open));
  ASSERT_EQ(read_open(fd2), res::ok);
  ASSERT_TRUE(wire::send_message(fd2, &guess, sizeof guess));
  EXPECT_EQ(read_open(fd2), res::invalid_value);
  ASSERT_TRUE(wire::send_message(fd2, &open, sizeof open));
  EXPECT_TRUE(dropped(fd2));
  close(fd2);
  EXPECT_TRUE(eventually([&] { return ex.exporter.info().open_imports == 0; }));

  // The importer retires a connection whose open was refused: its lease stays, later opens go
  // over a new connection.
  Importer importer(ex.rig.driver());
  DevPtr q = 0;
  ASSERT_EQ(importer.open(f, 0, &q), res::ok);
  HandleFields forged = f;
  forged.secret ^= 0x10;
  forged.export_id += 7;
  DevPtr r = 0;
  EXPECT_EQ(importer.open(forged, 0, &r), res::invalid_value);
  EXPECT_EQ(ex.exporter.info().open_imports, 1u);
  bool ours = false;
  EXPECT_EQ(importer.close(q, &ours), res::ok);
  EXPECT_TRUE(eventually([&] { return ex.exporter.info().open_imports == 0; }));
  EXPECT_EQ(importer.connections(), 0u);
}

TEST(IpcBroker, APeerOfAnotherUidIsRefused) {
  ExporterOptions options;
  options.peer_uid = geteuid() + 1;  // as if we were someone else to it
  Exported ex(options);
  Importer importer(ex.rig.driver());
  DevPtr q = 0;
  EXPECT_EQ(importer.open(fields(ex.handle), 0, &q), res::invalid_value);
  // Counted just after the connection is closed, which the importer may see first.
  EXPECT_TRUE(eventually([&] { return ex.exporter.info().refused_peers >= 1; }));
  EXPECT_EQ(ex.exporter.info().open_imports, 0u);
}

TEST(IpcBroker, AProcessOfAnotherUidIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another uid";
  Exported ex;
  const HandleFields f = fields(ex.handle);
  const std::string name = wire::socket_name(geteuid(), getpid(), ex.exporter.nonce());
  // The child only uses sockets (the fake driver's lock may be held by the broker at fork).
  const pid_t child = spawn([&] {
    if (setgid(65534) != 0 || setuid(65534) != 0) return 2;
    const int fd = wire::connect_to(name, 0, 2000);  // the exporter does run as root
    if (fd < 0) return 0;                            // refused at once
    wire::Request r = good_request(f);
    wire::Reply rep;
    if (!wire::send_message(fd, &r, sizeof r)) return 0;
    return wire::recv_message(fd, &rep, sizeof rep) == 1 ? 1 : 0;  // must get no answer
  });
  EXPECT_EQ(wait_exit(child), 0);
  EXPECT_TRUE(eventually([&] { return ex.exporter.info().refused_peers == 1; }));
  EXPECT_EQ(ex.exporter.info().open_imports, 0u);
}

// A rogue exporter: listens where a handle says an exporter is, answers the first request with
// `script`, then keeps the connection open until the test ends.
class Rogue {
 public:
  explicit Rogue(std::function<void(int)> script) : script_(std::move(script)) {
    fields_.pid = static_cast<std::uint32_t>(getpid());
    fields_.nonce = 0xbad0000000000000ull | static_cast<std::uint64_t>(counter_++);
    fields_.export_id = 1;
    fields_.size = kMiB;
    fields_.kind = Kind::vmm;
    listener_ = wire::listen_on(wire::socket_name(geteuid(), getpid(), fields_.nonce));
    EXPECT_GE(listener_, 0);
    thread_ = std::thread([this] {
      pollfd p{listener_, POLLIN, 0};
      if (poll(&p, 1, 5000) != 1) return;
      bool refused = false;
      const int fd = wire::accept_from(listener_, geteuid(), 5000, &refused);
      if (fd < 0) return;
      wire::Request req;
      if (wire::recv_message(fd, &req, sizeof req) == 1) script_(fd);
      char buf[8];
      while (!done_.load()) {
        pollfd q{fd, POLLIN, 0};
        if (poll(&q, 1, 10) == 1 && recv(fd, buf, sizeof buf, MSG_DONTWAIT) == 0) break;
      }
      close(fd);
    });
  }
  ~Rogue() {
    done_.store(true);
    thread_.join();
    close(listener_);
  }
  const HandleFields& fields() const { return fields_; }

 private:
  static inline int counter_ = 1;
  std::function<void(int)> script_;
  HandleFields fields_;
  int listener_ = -1;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

wire::Reply ok_reply(std::uint32_t pieces, std::uint64_t total) {
  wire::Reply r;
  r.kind = static_cast<std::uint8_t>(Kind::vmm);
  r.pieces = pieces;
  r.size = kMiB;
  r.total = total;
  return r;
}

int memfd_of(std::size_t bytes) {
  const int fd = memfd_create("allocshim-fake-dev0", MFD_CLOEXEC);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  return fd;
}

// A rogue exporter's answer for one block of 2 MiB: the reply, then one piece of `size` numbered
// `first` with `fds` attached (closed here once sent).
void send_one_piece(int fd, std::uint64_t size, std::vector<int> fds, std::uint32_t first = 0) {
  const wire::Reply r = ok_reply(1, 2 * kMiB);
  wire::send_message(fd, &r, sizeof r);
  wire::Pieces p;
  p.first = first;
  p.count = 1;
  p.sizes[0] = size;
  wire::send_message(fd, &p, sizeof p, fds.empty() ? nullptr : fds.data(), fds.size());
  wire::close_all(fds.data(), fds.size());
}

TEST(IpcImporter, MalformedAnswersAreRefusedWithoutLeaks) {
  FakeDriver fake;
  ImporterOptions options;
  options.io_timeout_ms = 300;  // the silent rogue below must not hold the test for long
  std::vector<std::pair<const char*, std::function<void(int)>>> scripts = {
      {"short reply", [](int fd) { wire::send_message(fd, "x", 1); }},
      {"silence", [](int) {}},
      {"reply of the wrong type",
       [](int fd) {
         wire::Reply r = ok_reply(1, 2 * kMiB);
         r.h.type = wire::Type::pool;
         wire::send_message(fd, &r, sizeof r);
       }},
      {"another block's size",
       [](int fd) {
         wire::Reply r = ok_reply(1, 2 * kMiB);
         r.size = 2 * kMiB;
         wire::send_message(fd, &r, sizeof r);
       }},
      {"no pieces",
       [](int fd) {
         wire::Reply r = ok_reply(0, 2 * kMiB);
         wire::send_message(fd, &r, sizeof r);
       }},
      {"block outside the total",
       [](int fd) {
         wire::Reply r = ok_reply(1, kMiB / 2);
         wire::send_message(fd, &r, sizeof r);
       }},
      {"too many pieces",
       [](int fd) {
         wire::Reply r = ok_reply(wire::kMaxPieces + 1, 2 * kMiB);
         wire::send_message(fd, &r, sizeof r);
       }},
      {"layout without fds", [](int fd) { send_one_piece(fd, 2 * kMiB, {}); }},
      {"more fds than pieces",
       [](int fd) {
         send_one_piece(fd, 2 * kMiB, {memfd_of(2 * kMiB), memfd_of(2 * kMiB)});
       }},
      {"sizes beyond the total",
       [](int fd) { send_one_piece(fd, 4 * kMiB, {memfd_of(4 * kMiB)}); }},
      {"an fd that is no allocation",
       [](int fd) {
         int pipefd[2];
         EXPECT_EQ(pipe(pipefd), 0);
         close(pipefd[1]);
         send_one_piece(fd, 2 * kMiB, {pipefd[0]});
       }},
      {"pieces out of order",
       [](int fd) { send_one_piece(fd, 2 * kMiB, {memfd_of(2 * kMiB)}, 5); }},
  };
  for (auto& [what, script] : scripts) {
    const std::size_t fds_before = open_fds();
    const std::size_t reservations_before = fake.reservations();
    {
      Rogue rogue(script);
      Importer importer(fake.driver(), options);
      DevPtr q = 0;
      const auto t0 = std::chrono::steady_clock::now();
      EXPECT_EQ(importer.open(rogue.fields(), 0, &q), res::invalid_value) << what;
      EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << what;
      EXPECT_EQ(importer.open_count(), 0u) << what;
      EXPECT_EQ(fake.mappings(), 0u) << what;
    }
    EXPECT_EQ(fake.reservations(), reservations_before) << what << ": VA given back";
    EXPECT_EQ(fake.live_handles(), 0u) << what << ": imported handles released";
    EXPECT_EQ(open_fds(), fds_before) << what << ": every received fd closed";
  }
}

}  // namespace
}  // namespace allocshim::ipc::test
