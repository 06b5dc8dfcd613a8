// Live migration under a device budget on the fake driver (docs/oversubscription.md, "Migration"):
// migrate = "auto" demotes the coldest device pieces to make room and keeps contents and addresses;
// safe points (context, stream and event synchronizations, synchronous frees) run requested
// demotions and bounded promotion, and never move memory while a stream has work; a driver failure
// midway leaves the old mapping and its data in place and is counted.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/host.h"
#include "host_probe.h"
#include "core/core.h"
#include "core_fixture.h"
#include "fake_driver.h"
#include "fake_test_util.h"

namespace allocshim {
namespace {

using fake::testing::fill;
using fake::testing::verify;

policy::Policy load(const std::string& text) { return testing::parsed(text, "migrate.toml"); }

policy::Policy budget(const char* size, const char* migrate = "auto") {
  return load(std::string("[budget]\ndevice = \"") + size + "\"\nspill = \"host\"\nmigrate = \"" +
              migrate + "\"\n");
}

const Backend& spill(const Core& core) {
  const Backend* b = testing::spill_target(core);
  if (b == nullptr) ADD_FAILURE() << "no spill target";
  return b ? *b : core.backend(0);
}

using testing::must_alloc;

bool on_device(const Core& core, DevPtr p, std::size_t n) {
  for (std::size_t off = 0; off < n; off += 2 * kMiB)
    if (host_placement(spill(core), p + off) != 1) return false;
  return true;
}

bool on_host(const Core& core, DevPtr p, std::size_t n) {
  for (std::size_t off = 0; off < n; off += 2 * kMiB)
    if (host_placement(spill(core), p + off) != 0) return false;
  return true;
}

TEST(Migrate, AutoDemotesTheOldestAllocationToServeANewOneOnTheDevice) {
  FakeDriver fake(FakeConfig{
      .strict_access = true});  // a remapped piece without access would fail the copies below
  Core core(fake.driver(), budget("64MiB"));
  const DevPtr a = must_alloc(core, 24 * kMiB);  // oldest: the coldest
  const DevPtr b = must_alloc(core, 24 * kMiB);
  fill(fake.driver(), a, 24 * kMiB, 1);
  fill(fake.driver(), b, 24 * kMiB, 2);
  EXPECT_TRUE(on_device(core, a, 24 * kMiB) && on_device(core, b, 24 * kMiB)) << "both fit";
  fake.reset_calls();
  const DevPtr h = must_alloc(core, 24 * kMiB);  // 16 MiB of room: 8 MiB short
  EXPECT_GE(fake.calls(FakeOp::ctx_synchronize), 1u) << "the shim's safe point";
  EXPECT_TRUE(on_host(core, a, 24 * kMiB)) << "the oldest went to the host, whole (one piece)";
  EXPECT_TRUE(on_device(core, b, 24 * kMiB)) << "the newer one stayed";
  EXPECT_TRUE(on_device(core, h, 24 * kMiB)) << "the new one is served from the device";
  EXPECT_TRUE(verify(fake.driver(), a, 24 * kMiB, 1)) << "same address, same bytes";
  EXPECT_TRUE(verify(fake.driver(), b, 24 * kMiB, 2));
  EXPECT_LE(fake.used(0), 64 * kMiB);
  EXPECT_LE(core.budget().backed(0), 64 * kMiB);
  const Budget::DeviceReport r = core.budget().device_report(0);
  EXPECT_EQ(r.demoted_bytes, 24 * kMiB);
  EXPECT_EQ(r.demotions, 1u);
  EXPECT_EQ(r.spilled_allocs, 0u) << "nothing was served from the host";
  EXPECT_EQ(r.shim_syncs, 1u);
  EXPECT_NE(core.summary().find("device->host 24.0 MiB (1)"), std::string::npos) << core.summary();
  EXPECT_NE(core.stats_json().find("\"demoted_bytes\":25165824,\"demotions\":1"), std::string::npos)
      << core.stats_json();
  for (DevPtr p : {a, b, h}) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.used(0), 0u);
  EXPECT_EQ(fake.host_used(), 0u);
  EXPECT_EQ(fake.live_handles(), 0u);
}

TEST(Migrate, DemotionMovesWholePiecesOfAtMost64MiBAndNoMoreThanNeeded) {
  FakeDriver fake;
  Core core(fake.driver(), budget("256MiB"));
  const DevPtr a = must_alloc(core, 200 * kMiB);  // pieces of 64, 64, 64, 8 MiB
  const DevPtr b = must_alloc(core, 100 * kMiB);  // 56 MiB of room: 44 MiB short, one piece moves
  EXPECT_EQ(core.budget().device_report(0).demoted_bytes, 64 * kMiB);
  EXPECT_TRUE(on_host(core, a, 64 * kMiB));
  EXPECT_TRUE(on_device(core, a + 64 * kMiB, 136 * kMiB));
  EXPECT_TRUE(on_device(core, b, 100 * kMiB));
  EXPECT_EQ(host_info(spill(core), 0).host_bytes, 64 * kMiB);
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.live_handles(), 0u);
}

TEST(Migrate, AnExportedBlockIsNeverDemoted) {
  FakeDriver fake;
  Core core(fake.driver(), budget("64MiB"));
  const DevPtr a =
      must_alloc(core, 24 * kMiB);  // oldest, but exported: an importer maps its pieces
  const DevPtr b = must_alloc(core, 24 * kMiB);
  DevPtr base = 0;
  Block block;
  ASSERT_TRUE(core.lookup(a, &base, &block));
  core.on_exported(base, block);
  const DevPtr h = must_alloc(core, 24 * kMiB);  // 8 MiB short: b moves, not a
  EXPECT_TRUE(on_device(core, a, 24 * kMiB)) << "the exported block stayed";
  EXPECT_TRUE(on_host(core, b, 24 * kMiB)) << "the oldest movable one went";
  EXPECT_TRUE(on_device(core, h, 24 * kMiB));
  for (DevPtr p : {a, b, h}) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.live_handles(), 0u);
}

TEST(Migrate, ReuseThePatternColdFirstThenHotEndsWithTheHotSetOnTheDevice) {
  // The pattern scaled down: the budget filled by memory left alone, then a hot set.
  FakeDriver fake;
  Core core(fake.driver(), budget("128MiB"));
  std::vector<DevPtr> cold;
  for (int i = 0; i < 4; ++i) cold.push_back(must_alloc(core, 32 * kMiB));
  const DevPtr hot = must_alloc(core, 64 * kMiB);
  EXPECT_TRUE(on_device(core, hot, 64 * kMiB));
  EXPECT_TRUE(on_host(core, cold[0], 32 * kMiB) && on_host(core, cold[1], 32 * kMiB));
  EXPECT_TRUE(on_device(core, cold[2], 32 * kMiB) && on_device(core, cold[3], 32 * kMiB));
  // With "promote" the hot set would have gone to the host and stayed there.
  for (DevPtr p : cold) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
  ASSERT_EQ(core.free(hot, FreeRequest{}), res::ok);
}

TEST(Migrate, SmallAndStreamOrderedRequestsStayInThePolicysBackends) {
  FakeDriver fake;
  Core core(fake.driver(), budget("64MiB"));
  const DevPtr small = must_alloc(core, 1 * kMiB);
  EXPECT_EQ(host_placement(spill(core), small), -1);
  AllocRequest req;
  req.size = 8 * kMiB;
  req.api = Api::async;
  req.stream = kStreamLegacy;
  DevPtr async = 0;
  ASSERT_EQ(core.alloc(req, &async), res::ok);
  EXPECT_EQ(host_placement(spill(core), async), -1);
  ASSERT_EQ(core.free(async, FreeRequest{kStreamLegacy, true}), res::ok);
  ASSERT_EQ(core.free(small, FreeRequest{}), res::ok);
}

// A block of `bytes` filled with `seed`'s pattern and moved to the host by an allocation of
// `pusher` bytes, which is then freed asynchronously: no safe point yet, so the room is there and
// the block waits on the host for one.
DevPtr on_host_awaiting_a_safe_point(Core& core, const Driver& d, std::size_t bytes,
                                     std::size_t pusher, unsigned seed) {
  const DevPtr a = must_alloc(core, bytes);
  fill(d, a, bytes, seed);
  const DevPtr b = must_alloc(core, pusher);
  EXPECT_EQ(core.free(b, FreeRequest{kStreamLegacy, true}),
            res::ok);  // an async free is no safe point
  return a;
}

TEST(Migrate, APartialSynchronizationNeverMovesMemoryOfABusyStream) {
  FakeDriver fake;
  Core core(fake.driver(), budget("64MiB"));
  const DevPtr a = on_host_awaiting_a_safe_point(core, fake.driver(), 48 * kMiB, 48 * kMiB, 3);
  ASSERT_TRUE(on_host(core, a, 48 * kMiB));
  Stream s = nullptr;
  ASSERT_EQ(fake.driver().stream_create(&s, kStreamNonBlocking), res::ok);
  core.on_stream_created(s, kStreamNonBlocking);

  fake.hold_stream(s);  // a kernel on `s` may be reading `a`
  Event e = nullptr;
  ASSERT_EQ(fake.driver().event_create(&e, kEventDisableTiming), res::ok);
  ASSERT_EQ(fake.driver().event_record(e, s), res::ok);  // work pending on `s`
  fake.reset_calls();
  core.after_partial_sync();  // the program synchronized another stream
  EXPECT_TRUE(on_host(core, a, 48 * kMiB)) << "not while a stream has work";
  EXPECT_EQ(core.budget().device_report(0).skipped_busy, 1u);
  EXPECT_EQ(fake.calls(FakeOp::ctx_synchronize), 0u) << "and without waiting for it";
  EXPECT_EQ(fake.calls(FakeOp::memcpy_dtod), 0u);

  fake.release_stream(s);
  const std::uint64_t syncs = core.budget().device_report(0).shim_syncs;
  core.after_partial_sync();  // every stream idle now: the shim synchronizes and moves
  EXPECT_TRUE(on_device(core, a, 48 * kMiB));
  EXPECT_EQ(core.budget().device_report(0).promoted_bytes, 48 * kMiB);
  EXPECT_EQ(core.budget().device_report(0).shim_syncs, syncs + 1);
  EXPECT_TRUE(verify(fake.driver(), a, 48 * kMiB, 3));

  // A synchronization with nothing to move costs no driver call.
  fake.reset_calls();
  core.after_partial_sync();
  core.after_context_sync(core.before_context_sync());
  EXPECT_EQ(fake.total_calls(), 0u);
  ASSERT_EQ(fake.driver().event_destroy(e), res::ok);
  core.on_stream_destroyed(s);
  ASSERT_EQ(fake.driver().stream_destroy(s), res::ok);
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
}

TEST(Migrate, ContextSynchronizationPromotesAtMostTheBoundPerSafePoint) {
  FakeDriver fake;
  Core core(fake.driver(), budget("384MiB"));
  const DevPtr a = on_host_awaiting_a_safe_point(core, fake.driver(), 320 * kMiB, 384 * kMiB, 4);
  EXPECT_TRUE(on_host(core, a, 320 * kMiB)) << "whole";
  EXPECT_EQ(host_info(spill(core), 0).host_bytes, 320 * kMiB);
  core.after_context_sync(core.before_context_sync());
  EXPECT_EQ(core.budget().device_report(0).promoted_bytes, Budget::kPromotePerPoint);
  EXPECT_EQ(host_info(spill(core), 0).host_bytes, 320 * kMiB - Budget::kPromotePerPoint);
  core.after_context_sync(core.before_context_sync());
  EXPECT_EQ(host_info(spill(core), 0).host_bytes, 0u);
  EXPECT_TRUE(verify(fake.driver(), a, 320 * kMiB, 4));
  EXPECT_EQ(core.budget().device_report(0).promotions, 5u) << "five 64 MiB pieces";
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
}

// Mapping host memory and granting the device access to it costs ~0.7 ms per 64 MiB on the H100,
// twenty times device memory (tools/bench/move_bench.cu): a move maps host memory once, at the
// address, never at the scratch range (a demotion copies from the old device piece mapped there).
TEST(Migrate, AMoveMapsHostMemoryOnlyAtTheAddress) {
  FakeDriver fake(FakeConfig{.strict_access = true});
  Core core(fake.driver(), budget("256MiB"));
  const DevPtr a = must_alloc(core, 192 * kMiB);  // three pieces of 64 MiB
  fill(fake.driver(), a, 192 * kMiB, 3);
  std::uint64_t before = fake.host_maps();
  EXPECT_EQ(core.budget().demote(0, 192 * kMiB), 192 * kMiB);
  EXPECT_EQ(fake.host_maps() - before, 3u) << "one mapping of host memory per piece";
  EXPECT_TRUE(on_host(core, a, 192 * kMiB));
  EXPECT_TRUE(verify(fake.driver(), a, 192 * kMiB, 3));
  EXPECT_TRUE(fake.has_access(a + 128 * kMiB, 0, true));
  before = fake.host_maps();
  core.after_context_sync(core.before_context_sync());  // room for all of it: promoted
  EXPECT_TRUE(on_device(core, a, 192 * kMiB));
  EXPECT_EQ(fake.host_maps(), before) << "a promotion maps no host memory";
  EXPECT_TRUE(verify(fake.driver(), a, 192 * kMiB, 3));
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.live_handles(), 0u);
}

TEST(Migrate, ADriverFailureMidwayKeepsTheOldMappingAndItsDataAndIsCounted) {
  // The host piece cannot be created; the scratch mapping fails; the remap at the address, the
  // access there or the copy after it fails: each leaves the piece where it was, data intact,
  // nothing leaked.
  struct Case {
    FakeOp op;
    int skip;
  };
  for (const Case k :
       {Case{FakeOp::mem_create, 0}, Case{FakeOp::mem_map, 0}, Case{FakeOp::mem_map, 1},
        Case{FakeOp::memcpy_dtod, 0}, Case{FakeOp::mem_set_access, 1}}) {
    SCOPED_TRACE(std::to_string(static_cast<int>(k.op)) + " skip " + std::to_string(k.skip));
    FakeDriver fake(FakeConfig{.strict_access = true});
    Core core(fake.driver(), budget("64MiB"));
    const DevPtr a = must_alloc(core, 48 * kMiB);
    fill(fake.driver(), a, 48 * kMiB, 5);
    const std::size_t handles = fake.live_handles();
    fake.fail_next(k.op, res::out_of_memory, 1, k.skip);
    EXPECT_EQ(core.budget().demote(0, 48 * kMiB), 0u);
    fake.clear_failures();
    EXPECT_TRUE(on_device(core, a, 48 * kMiB));
    EXPECT_TRUE(verify(fake.driver(), a, 48 * kMiB, 5));
    EXPECT_TRUE(fake.has_access(a, 0, true));
    // A host piece pinned for the move is kept for the next one (none when the host was short).
    EXPECT_EQ(fake.live_handles(), handles + (k.op == FakeOp::mem_create ? 0 : 1));
    EXPECT_EQ(core.budget().device_report(0).reserve_bytes,
              k.op == FakeOp::mem_create ? 0 : 48 * kMiB);
    EXPECT_EQ(core.budget().device_report(0).move_failures, 1u);
    EXPECT_EQ(core.budget().backed(0), 48 * kMiB) << "the budget still counts it on the device";
    // And the next demotion works.
    EXPECT_EQ(core.budget().demote(0, 48 * kMiB), 48 * kMiB);
    EXPECT_TRUE(verify(fake.driver(), a, 48 * kMiB, 5));
    ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
    EXPECT_EQ(fake.live_handles(), 0u);
  }
}

// A demotion of several pieces that fails at its second piece, or in the wait for its first piece's
// copy, leaves every piece whole where it is, data intact.
TEST(Migrate, ADemotionOfSeveralPiecesThatFailsMidwayLeavesEachPieceWhole) {
  struct Case {
    FakeOp op;
    int skip;
    std::size_t moved;  // what the demotion returns
  };
  // The second piece's scratch mapping fails (the first piece moved); the wait for the first
  // piece's copy fails (it is put back: prepare_move synchronized once before).
  for (const Case k : {Case{FakeOp::mem_map, 2, 64 * kMiB}, Case{FakeOp::ctx_synchronize, 1, 0}}) {
    SCOPED_TRACE(std::to_string(static_cast<int>(k.op)));
    FakeDriver fake(FakeConfig{.strict_access = true});
    Core core(fake.driver(), budget("256MiB"));
    const DevPtr a = must_alloc(core, 160 * kMiB);  // pieces of 64, 64 and 32 MiB
    fill(fake.driver(), a, 160 * kMiB, 9);
    fake.fail_next(k.op, res::unknown, 1, k.skip);
    EXPECT_EQ(core.budget().demote(0, 160 * kMiB), k.moved);
    fake.clear_failures();
    EXPECT_TRUE(verify(fake.driver(), a, 160 * kMiB, 9));
    EXPECT_TRUE(on_device(core, a + k.moved, 160 * kMiB - k.moved));
    EXPECT_TRUE(fake.has_access(a, 0, true));
    EXPECT_TRUE(fake.has_access(a + 64 * kMiB, 0, true));
    EXPECT_EQ(core.budget().device_report(0).move_failures, 1u);
    EXPECT_EQ(core.budget().demote(0, 160 * kMiB), 160 * kMiB - k.moved);
    EXPECT_TRUE(verify(fake.driver(), a, 160 * kMiB, 9));
    ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
    EXPECT_EQ(fake.live_handles(), 0u);
  }
}

TEST(Migrate, AllocationStillServedWhenDemotionFails) {
  FakeDriver fake;
  Core core(fake.driver(), budget("64MiB"));
  const DevPtr a = must_alloc(core, 48 * kMiB);
  fill(fake.driver(), a, 48 * kMiB, 6);
  fake.fail_next(FakeOp::memcpy_dtod, res::unknown, 1);
  const DevPtr b = must_alloc(core, 32 * kMiB);  // 16 MiB device, 16 MiB host
  EXPECT_EQ(host_info(spill(core), 0).host_bytes, 16 * kMiB);
  EXPECT_TRUE(verify(fake.driver(), a, 48 * kMiB, 6));
  EXPECT_EQ(core.budget().device_report(0).move_failures, 1u);
  for (DevPtr p : {a, b}) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
}

// A demotion of several pieces pins their host memory on worker threads (pin_threads) while the
// caller copies and remaps: the host running out midway stops it cleanly, whichever piece's host
// memory could not be made; everything moved or not keeps its data, and nothing leaks.
TEST(Migrate, AParallelDemotionStopsCleanlyWhenTheHostRunsOutMidway) {
  for (const int pin_threads : {0, 4}) {
    SCOPED_TRACE(pin_threads);
    FakeDriver fake(FakeConfig{.host_capacity = 96 * kMiB,
                               .strict_access = true});  // one 64 MiB host piece, not two
    Core core(fake.driver(),
              load("[budget]\ndevice = \"256MiB\"\nspill = \"host\"\nmigrate = \"auto\"\n"
                   "[backends.host]\npin_threads = " +
                   std::to_string(pin_threads) + "\n"));
    const DevPtr a = must_alloc(core, 256 * kMiB);  // four pieces of 64 MiB
    fill(fake.driver(), a, 256 * kMiB, 8);
    DevPtr b = 0;
    AllocRequest req;
    req.size = 96 * kMiB;  // two pieces to demote; the host has room for one (and then 32 MiB)
    const Result r = core.alloc(req, &b);
    const auto rep = core.budget().device_report(0);
    EXPECT_EQ(rep.move_failures, 1u);
    // One after the other, the first piece moves and the second finds the host full; made at
    // once, the second piece's host memory may be the one made, and the first then fails.
    if (pin_threads == 0)
      EXPECT_EQ(rep.demoted_bytes, 64 * kMiB);
    else
      EXPECT_TRUE(rep.demoted_bytes == 0 || rep.demoted_bytes == 64 * kMiB) << rep.demoted_bytes;
    EXPECT_TRUE(on_host(core, a, rep.demoted_bytes)) << "oldest pieces first, in order";
    EXPECT_TRUE(on_device(core, a + rep.demoted_bytes, 256 * kMiB - rep.demoted_bytes));
    EXPECT_TRUE(verify(fake.driver(), a, 256 * kMiB, 8));
    // 64 MiB moved: 64 MiB of room and 32 MiB on the host. None: all of it on the host, where
    // the second piece's host memory went back (or the driver's out-of-memory, as native).
    if (rep.demoted_bytes == 64 * kMiB)
      ASSERT_EQ(r, res::ok);
    else
      ASSERT_TRUE(r == res::ok || r == res::out_of_memory) << r;
    if (r == res::ok) {
      fill(fake.driver(), b, 96 * kMiB, 9);
      EXPECT_TRUE(verify(fake.driver(), b, 96 * kMiB, 9));
      ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);
    }
    ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
    EXPECT_EQ(fake.live_handles(), 0u);
    EXPECT_EQ(fake.host_used(), 0u);
  }
}

// The host reserve (docs/design/oversubscription.md, "The host reserve"): the host pieces a promotion
// frees are kept, so that demoting the same memory again copies and remaps without pinning.
TEST(Migrate, ADemotionAfterAPromotionReusesTheHostPiecesItFreed) {
  FakeDriver fake(FakeConfig{.strict_access = true});
  Core core(fake.driver(), budget("64MiB"));
  const DevPtr a = must_alloc(core, 48 * kMiB);
  fill(fake.driver(), a, 48 * kMiB, 1);
  const DevPtr b = must_alloc(core, 48 * kMiB);  // `a` demoted: its host piece pinned anew
  ASSERT_TRUE(on_host(core, a, 48 * kMiB));
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);  // a safe point with room: `a` comes back
  ASSERT_TRUE(on_device(core, a, 48 * kMiB));
  auto r = core.budget().device_report(0);
  EXPECT_EQ(r.reserve_bytes, 48 * kMiB);
  EXPECT_EQ(fake.host_used(), 48 * kMiB) << "the freed host piece, kept";
  EXPECT_EQ(core.budget().backed(0), 48 * kMiB) << "host memory: not counted against the budget";
  EXPECT_EQ(r.reserve_misses, 1u);
  EXPECT_EQ(r.reserve_hits, 0u);

  fake.reset_calls();
  const DevPtr h = must_alloc(core, 48 * kMiB);  // `a` demoted again
  EXPECT_TRUE(on_host(core, a, 48 * kMiB));
  EXPECT_TRUE(on_device(core, h, 48 * kMiB));
  EXPECT_EQ(fake.calls(FakeOp::mem_create), 1u)
      << "the new allocation's device piece only: no pinning";
  EXPECT_EQ(fake.host_used(), 48 * kMiB);
  EXPECT_TRUE(verify(fake.driver(), a, 48 * kMiB, 1)) << "same address, same bytes";
  r = core.budget().device_report(0);
  EXPECT_EQ(r.reserve_hits, 1u);
  EXPECT_EQ(r.reserve_bytes, 0u);
  EXPECT_EQ(r.reserve_peak, 48 * kMiB);
  EXPECT_NE(core.summary().find(
                "host reserve: 0 B now, peak 48.0 MiB; 1 host pieces reused, 1 pinned anew"),
            std::string::npos)
      << core.summary();
  EXPECT_NE(
      core.stats_json().find("\"reserve_bytes\":0,\"reserve_peak\":50331648,\"reserve_hits\":1,"
                             "\"reserve_misses\":1"),
      std::string::npos)
      << core.stats_json();
  for (DevPtr p : {a, h}) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.live_handles(), 0u);
  EXPECT_EQ(fake.host_used(), 0u);
}

// Passing host pieces to another member of a shared budget (docs/design/oversubscription.md,
// "Passing host pieces"): a piece this process imported from another member cannot be exported
// again (the driver refuses, as the fake does), so the pieces given are the ones it pinned itself,
// whichever order the reserve keeps them in; the imported piece stays for its own demotions.
TEST(Migrate, OnlyTheHostPiecesThisProcessPinnedArePassedOn) {
  FakeDriver fake;
  Core core(fake.driver(), budget("64MiB"));
  const DevPtr a = must_alloc(core, 48 * kMiB);
  const DevPtr b = must_alloc(core, 48 * kMiB);     // `a` demoted, its host piece pinned here
  ASSERT_EQ(core.free(b, FreeRequest{}), res::ok);  // `a` back: its host piece in the reserve
  ASSERT_EQ(core.budget().device_report(0).reserve_bytes, 48 * kMiB);
  Movable* m = const_cast<Backend&>(spill(core)).movable();
  ASSERT_NE(m, nullptr);
  // A piece from another process, kept last.
  PhysSpec spec;
  spec.location = Location{Location::Type::host_numa, 0};  // as the spill target's own pieces
  spec.posix_fd = true;
  MemHandle theirs = 0;
  ASSERT_EQ(fake.driver().mem_create(&theirs, 48 * kMiB, spec), res::ok);
  int fd = -1;
  ASSERT_EQ(fake.driver().mem_export_to_fd(&fd, theirs), res::ok);
  ASSERT_TRUE(m->adopt_host(0, 48 * kMiB, fd));
  ASSERT_EQ(core.budget().device_report(0).reserve_bytes, 96 * kMiB);

  std::vector<Movable::Given> given;
  EXPECT_EQ(m->give_host(0, 96 * kMiB, given), 48 * kMiB) << "its own piece, not the imported one";
  ASSERT_EQ(given.size(), 1u);
  EXPECT_EQ(given[0].bytes, 48 * kMiB);
  EXPECT_EQ(core.budget().device_report(0).reserve_bytes, 48 * kMiB) << "the imported piece stays";
  MemHandle back = 0;
  EXPECT_EQ(fake.driver().mem_import_from_fd(&back, given[0].fd), res::ok)
      << "a piece another process can map";
  ::close(given[0].fd);
  ASSERT_EQ(fake.driver().mem_release(back), res::ok);
  ASSERT_EQ(fake.driver().mem_release(theirs), res::ok);
  ASSERT_EQ(core.free(a, FreeRequest{}), res::ok);
}

TEST(Migrate, TheHostReserveKeepsNoMoreThanItsBound) {
  for (const char* bound : {"40MiB", "0"}) {
    SCOPED_TRACE(bound);
    FakeDriver fake;
    Core core(fake.driver(),
              load(std::string("[budget]\ndevice = \"64MiB\"\nspill = \"host\"\nmigrate = "
                               "\"auto\"\n[backends.host]\nhost_reserve = \"") +
                   bound + "\"\n"));
    const DevPtr a = must_alloc(core, 24 * kMiB);
    const DevPtr b = must_alloc(core, 24 * kMiB);
    const DevPtr c = must_alloc(core, 64 * kMiB);  // both demoted, pinned anew
    ASSERT_TRUE(on_host(core, a, 24 * kMiB) && on_host(core, b, 24 * kMiB));
    ASSERT_EQ(core.free(c, FreeRequest{}), res::ok);  // both promoted: 48 MiB of host pieces freed
    ASSERT_TRUE(on_device(core, a, 24 * kMiB) && on_device(core, b, 24 * kMiB));
    const std::size_t kept = std::string(bound) == "0" ? 0 : 24 * kMiB;
    EXPECT_EQ(core.budget().device_report(0).reserve_bytes, kept);
    EXPECT_EQ(core.budget().device_report(0).reserve_peak, kept);
    EXPECT_EQ(fake.host_used(), kept);
    for (DevPtr p : {a, b}) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
    EXPECT_EQ(fake.live_handles(), 0u);
  }
}

TEST(Migrate, ADemotionFromTheReserveThatFailsMidwayLosesNothing) {
  FakeDriver fake(FakeConfig{.strict_access = true});
  Core core(fake.driver(), budget("64MiB"));
  const DevPtr a = must_alloc(core, 24 * kMiB);
  const DevPtr b = must_alloc(core, 24 * kMiB);
  fill(fake.driver(), a, 24 * kMiB, 2);
  fill(fake.driver(), b, 24 * kMiB, 3);
  const DevPtr t = must_alloc(core, 64 * kMiB);
  ASSERT_EQ(core.free(t, FreeRequest{}),
            res::ok);  // both back on the device, 48 MiB in the reserve
  ASSERT_EQ(core.budget().device_report(0).reserve_bytes, 48 * kMiB);
  const std::size_t handles = fake.live_handles();
  fake.reset_calls();
  fake.fail_next(FakeOp::memcpy_dtod, res::unknown, 1, 1);  // `a` moves, `b`'s copy fails
  EXPECT_EQ(core.budget().demote(0, 48 * kMiB), 24 * kMiB);
  fake.clear_failures();
  EXPECT_EQ(fake.calls(FakeOp::mem_create), 0u) << "both host pieces came from the reserve";
  EXPECT_TRUE(on_host(core, a, 24 * kMiB));
  EXPECT_TRUE(on_device(core, b, 24 * kMiB));
  EXPECT_TRUE(verify(fake.driver(), a, 24 * kMiB, 2));
  EXPECT_TRUE(verify(fake.driver(), b, 24 * kMiB, 3));
  EXPECT_EQ(core.budget().device_report(0).move_failures, 1u);
  EXPECT_EQ(core.budget().device_report(0).reserve_bytes, 24 * kMiB)
      << "b's host piece went back to it";
  EXPECT_EQ(fake.live_handles(), handles - 1) << "a's device piece released, nothing else";
  EXPECT_EQ(fake.host_used(), 48 * kMiB);
  for (DevPtr p : {a, b}) ASSERT_EQ(core.free(p, FreeRequest{}), res::ok);
  EXPECT_EQ(fake.live_handles(), 0u);
  EXPECT_EQ(fake.host_used(), 0u);
}

TEST(Migrate, PolicyNeedsTheHostSpillTarget) {
  policy::Policy p;
  std::vector<policy::Diagnostic> errors;
  EXPECT_FALSE(policy::load_string("[budget]\ndevice = \"8GiB\"\nmigrate = \"auto\"\n", "m.toml", p,
                                   errors, policy::LoadOptions{policy::kAllKinds}));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(
      errors[0].str(),
      "m.toml:3:11: migrate = \"auto\" needs spill = \"host\" (memory moves between device and "
      "host chunks)");
}

}  // namespace
}  // namespace allocshim
