// Two and more real processes on the fake driver. fork gives each child its own copy of the fake
// device; what crosses between processes is only what crosses on a GPU: the 64-byte handle (here
// through a pipe) and the file descriptors the broker passes. Physical memory and pool arenas are
// memfds, so a child's writes through its import land in the parent's memory.
//
// Children are forked before the parent's broker thread exists, or use only sockets and the fake
// state they own: a child never touches a lock another thread held at fork.
#include <dirent.h>
#include <signal.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ipc_rig.h"

namespace allocshim::ipc::test {
namespace {

class IpcFork : public ::testing::TestWithParam<BackendKind> {};

// Child side: wait for a handle, open it, check the exporter's bytes, write ours, close.
int import_and_write(Channel& in, const Driver& driver, std::size_t offset, std::size_t bytes,
                     unsigned char expect, unsigned char write, bool close_it = true) {
  in.keep_reading_end();
  IpcHandle h;
  if (!in.recv(&h)) return 10;
  Importer importer(driver);
  DevPtr q = 0;
  if (importer.open(fields(h), 0, &q) != res::ok) return 11;
  if (!holds(q + offset, bytes, expect)) return 12;
  fill(q + offset, bytes, write);
  bool ours = false;
  if (close_it && (importer.close(q, &ours) != res::ok || !ours)) return 13;
  return 0;
}

TEST_P(IpcFork, AChildImportsAndWritesAtTheBlocksOffsetAndTheParentSeesIt) {
  Rig rig(GetParam());
  const DevPtr a = rig.alloc(kMiB);
  const DevPtr b = rig.alloc(kMiB + 512);
  fill(b, kMiB + 512, 1);
  Channel handle;
  const pid_t child =
      spawn([&] { return import_and_write(handle, rig.driver(), 0, kMiB + 512, 1, 2); });
  handle.keep_writing_end();
  Exporter exporter(rig.core);
  const IpcHandle h = exported(exporter, b);
  if (GetParam() == BackendKind::vmm) {
    EXPECT_NE(fields(h).offset, 0u);
  }
  ASSERT_TRUE(handle.send(h));
  EXPECT_EQ(wait_exit(child), 0);
  EXPECT_TRUE(holds(b, kMiB + 512, 2)) << "the child's writes are in the parent's block";
  EXPECT_TRUE(eventually([&] { return exporter.info().open_imports == 0; }));
  EXPECT_EQ(rig.free(a), res::ok);
  EXPECT_EQ(rig.free(b), res::ok);
}

TEST_P(IpcFork, AKilledImporterLeaksNothingInTheExporter) {
  Rig rig(GetParam());
  const DevPtr b = rig.alloc(2 * kMiB);
  fill(b, 2 * kMiB, 4);
  Channel handle, opened;
  const pid_t child = spawn([&] {
    handle.keep_reading_end();
    opened.keep_writing_end();
    IpcHandle h;
    if (!handle.recv(&h)) return 10;
    Importer importer(rig.driver());
    DevPtr q = 0;
    const int r = importer.open(fields(h), 0, &q) == res::ok && holds(q, 4096, 4) ? 0 : 11;
    opened.send(r);
    pause();  // killed here, with the import open
    return 0;
  });
  handle.keep_writing_end();
  opened.keep_reading_end();
  Exporter exporter(rig.core);
  ASSERT_TRUE(handle.send(exported(exporter, b)));
  int r = -1;
  ASSERT_TRUE(opened.recv(&r));
  ASSERT_EQ(r, 0);
  EXPECT_EQ(exporter.info().open_imports, 1u);
  ASSERT_EQ(rig.free(b), res::ok);
  EXPECT_EQ(exporter.info().deferred, 1u) << "kept while the child has it open";
  kill(child, SIGKILL);
  EXPECT_EQ(wait_exit(child), 128 + SIGKILL);
  // The broker thread notices the dead importer and updates these one after another: wait for the
  // whole final state, not just its first field, before checking each.
  EXPECT_TRUE(eventually([&] {
    const Exporter::Info now = exporter.info();
    return now.deferred == 0 && now.released == 1 && now.open_imports == 0;
  }));
  const Exporter::Info i = exporter.info();
  EXPECT_EQ(i.open_imports, 0u);
  EXPECT_EQ(i.released, 1u);
  EXPECT_EQ(i.exports, 0u);
  EXPECT_TRUE(eventually([&] { return exporter.info().connections == 0; }));
  EXPECT_EQ(rig.backend(GetParam()).stats().device(0).live_bytes(), 0u);
}

TEST_P(IpcFork, AnImportOutlivesItsExporterAndLaterOpensAreRefused) {
  Rig rig(GetParam());
  Channel handles, opened;
  // Here the child exports and the parent imports; the child exits while the parent has it open.
  const pid_t child = spawn([&] {
    handles.keep_writing_end();
    opened.keep_reading_end();
    Exporter exporter(rig.core);
    const DevPtr b = rig.alloc(kMiB);
    const DevPtr c = rig.alloc(kMiB);
    fill(b, kMiB, 9);
    IpcHandle h[2];
    bool pass = false;
    if (exporter.export_block(b, &h[0], &pass) != res::ok) return 1;
    if (exporter.export_block(c, &h[1], &pass) != res::ok) return 2;
    if (!handles.send(h)) return 3;
    int ack = 0;
    if (!opened.recv(&ack)) return 4;
    if (rig.free(b) != res::ok) return 5;  // kept for the parent...
    _exit(0);                              // ...until the whole process is gone
  });
  handles.keep_reading_end();
  opened.keep_writing_end();
  IpcHandle h[2];
  ASSERT_TRUE(handles.recv(&h));
  Importer importer(rig.driver());
  DevPtr q = 0;
  ASSERT_EQ(importer.open(fields(h[0]), 0, &q), res::ok);
  ASSERT_TRUE(opened.send(1));
  EXPECT_EQ(wait_exit(child), 0);
  EXPECT_TRUE(holds(q, kMiB, 9)) << "the mapping holds the memory, not the exporter";
  fill(q, kMiB, 10);
  EXPECT_TRUE(holds(q, kMiB, 10));
  DevPtr q2 = 0;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(importer.open(fields(h[1]), 0, &q2), res::invalid_value) << "no exporter to ask";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  bool ours = false;
  EXPECT_EQ(importer.close(q, &ours), res::ok) << "closing after the exporter left is fine";
  EXPECT_TRUE(ours);
  EXPECT_EQ(rig.fake.mappings(), 0u);
  EXPECT_EQ(importer.connections(), 0u);
}

TEST_P(IpcFork, EightImportersAtOnce) {
  constexpr int kImporters = 8;
  Rig rig(GetParam());
  const DevPtr b = rig.alloc(kImporters * kMiB);
  fill(b, kImporters * kMiB, 0);
  std::vector<std::unique_ptr<Channel>> handles;
  std::vector<pid_t> children;
  for (int i = 0; i < kImporters; ++i) {
    handles.push_back(std::make_unique<Channel>());
    Channel& in = *handles.back();
    children.push_back(spawn([&in, &handles, &rig, i] {
      for (auto& c : handles) c->keep_reading_end();  // only the parent may hold a write end
      // Each checks and writes its own MiB.
      return import_and_write(in, rig.driver(), i * kMiB, kMiB,
                              static_cast<unsigned char>(i * kMiB * 7),
                              static_cast<unsigned char>(100 + i));
    }));
    in.keep_writing_end();
  }
  Exporter exporter(rig.core);
  const IpcHandle h = exported(exporter, b);
  for (auto& c : handles) ASSERT_TRUE(c->send(h));  // all eight go at once
  for (int i = 0; i < kImporters; ++i) EXPECT_EQ(wait_exit(children[i]), 0) << "importer " << i;
  for (int i = 0; i < kImporters; ++i)
    EXPECT_TRUE(holds(b + i * kMiB, kMiB, static_cast<unsigned char>(100 + i))) << "slot " << i;
  EXPECT_TRUE(eventually([&] { return exporter.info().connections == 0; }));
  EXPECT_EQ(exporter.info().open_imports, 0u);
  EXPECT_EQ(rig.free(b), res::ok);
}

// Sockets this process has open (the fake driver keeps its destroyed pools' arenas: other fds vary).
std::size_t open_sockets() {
  std::size_t n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      char target[64] = {};
      const std::string link = std::string("/proc/self/fd/") + e->d_name;
      if (readlink(link.c_str(), target, sizeof target - 1) > 0 &&
          std::strncmp(target, "socket:", 7) == 0)
        ++n;
    }
    closedir(d);
  }
  return n;
}

// One exporter process after another hands the parent a handle and exits once the parent has
// opened it; the parent closes each import (keep_open false) or keeps them all.
void import_from_exporters_that_exit(Rig& rig, Importer& importer, int exporters, bool keep_open) {
  for (int i = 0; i < exporters; ++i) {
    Channel handles, opened;
    const pid_t child = spawn([&] {
      Exporter exporter(rig.core);
      const DevPtr b = rig.alloc(kMiB);
      fill(b, kMiB, static_cast<unsigned char>(i));
      IpcHandle h;
      bool pass = false;
      if (exporter.export_block(b, &h, &pass) != res::ok) return 1;
      if (!handles.send(h)) return 2;
      int ack = 0;
      if (!opened.recv(&ack)) return 3;
      return 0;
    });
    IpcHandle h;
    ASSERT_TRUE(handles.recv(&h));
    DevPtr q = 0;
    ASSERT_EQ(importer.open(fields(h), 0, &q), res::ok) << "exporter " << i;
    EXPECT_TRUE(holds(q, kMiB, static_cast<unsigned char>(i)));
    bool ours = false;
    if (!keep_open) {
      EXPECT_EQ(importer.close(q, &ours), res::ok);
    }
    ASSERT_TRUE(opened.send(1));
    ASSERT_EQ(wait_exit(child), 0);
  }
}

TEST_P(IpcFork, ExportersThatComeAndGoLeaveTheImporterNoDescriptors) {
  Rig rig(GetParam());
  Importer importer(rig.driver());
  const std::size_t sockets_before = open_sockets();
  import_from_exporters_that_exit(rig, importer, 50, false);
  EXPECT_EQ(importer.connections(), 0u);
  EXPECT_EQ(open_sockets(), sockets_before);
}

TEST_P(IpcFork, ImportsThatOutliveTheirExportersKeepNoConnections) {
  Rig rig(GetParam());
  Importer importer(rig.driver());
  constexpr int kExporters = 20;
  import_from_exporters_that_exit(rig, importer, kExporters, true);
  EXPECT_EQ(importer.open_count(), static_cast<std::size_t>(kExporters));
  // Each new connection first lets go of those whose exporter is gone: at most the last is left.
  EXPECT_LE(importer.connections(), 1u);
  HandleFields nobody;
  nobody.pid = static_cast<std::uint32_t>(getpid());
  nobody.nonce = 0x6e6f626f6479ull;
  nobody.export_id = 1;
  nobody.size = kMiB;
  DevPtr q = 0;
  EXPECT_EQ(importer.open(nobody, 0, &q), res::invalid_value);
  EXPECT_EQ(importer.connections(), 0u);
  EXPECT_EQ(importer.open_count(), static_cast<std::size_t>(kExporters))
      << "the imports stay mapped";
}

INSTANTIATE_TEST_SUITE_P(Backends, IpcFork,
                         ::testing::Values(BackendKind::vmm, BackendKind::async_pool),
                         [](const auto& info) {
                           return std::string(backend_kind_name(info.param));
                         });

TEST(IpcForkVmm, ABlockOverManyPhysicalAllocationsCrossesInBatches) {
  Rig rig(BackendKind::vmm);
  // Map chunk by chunk: every chunk becomes a physical allocation of its own; freed, they stay
  // mapped (cached), and one block over all of them spans as many allocations.
  const DevPtr first = rig.alloc(kMiB);
  std::vector<DevPtr> steps;
  for (int i = 0; i < 70; ++i) steps.push_back(rig.alloc(2 * kMiB));
  for (DevPtr p : steps) ASSERT_EQ(rig.free(p), res::ok);
  const std::size_t big = 70 * 2 * kMiB;
  const DevPtr b = rig.alloc(big);  // the freed run is the best fit
  ASSERT_EQ(b, steps.front());
  fill(b, big, 6);
  Channel handle;
  const pid_t child = spawn([&] {
    handle.keep_reading_end();
    const std::size_t mappings_before = rig.fake.mappings();
    IpcHandle h;
    if (!handle.recv(&h)) return 10;
    Importer importer(rig.driver());
    DevPtr q = 0;
    if (importer.open(fields(h), 0, &q) != res::ok) return 11;
    if (rig.fake.mappings() - mappings_before <= wire::kFdsPerMessage) return 12;  // > one batch
    if (!holds(q, big, 6)) return 13;
    fill(q, big, 7);
    bool ours = false;
    return importer.close(q, &ours) == res::ok ? 0 : 14;
  });
  handle.keep_writing_end();
  Exporter exporter(rig.core);
  ASSERT_TRUE(handle.send(exported(exporter, b)));
  EXPECT_EQ(wait_exit(child), 0);
  EXPECT_TRUE(holds(b, big, 7));
  EXPECT_EQ(rig.free(b), res::ok);
  EXPECT_EQ(rig.free(first), res::ok);
}

}  // namespace
}  // namespace allocshim::ipc::test
