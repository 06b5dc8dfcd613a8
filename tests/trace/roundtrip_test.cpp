// Capture -> file -> reader: every field survives, per-thread order is kept, stacks point at the
// code that allocated, and damaged or cut files are reported as such.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <thread>
#include <vector>

#include "test_util.h"
#include "analysis/reader.h"
#include "trace/recorder.h"

namespace {

// A call site whose return address the recorded stacks must contain.
__attribute__((noinline)) void roundtrip_alloc_site(Recorder* r, DevPtr p, std::size_t size) {
  r->on_alloc(p, size, 1, 1, Api::async, 1234);
  asm volatile("" ::: "memory");  // keeps the call from becoming a tail call
}

bool in_function(std::uint64_t frame, const void* fn) {
  const auto start = reinterpret_cast<std::uint64_t>(fn);
  return frame > start && frame < start + 512;
}

}  // namespace

TEST(TraceRoundTrip, EveryEventKindAndFieldSurvives) {
  const std::string path = test::temp_path("roundtrip");
  Recorder* r = test::start_recorder(path, StackMode::native);
  ASSERT_NE(r, nullptr);
  test::describe_two_backends(r);
  for (int i = 0; i < 100; ++i) {
    roundtrip_alloc_site(r, 0x7f0000000000ull + static_cast<DevPtr>(i) * 4096,
                         256u + static_cast<unsigned>(i));
    r->on_free(0x7f0000000000ull + static_cast<DevPtr>(i) * 4096, 256u + static_cast<unsigned>(i),
               1, 1, 55, kFreeAsync);
  }
  r->on_alloc_failed(1ull << 40, 0, 0, Api::alloc, res::out_of_memory, 777);
  r->on_migrate(0x7f0000100000ull, 4096, 0, 1, 0, 999);
  r->on_oom(1ull << 30, 0, 8ull << 30, 7ull << 30);
  r->on_reload("/etc/policy.toml", true);
  Recorder::stop();

  Trace t;
  std::string error;
  ASSERT_TRUE(read_trace(path, t, error)) << error;
  EXPECT_TRUE(t.complete);
  EXPECT_TRUE(t.warnings.empty()) << t.warnings.front();
  EXPECT_EQ(t.process.pid, static_cast<std::uint32_t>(getpid()));
  EXPECT_EQ(t.process.stacks, StackMode::native);
  EXPECT_EQ(t.backend_name(0), "native");
  EXPECT_EQ(t.backend_name(1), "pool");
  EXPECT_FALSE(t.modules.empty());
  ASSERT_EQ(t.events.size(), 204u);

  const Event& a = t.events[0];
  EXPECT_EQ(a.kind, EventKind::alloc);
  EXPECT_EQ(a.addr, 0x7f0000000000ull);
  EXPECT_EQ(a.size, 256u);
  EXPECT_EQ(a.device, 1);
  EXPECT_EQ(a.backend, 1);
  EXPECT_EQ(a.api, static_cast<std::uint8_t>(Api::async));
  EXPECT_EQ(a.dur_ns, 1234u);
  EXPECT_EQ(a.tid, static_cast<std::uint32_t>(gettid()));
  ASSERT_NE(a.stack, 0u);
  const std::vector<std::uint64_t> frames = t.frames(a.stack);
  ASSERT_FALSE(frames.empty());
  EXPECT_TRUE(in_function(frames[0], reinterpret_cast<const void*>(&roundtrip_alloc_site)))
      << std::hex << frames[0];
  // One call site: every allocation shares the interned stack.
  for (const Event& e : t.events) {
    if (e.kind == EventKind::alloc) {
      EXPECT_EQ(e.stack, a.stack);
    }
  }

  const Event& f = t.events[1];
  EXPECT_EQ(f.kind, EventKind::free);
  EXPECT_EQ(f.addr, 0x7f0000000000ull);
  EXPECT_EQ(f.dur_ns, 55u);
  EXPECT_EQ(f.flags, kFreeAsync);
  EXPECT_GE(f.time_ns, a.time_ns);

  const Event& fail = t.events[200];
  EXPECT_EQ(fail.kind, EventKind::alloc_fail);
  EXPECT_EQ(fail.size, 1ull << 40);
  EXPECT_EQ(fail.result, res::out_of_memory);
  EXPECT_NE(fail.stack, 0u);
  const Event& mig = t.events[201];
  EXPECT_EQ(mig.kind, EventKind::migrate);
  EXPECT_EQ(mig.addr, 0x7f0000100000ull);
  EXPECT_EQ(mig.backend, 1);
  EXPECT_EQ(mig.to_backend, 0);
  const Event& oom = t.events[202];
  EXPECT_EQ(oom.kind, EventKind::oom);
  EXPECT_EQ(oom.budget, 8ull << 30);
  EXPECT_EQ(oom.reserved, 7ull << 30);
  const Event& rl = t.events[203];
  EXPECT_EQ(rl.kind, EventKind::reload);
  EXPECT_EQ(rl.result, 1);
  EXPECT_EQ(t.reload_sources.at(rl.addr), "/etc/policy.toml");
}

TEST(TraceRoundTrip, ThreadsKeepTheirOrderAcrossBufferHandoffs) {
  const std::string path = test::temp_path("threads");
  Recorder* r = test::start_recorder(path, StackMode::native);
  ASSERT_NE(r, nullptr);
  constexpr int kThreads = 4, kPerThread = 20000;  // several 64 KiB buffers per thread
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([r, t] {
      const DevPtr base = (static_cast<DevPtr>(t) + 1) << 40;
      for (int i = 0; i < kPerThread; ++i) {
        r->on_alloc(base + static_cast<DevPtr>(i) * 512, static_cast<std::size_t>(i), 0, 0,
                    Api::alloc, 1);
        r->on_free(base + static_cast<DevPtr>(i) * 512, static_cast<std::size_t>(i), 0, 0, 1);
      }
    });
  for (auto& th : threads) th.join();
  Recorder::stop();

  Trace t;
  std::string error;
  ASSERT_TRUE(read_trace(path, t, error)) << error;
  ASSERT_EQ(t.lost, 0u);
  ASSERT_EQ(t.events.size(), static_cast<std::size_t>(kThreads * kPerThread * 2));
  std::map<std::uint32_t, std::vector<const Event*>> by_thread;
  for (const Event& e : t.events) by_thread[e.tid].push_back(&e);
  ASSERT_EQ(by_thread.size(), static_cast<std::size_t>(kThreads));
  for (auto& [tid, events] : by_thread) {
    const DevPtr base = events[0]->addr;
    for (std::size_t i = 0; i < events.size(); ++i) {
      const Event& e = *events[i];
      ASSERT_EQ(e.kind, i % 2 ? EventKind::free : EventKind::alloc) << i;
      ASSERT_EQ(e.addr, base + (i / 2) * 512) << i;
      ASSERT_EQ(e.size, i / 2) << i;
      if (i) {
        ASSERT_GE(e.time_ns, events[i - 1]->time_ns);
      }
    }
  }
}

TEST(TraceRoundTrip, FileIsPrivateAndPercentPIsThePid) {
  const std::string pattern = test::temp_path("pid") + ".%p.trace";
  Recorder* r = test::start_recorder(pattern, StackMode::off);
  ASSERT_NE(r, nullptr);
  const std::string expected = test::temp_path("pid") + "." + std::to_string(getpid()) + ".trace";
  EXPECT_EQ(r->path(), expected);
  r->on_alloc(0x1000, 1, 0, 0, Api::alloc, 1);
  Recorder::stop();
  struct stat st {};
  ASSERT_EQ(stat(expected.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(TraceRoundTrip, SamplingKeepsEveryEventButUnwindsOneInN) {
  const std::string path = test::temp_path("sample");
  Recorder* r = test::start_recorder(path, StackMode::native, 4);
  ASSERT_NE(r, nullptr);
  for (int i = 0; i < 40; ++i)
    r->on_alloc(0x1000 + static_cast<DevPtr>(i) * 16, 16, 0, 0, Api::alloc, 1);
  Recorder::stop();
  Trace t;
  std::string error;
  ASSERT_TRUE(read_trace(path, t, error)) << error;
  EXPECT_EQ(t.process.sample, 4u);
  ASSERT_EQ(t.events.size(), 40u);
  int with_stack = 0;
  for (const Event& e : t.events) {
    EXPECT_EQ(e.stack != 0, (e.flags & kAllocUnsampled) == 0);
    with_stack += e.stack != 0;
  }
  EXPECT_EQ(with_stack, 10);
}

TEST(TraceRoundTrip, FlushMakesEventsReadableWhileRunning) {
  const std::string path = test::temp_path("flush");
  Recorder* r = test::start_recorder(path, StackMode::native);
  ASSERT_NE(r, nullptr);
  r->on_alloc(0x5000, 64, 0, 0, Api::alloc, 1);
  r->flush();
  // No end record yet: the reader treats it like an abrupt exit and keeps what is there.
  Trace t;
  std::string error;
  ASSERT_TRUE(read_trace(path, t, error)) << error;
  EXPECT_FALSE(t.complete);
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_EQ(t.events[0].addr, 0x5000u);
  ASSERT_FALSE(t.warnings.empty());
  EXPECT_NE(t.warnings[0].find("exited abruptly"), std::string::npos);
  Recorder::stop();
}

// The GPU machine has no libunwind installed: native stacks must come from the copy the build ships
// in build/lib/allocshim. Falling back to glibc's backtrace() there made each traced allocation ~10x dearer
// (docs/tracing.md, "Cost"), unnoticed, because nothing said which unwinder ran.
TEST(TraceCapture, NativeStacksUseTheShippedLibunwind) {
  const std::string shipped = std::string(ALLOCSHIM_RUNTIME_LIB_DIR) + "/libunwind.so.8";
  if (access(shipped.c_str(), R_OK) != 0)
    GTEST_SKIP() << "the build ships no libunwind (" << shipped << ")";
  const std::string path = test::temp_path("unwinder");
  Recorder* r = test::start_recorder(path, StackMode::native);
  ASSERT_NE(r, nullptr);
  const std::string used = r->unwinder();
  Recorder::stop();
  std::remove(path.c_str());
  if (used.find("ThreadSanitizer") != std::string::npos) GTEST_SKIP() << used;
  const std::string prefix = "libunwind (";
  ASSERT_EQ(used.rfind(prefix, 0), 0u) << used;
  const std::string loaded = used.substr(prefix.size(), used.size() - prefix.size() - 1);
  struct stat a {
  }, b{};
  ASSERT_EQ(stat(loaded.c_str(), &a), 0) << loaded;
  ASSERT_EQ(stat(shipped.c_str(), &b), 0);
  EXPECT_TRUE(a.st_dev == b.st_dev && a.st_ino == b.st_ino) << loaded << " is not " << shipped;
}
