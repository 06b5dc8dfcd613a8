// Export and import within one process on the fake driver: the import is a second mapping of the
// same memory (memfds), so data, offsets, reference counts, access, deferral and every refusal can
// be checked directly.
#include <signal.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>
#include <filesystem>
#include <fstream>
#include <string>

#include "ipc/ipc.h"
#include "ipc_rig.h"

namespace allocshim::ipc::test {
namespace {

class IpcLocal : public ::testing::TestWithParam<BackendKind> {};

// One block of `bytes` exported, and an importer in the same process.
struct OneExport {
  explicit OneExport(BackendKind kind, std::size_t bytes = kMiB, bool ipc = true,
                     FakeConfig config = {})
      : rig(kind, ipc, config), b(rig.alloc(bytes)) {}
  // The export opened with `flags`; the test fails if the importer refuses it.
  DevPtr open(unsigned flags = 0) {
    DevPtr q = 0;
    EXPECT_EQ(importer.open(fields(h), flags, &q), res::ok);
    return q;
  }
  void close(DevPtr q) {
    bool ours = false;
    EXPECT_EQ(importer.close(q, &ours), res::ok);
    EXPECT_TRUE(ours);
  }
  Rig rig;
  Exporter exporter{rig.core};
  const DevPtr b;
  const IpcHandle h = exported(exporter, b);
  Importer importer{rig.driver()};
};

TEST_P(IpcLocal, ImportSeesTheSameBytesAtTheBlocksOffset) {
  Rig rig(GetParam());
  Exporter exporter(rig.core);
  const DevPtr a = rig.alloc(1 * kMiB);
  const DevPtr b = rig.alloc(1 * kMiB + 512);  // sub-allocated next to `a` where the backend can
  fill(b, 1 * kMiB + 512, 3);
  IpcHandle h;
  bool passthrough = true;
  ASSERT_EQ(exporter.export_block(b, &h, &passthrough), res::ok);
  EXPECT_FALSE(passthrough);
  const HandleFields f = fields(h);
  EXPECT_EQ(f.size, 1 * kMiB + 512);
  if (GetParam() == BackendKind::async_pool) {
    EXPECT_EQ(f.kind, Kind::pool);
  } else {
    EXPECT_EQ(f.kind, Kind::vmm);  // host memory is VMM-mapped too
    if (GetParam() == BackendKind::vmm) {
      EXPECT_NE(f.offset, 0u) << "the second block of a chunk starts inside it";
    }
  }

  Importer importer(rig.driver());
  DevPtr q = 0;
  ASSERT_EQ(importer.open(f, 0, &q), res::ok);
  EXPECT_NE(q, b);
  EXPECT_TRUE(holds(q, 1 * kMiB + 512, 3)) << "the importer reads what the exporter wrote";
  fill(q, 4096, 99);
  EXPECT_TRUE(holds(b, 4096, 99)) << "and the exporter reads what the importer wrote";
  EXPECT_EQ(exporter.info().open_imports, 1u);

  bool ours = false;
  ASSERT_EQ(importer.close(q, &ours), res::ok);
  EXPECT_TRUE(ours);
  EXPECT_EQ(importer.open_count(), 0u);
  EXPECT_EQ(exporter.info().open_imports, 0u) << "a close is counted before it returns";
  EXPECT_EQ(rig.free(a), res::ok);
  EXPECT_EQ(rig.free(b), res::ok);
  EXPECT_EQ(exporter.info().exports, 0u) << "freed with nothing open: forgotten";
}

TEST_P(IpcLocal, OpeningTwiceSharesOneMappingUntilTheLastClose) {
  Rig rig(GetParam());
  Exporter exporter(rig.core);
  const DevPtr b = rig.alloc(3 * kMiB);
  IpcHandle h, h2;
  bool pass = false;
  ASSERT_EQ(exporter.export_block(b, &h, &pass), res::ok);
  ASSERT_EQ(exporter.export_block(b, &h2, &pass), res::ok);
  EXPECT_EQ(std::memcmp(h.bytes, h2.bytes, sizeof h.bytes), 0) << "a block has one handle";
  Importer importer(rig.driver());
  DevPtr q1 = 0, q2 = 0;
  ASSERT_EQ(importer.open(fields(h), 0, &q1), res::ok);
  ASSERT_EQ(importer.open(fields(h), 0, &q2), res::ok);
  EXPECT_EQ(q1, q2);
  EXPECT_EQ(exporter.info().open_imports, 1u);
  bool ours = false;
  ASSERT_EQ(importer.close(q1, &ours), res::ok);
  EXPECT_EQ(importer.open_count(), 1u);
  fill(q2, 64, 1);  // still mapped
  ASSERT_EQ(importer.close(q2, &ours), res::ok);
  EXPECT_EQ(importer.open_count(), 0u);
  EXPECT_EQ(importer.imported_pools(), 0u);
  EXPECT_EQ(rig.free(b), res::ok);
}

TEST_P(IpcLocal, AFreeWhileOpenIsDeferredUntilTheLastClose) {
  OneExport t(GetParam(), 2 * kMiB);
  Rig& rig = t.rig;
  const Exporter& exporter = t.exporter;
  const DevPtr b = t.b;
  fill(b, 2 * kMiB, 5);
  const DevPtr q = t.open();

  const std::uint64_t frees_before = rig.backend(GetParam()).stats().device(0).frees();
  ASSERT_EQ(rig.free(b), res::ok);
  EXPECT_EQ(exporter.info().deferred, 1u);
  EXPECT_EQ(rig.backend(GetParam()).stats().device(0).frees(), frees_before)
      << "not given back yet";
  // The block is not handed out again while the importer uses it.
  const DevPtr c = rig.alloc(2 * kMiB);
  EXPECT_NE(c, b);
  fill(c, 2 * kMiB, 77);
  EXPECT_TRUE(holds(q, 2 * kMiB, 5)) << "the importer's bytes are its own to keep";

  // A new open of the freed block is refused: the exporter let go of it.
  Importer other(rig.driver());
  DevPtr q2 = 0;
  EXPECT_EQ(other.open(fields(t.h), 0, &q2), res::invalid_value);

  t.close(q);
  EXPECT_EQ(exporter.info().deferred, 0u);
  EXPECT_EQ(exporter.info().released, 1u);
  EXPECT_EQ(exporter.info().exports, 0u);
  EXPECT_EQ(rig.backend(GetParam()).stats().device(0).frees(), frees_before + 1);
  EXPECT_EQ(rig.free(c), res::ok);
}

TEST_P(IpcLocal, AStaleHandleIsRefused) {
  Rig rig(GetParam());
  Exporter exporter(rig.core);
  const DevPtr b = rig.alloc(kMiB);
  const IpcHandle h = exported(exporter, b);
  ASSERT_EQ(rig.free(b), res::ok);
  const DevPtr again = rig.alloc(kMiB);  // maybe at the same address: a new export, a new id
  const IpcHandle h2 = exported(exporter, again);
  EXPECT_NE(fields(h).export_id, fields(h2).export_id);
  Importer importer(rig.driver());
  DevPtr q = 0;
  EXPECT_EQ(importer.open(fields(h), 0, &q), res::invalid_value);
  ASSERT_EQ(importer.open(fields(h2), 0, &q), res::ok);
  bool ours = false;
  EXPECT_EQ(importer.close(q, &ours), res::ok);
  EXPECT_EQ(rig.free(again), res::ok);
}

TEST_P(IpcLocal, ForgedHandlesAreRefused) {
  OneExport t(GetParam());
  const Exporter& exporter = t.exporter;
  Importer& importer = t.importer;
  const HandleFields good = fields(t.h);
  DevPtr q = 0;
  HandleFields f = good;
  f.export_id += 1;
  EXPECT_EQ(importer.open(f, 0, &q), res::invalid_value);
  f = good;
  f.nonce ^= 1;  // names no listening exporter
  EXPECT_EQ(importer.open(f, 0, &q), res::invalid_value);
  f = good;
  f.size += 256;
  EXPECT_EQ(importer.open(f, 0, &q), res::invalid_value);
  f = good;
  f.offset += 256;
  EXPECT_EQ(importer.open(f, 0, &q), res::invalid_value);
  f = good;
  f.kind = f.kind == Kind::vmm ? Kind::pool : Kind::vmm;
  EXPECT_EQ(importer.open(f, 0, &q), res::invalid_value);
  f = good;
  f.secret ^= 1;
  EXPECT_EQ(importer.open(f, 0, &q), res::invalid_value);
  f = good;
  f.pid = static_cast<std::uint32_t>(getpid()) + 100000;
  EXPECT_EQ(importer.open(f, 0, &q), res::invalid_value);
  EXPECT_EQ(importer.open(good, 2, &q), res::invalid_value) << "flags other than lazy peer access";
  EXPECT_EQ(importer.open_count(), 0u);
  EXPECT_EQ(exporter.info().open_imports, 0u) << "every refused open left nothing counted";
  EXPECT_EQ(importer.connections(), 0u) << "each refusal ended its connection";
  EXPECT_GE(exporter.info().refused_opens, 5u);
  // After all that, the real handle still works, over a new connection.
  t.close(t.open());
  EXPECT_EQ(t.rig.free(t.b), res::ok);
}

// Two blocks of one process exported, and an importer in the same process.
struct TwoExports {
  explicit TwoExports(BackendKind kind) : rig(kind) {}
  ~TwoExports() {
    EXPECT_EQ(rig.free(a), res::ok);
    EXPECT_EQ(rig.free(b), res::ok);
  }
  Rig rig;
  Exporter exporter{rig.core};
  const DevPtr a = rig.alloc(kMiB);
  const DevPtr b = rig.alloc(kMiB);
  const HandleFields fa = fields(exported(exporter, a));
  const HandleFields fb = fields(exported(exporter, b));
  Importer importer{rig.driver()};
};

TEST_P(IpcLocal, EachExportHasItsOwnSecret) {
  TwoExports t(GetParam());
  EXPECT_NE(t.fa.secret, t.fb.secret);
  EXPECT_EQ(fields(exported(t.exporter, t.a)).secret, t.fa.secret)
      << "a block exported again keeps its handle";
  DevPtr q = 0;
  HandleFields swapped = t.fb;
  swapped.secret = t.fa.secret;
  EXPECT_EQ(t.importer.open(swapped, 0, &q), res::invalid_value) << "another export's secret";
  EXPECT_EQ(t.exporter.info().open_imports, 0u);
}

// The connection is the lease on what is open from one exporter; leasing nothing, it is closed.
TEST_P(IpcLocal, TheConnectionEndsWithTheLastImportFromItsExporter) {
  TwoExports t(GetParam());
  Exporter& exporter = t.exporter;
  Importer& importer = t.importer;
  const HandleFields& fa = t.fa;
  const HandleFields& fb = t.fb;
  DevPtr qa = 0, qb = 0;
  ASSERT_EQ(importer.open(fa, 0, &qa), res::ok);
  ASSERT_EQ(importer.open(fb, 0, &qb), res::ok);
  EXPECT_EQ(importer.connections(), 1u) << "one connection per exporter";
  bool ours = false;
  ASSERT_EQ(importer.close(qa, &ours), res::ok);
  EXPECT_EQ(importer.connections(), 1u) << "still leasing b";
  ASSERT_EQ(importer.close(qb, &ours), res::ok);
  EXPECT_EQ(importer.connections(), 0u);
  EXPECT_TRUE(eventually([&] { return exporter.info().connections == 0; }));
  // A refused open leaves no connection behind either.
  HandleFields stale = fa;
  stale.export_id += 100;
  EXPECT_EQ(importer.open(stale, 0, &qa), res::invalid_value);
  EXPECT_EQ(importer.connections(), 0u);
}

TEST_P(IpcLocal, LazyPeerAccessGrantsEveryDevice) {
  FakeConfig config;
  config.devices = 3;
  OneExport t(GetParam(), kMiB, true, config);
  const fake::FakeDriver& fake = t.rig.fake;
  const DevPtr plain = t.open();
  if (GetParam() == BackendKind::vmm) {
    EXPECT_TRUE(fake.has_access(plain, 0, true));
    EXPECT_FALSE(fake.has_access(plain, 1, true)) << "no peers without the flag";
  }
  t.close(plain);
  const DevPtr lazy = t.open(kLazyEnablePeerAccess);
  if (GetParam() == BackendKind::vmm) {
    for (int d = 0; d < 3; ++d) EXPECT_TRUE(fake.has_access(lazy, d, true)) << "device " << d;
  }
  t.close(lazy);
  EXPECT_EQ(t.rig.free(t.b), res::ok);
}

TEST_P(IpcLocal, AnImporterThatGoesAwayEndsItsOpens) {
  Rig rig(GetParam());
  Exporter exporter(rig.core);
  const DevPtr b = rig.alloc(kMiB);
  const IpcHandle h = exported(exporter, b);
  {
    Importer importer(rig.driver());
    DevPtr q = 0;
    ASSERT_EQ(importer.open(fields(h), 0, &q), res::ok);
    ASSERT_EQ(rig.free(b), res::ok);
    EXPECT_EQ(exporter.info().deferred, 1u);
  }  // destroyed without closing: its connection ends
  // The broker thread updates these one after another: wait for the whole final state.
  EXPECT_TRUE(eventually([&] {
    const Exporter::Info now = exporter.info();
    return now.deferred == 0 && now.released == 1 && now.open_imports == 0;
  }));
  EXPECT_EQ(exporter.info().open_imports, 0u);
  EXPECT_EQ(exporter.info().released, 1u);
  EXPECT_TRUE(eventually([&] { return exporter.info().connections == 0; }));
}

TEST_P(IpcLocal, AnExporterThatIsGoneRefusesQuickly) {
  Rig rig(GetParam());
  IpcHandle h;
  DevPtr b = rig.alloc(kMiB);
  {
    Exporter exporter(rig.core);
    bool pass = false;
    ASSERT_EQ(exporter.export_block(b, &h, &pass), res::ok);
  }
  Importer importer(rig.driver());
  DevPtr q = 0;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(importer.open(fields(h), 0, &q), res::invalid_value);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_EQ(rig.free(b), res::ok);
}

TEST_P(IpcLocal, ThreadsExportOpenCloseAndFreeConcurrently) {
  Rig rig(GetParam());
  Exporter exporter(rig.core);
  Importer importer(rig.driver());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        const std::size_t size = (1 + (i + t) % 3) * 256 * 1024;
        const DevPtr b = rig.alloc(size);
        const auto seed = static_cast<unsigned char>(t * 50 + i);
        fill(b, 4096, seed);
        IpcHandle h;
        bool pass = false;
        DevPtr q = 0;
        bool ours = false;
        if (exporter.export_block(b, &h, &pass) != res::ok ||
            importer.open(fields(h), 0, &q) != res::ok || !holds(q, 4096, seed))
          ++failures;
        // Half the time the exporter frees first (kept until the close), half the time after.
        if (i % 2 == 0 && rig.free(b) != res::ok) ++failures;
        if (q != 0 && importer.close(q, &ours) != res::ok) ++failures;
        if (i % 2 == 1 && rig.free(b) != res::ok) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  const Exporter::Info i = exporter.info();
  EXPECT_EQ(i.exports, 0u);
  EXPECT_EQ(i.open_imports, 0u);
  EXPECT_EQ(i.deferred, 0u);
  EXPECT_EQ(i.released, 200u);
  EXPECT_EQ(importer.open_count(), 0u);
  EXPECT_EQ(rig.backend(GetParam()).stats().device(0).live_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, IpcLocal,
                         ::testing::Values(BackendKind::vmm, BackendKind::async_pool,
                                           BackendKind::host),
                         [](const auto& info) {
                           return std::string(backend_kind_name(info.param));
                         });

// Whether an abstract socket named for this process and uid is bound (/proc/net/unix lists it).
bool listening_here() {
  std::ifstream f("/proc/net/unix");
  char prefix[64];
  std::snprintf(prefix, sizeof prefix, "@allocshim-ipc.%u.%d.", static_cast<unsigned>(geteuid()),
                static_cast<int>(getpid()));
  for (std::string line; std::getline(f, line);)
    if (line.find(prefix) != std::string::npos) return true;
  return false;
}

TEST(IpcExport, NothingListensBeforeTheFirstExport) {
  Rig rig(BackendKind::vmm);
  Exporter exporter(rig.core);
  const DevPtr b = rig.alloc(kMiB);
  EXPECT_FALSE(exporter.info().listening);
  EXPECT_FALSE(listening_here());
  exported(exporter, b);
  EXPECT_TRUE(exporter.info().listening);
  EXPECT_TRUE(listening_here());
  EXPECT_EQ(rig.free(b), res::ok);
}

// SigBlk of the thread named `name` in this process, as a bit set; 0 if there is none.
unsigned long long blocked_signals_of(const std::string& name) {
  unsigned long long bits = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::string comm;
    std::getline(std::ifstream(task.path() / "comm"), comm);
    if (comm != name) continue;
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);)
      if (line.rfind("SigBlk:", 0) == 0) bits = std::stoull(line.substr(7), nullptr, 16);
  }
  return bits;
}

TEST(IpcExport, TheBrokerThreadBlocksTheProgramsSignals) {
  Rig rig(BackendKind::vmm);
  Exporter exporter(rig.core);
  const DevPtr b = rig.alloc(kMiB);
  exported(exporter, b);
  const unsigned long long bits = blocked_signals_of("allocshim-ipc");
  for (int sig : {SIGTERM, SIGUSR1, SIGINT, SIGCHLD})
    EXPECT_TRUE(bits & (1ull << (sig - 1))) << "signal " << sig;
  EXPECT_EQ(rig.free(b), res::ok);
}

TEST(IpcExport, NativeMemoryAndUnknownPointersPassThrough) {
  Rig rig(BackendKind::native);
  Exporter exporter(rig.core);
  const DevPtr b = rig.alloc(kMiB);
  IpcHandle h;
  bool pass = false;
  ASSERT_EQ(exporter.export_block(b, &h, &pass), res::ok);
  EXPECT_TRUE(pass);
  ASSERT_EQ(exporter.export_block(0x1234000, &h, &pass), res::ok);
  EXPECT_TRUE(pass);
  EXPECT_FALSE(exporter.info().listening) << "a passthrough is no export";
  EXPECT_EQ(rig.free(b), res::ok);
}

// A fake device whose driver cannot export memory as POSIX file descriptors.
FakeConfig without_posix_fd_handles() {
  FakeConfig c;
  c.attributes[static_cast<int>(DevAttr::posix_fd_supported)] = 0;
  return c;
}

// Exporting a fresh block of `rig` is refused: invalid_value, nothing passed to the driver, nothing
// exported and no socket; what the refusal said on stderr is returned.
std::string expect_export_refused(Rig& rig) {
  Exporter exporter(rig.core);
  const DevPtr b = rig.alloc(kMiB);
  IpcHandle h;
  bool pass = true;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(exporter.export_block(b, &h, &pass), res::invalid_value);
  std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(pass);
  EXPECT_EQ(exporter.info().exports, 0u);
  EXPECT_FALSE(exporter.info().listening);
  EXPECT_EQ(rig.free(b), res::ok);
  return said;
}

TEST(IpcExport, UnexportablePoolsAreRefusedLikeNativeIpc) {
  Rig rig(BackendKind::async_pool, /*ipc=*/false);
  expect_export_refused(rig);
}

TEST(IpcExport, VmmChunksAreExportableWithoutAPolicyOption) {
  OneExport t(BackendKind::vmm, kMiB, /*ipc=*/false);  // the device supports POSIX-FD handles
  t.close(t.open());
  EXPECT_EQ(t.rig.free(t.b), res::ok);
}

TEST(IpcExport, UnexportableVmmChunksAreRefused) {
  Rig rig(BackendKind::vmm, /*ipc=*/false, without_posix_fd_handles());
  expect_export_refused(rig);
}

TEST(IpcExport, ManagedMemoryIsRefusedNamingTheBackendAndTheRule) {
  // Managed memory cannot be shared by CUDA IPC at all.
  Rig rig(BackendKind::managed, /*ipc=*/false);
  const std::string said = expect_export_refused(rig);
  EXPECT_NE(said.find("backend \"managed\""), std::string::npos) << said;
  EXPECT_NE(said.find("the default backend of <ipc test>"), std::string::npos) << said;
}

TEST(IpcExport, HostMemoryWithoutPosixFdHandlesIsRefusedCleanly) {
  Rig rig(BackendKind::host, /*ipc=*/false, without_posix_fd_handles());
  expect_export_refused(rig);
}

TEST(IpcExport, HostMemoryIsExportableWithoutANumaId) {
  // The host backend asks for HOST_NUMA node 0 there (plain HOST memory cannot be exported), and
  // finds its pieces itself (the driver answers base 0 for host-located VMM memory).
  FakeConfig c;
  c.attributes[static_cast<int>(DevAttr::host_numa_id)] = -1;
  OneExport t(BackendKind::host, 3 * kMiB + 5, /*ipc=*/false, c);
  fill(t.b, 3 * kMiB + 5, 7);
  const DevPtr q = t.open();
  EXPECT_TRUE(holds(q, 3 * kMiB + 5, 7));
  t.close(q);
  EXPECT_EQ(t.rig.free(t.b), res::ok);
}

TEST(IpcExport, InteriorPointersExportTheirBlock) {
  Rig rig(BackendKind::vmm);
  Exporter exporter(rig.core);
  const DevPtr b = rig.alloc(kMiB);
  IpcHandle whole, inner;
  bool pass = false;
  ASSERT_EQ(exporter.export_block(b, &whole, &pass), res::ok);
  ASSERT_EQ(exporter.export_block(b + 4096, &inner, &pass), res::ok);
  EXPECT_EQ(std::memcmp(whole.bytes, inner.bytes, sizeof whole.bytes), 0)
      << "as natively, a handle names the allocation and opens at its start";
  EXPECT_EQ(rig.free(b), res::ok);
}

TEST(IpcExport, FacadeCreatesNoExporterForNativeMemoryAndPassesForeignHandles) {
  Rig rig(BackendKind::native);
  const DevPtr b = rig.alloc(kMiB);
  IpcHandle h;
  bool pass = false;
  ASSERT_EQ(get_mem_handle(rig.core, b, &h, &pass), res::ok);
  EXPECT_TRUE(pass);
  EXPECT_FALSE(listening_here());
  IpcHandle native{};
  DevPtr q = 0;
  ASSERT_EQ(open_mem_handle(rig.core, native, 0, &q, &pass), res::ok);
  EXPECT_TRUE(pass);
  ASSERT_EQ(close_mem_handle(rig.core, b, &pass), res::ok);
  EXPECT_TRUE(pass) << "a pointer not opened from a shim handle goes to the driver";
  IpcHandle corrupt;
  HandleFields f;
  f.pid = 1;
  f.nonce = 2;
  f.export_id = 3;
  f.size = 4;
  encode(f, &corrupt);
  corrupt.bytes[20] ^= 1;
  EXPECT_EQ(open_mem_handle(rig.core, corrupt, 0, &q, &pass), res::invalid_value);
  EXPECT_FALSE(pass);
  EXPECT_EQ(rig.free(b), res::ok);
}

}  // namespace
}  // namespace allocshim::ipc::test
