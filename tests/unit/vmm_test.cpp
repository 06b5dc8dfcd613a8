// The VMM backend's layers on their own (heap, size classes) and its behaviour on the fake driver:
// what a hit costs, how memory is mapped, kept, moved and given back, peers, several devices, and
// how much it reserves for a mixed workload.
#include "backends/vmm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "backends/free_sync.h"
#include "backends/vmm_heap.h"
#include "backends/vmm_small.h"
#include "core/core.h"
#include "core_fixture.h"
#include "fake_driver.h"
#include "tools/bench/splitmix.h"

namespace allocshim {
namespace {

using vmm::Heap;
using vmm::SmallClasses;
constexpr std::size_t kKiB = 1024;

// ---- Heap ----------------------------------------------------------------------------------------

// Checks the heap's invariants: nodes tile each range, no two free neighbours (they would have been
// merged), and the free byte count matches.
void check_heap(const Heap& h) {
  std::size_t free_bytes = 0, total = 0;
  const Heap::Node* prev = nullptr;
  h.for_each([&](const Heap::Node& n) {
    if (prev != nullptr && prev->next == &n) {
      EXPECT_EQ(prev->addr + prev->size, n.addr) << "nodes tile the range";
      EXPECT_FALSE(prev->free && n.free) << "free neighbours at " << n.addr << " were not merged";
    }
    if (n.free) free_bytes += n.size;
    total += n.size;
    prev = &n;
  });
  EXPECT_EQ(free_bytes, h.free_bytes());
  EXPECT_EQ(total, h.total_bytes());
}

TEST(VmmHeap, PicksTheSmallestBlockThatFits) {
  Heap h;
  h.add_range(0x100000, 64 * kMiB);
  // Carve holes of 3, 1 and 2 MiB separated by live guards.
  std::vector<Heap::Node*> holes, guards;
  for (std::size_t mib : {3, 1, 2}) {
    holes.push_back(h.allocate(mib * kMiB));
    guards.push_back(h.allocate(256));
  }
  for (Heap::Node* n : holes) h.free(n);
  check_heap(h);
  Heap::Node* n = h.allocate(kMiB + 256);
  EXPECT_EQ(n->addr, 0x100000 + 3 * kMiB + 256 + kMiB + 256) << "the 2 MiB hole, not the 3";
  Heap::Node* m = h.allocate(kMiB);
  EXPECT_EQ(m->addr, 0x100000 + 3 * kMiB + 256) << "the exact 1 MiB hole";
  check_heap(h);
}

TEST(VmmHeap, MergesWithBothNeighbours) {
  Heap h;
  h.add_range(0x100000, 16 * kMiB);
  Heap::Node* a = h.allocate(kMiB);
  Heap::Node* b = h.allocate(kMiB);
  Heap::Node* c = h.allocate(kMiB);
  Heap::Node* guard = h.allocate(kMiB);
  const DevPtr base = a->addr;
  h.free(a);
  h.free(c);
  EXPECT_EQ(h.free_blocks(), 3u);  // a, c, the tail
  h.free(b);
  EXPECT_EQ(h.free_blocks(), 2u) << "a+b+c became one block";
  check_heap(h);
  Heap::Node* big = h.allocate(3 * kMiB);
  EXPECT_EQ(big->addr, base);
  (void)guard;
}

TEST(VmmHeap, FindsTheBlockHoldingAnInteriorPointer) {
  Heap h;
  h.add_range(0x100000, 8 * kMiB);
  h.allocate(4096);
  Heap::Node* b = h.allocate(10000 / 256 * 256 + 256);
  EXPECT_EQ(h.find(b->addr + 5000), b);
  EXPECT_EQ(h.find(0x100000 + 8 * kMiB), nullptr);
  EXPECT_EQ(h.find(0xff), nullptr);
}

TEST(VmmHeap, RandomWorkloadKeepsItsInvariantsAndFreesBackToOneBlock) {
  Heap h;
  h.add_range(0x10000000, 1 * kGiB);
  h.add_range(0x80000000, 256 * kMiB);
  std::mt19937 rng(3);
  std::vector<Heap::Node*> live;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      const std::size_t size = vmm::align_up(1 + rng() % (1u << (8 + rng() % 14)), vmm::kAlign);
      if (Heap::Node* n = h.allocate(size)) {
        EXPECT_EQ(n->size, size);
        EXPECT_EQ(n->addr % vmm::kAlign, 0u);
        live.push_back(n);
      }
    } else {
      const std::size_t k = rng() % live.size();
      h.free(live[k]);
      live[k] = live.back();
      live.pop_back();
    }
    if (i % 5000 == 0) check_heap(h);
  }
  for (Heap::Node* n : live) h.free(n);
  check_heap(h);
  EXPECT_EQ(h.free_blocks(), 2u) << "one block per range";
  EXPECT_EQ(h.largest_free(), 1 * kGiB);
}

// ---- Size classes ------------------------------------------------------------------------------

TEST(VmmSmall, ClassesCoverEverySizeTightly) {
  for (std::size_t s = 1; s <= SmallClasses::kMaxSmall; ++s) {
    const int c = SmallClasses::class_of(s);
    ASSERT_GE(c, 0);
    ASSERT_LT(c, SmallClasses::kClasses);
    const std::size_t bytes = SmallClasses::class_bytes(c);
    ASSERT_GE(bytes, s);
    ASSERT_EQ(bytes % vmm::kAlign, 0u);
    if (c > 0) {
      ASSERT_LT(SmallClasses::class_bytes(c - 1), s) << "the smallest class that fits";
    }
    if (s > 4096) {
      ASSERT_LE(bytes - s, bytes / 8) << "waste at most 1/8";
    }
    ASSERT_EQ(SmallClasses::slab_bytes(c) % bytes, 0u);
  }
}

TEST(VmmSmall, KeepsOneEmptySlabPerClassAndReturnsTheRest) {
  Heap h;
  h.add_range(0x100000, 64 * kMiB);
  SmallClasses sc;
  const int cls = SmallClasses::class_of(4096);
  const std::size_t per_slab = SmallClasses::slab_bytes(cls) / 4096;
  std::vector<std::pair<DevPtr, SmallClasses::Slab*>> v;
  for (std::size_t i = 0; i < 3 * per_slab; ++i) {
    SmallClasses::Slab* s = nullptr;
    DevPtr p = sc.allocate(cls, &s);
    if (p == 0) {
      sc.add_slab(cls, h.allocate(SmallClasses::slab_bytes(cls)));
      p = sc.allocate(cls, &s);
    }
    v.emplace_back(p, s);
  }
  EXPECT_EQ(sc.slabs(), 3u);
  std::vector<Heap::Node*> returned;
  for (auto [p, s] : v)
    if (Heap::Node* n = sc.free(s, p)) returned.push_back(n);
  EXPECT_EQ(returned.size(), 2u) << "the first empty slab stays as the spare";
  EXPECT_EQ(sc.slabs(), 1u);
  std::vector<Heap::Node*> spares;
  sc.take_empty(spares);
  EXPECT_EQ(spares.size(), 1u);
  EXPECT_EQ(sc.slabs(), 0u);
}

// ---- The backend on the fake driver --------------------------------------------------------------

class VmmBackendTest : public testing::BackendFixture<> {
 protected:
  VmmBackendTest() : BackendFixture(devices(2, 64 * kGiB, true)) {}
  void make(policy::BackendSpec spec = {}) { BackendFixture::make(BackendKind::vmm, spec); }
  DevPtr alloc(std::size_t size, int device = 0, FreeSync sync = FreeSync::none) {
    return alloc_on(size, sync, device);
  }
  VmmInfo info(int device = 0) const { return vmm_info(*backend, device); }
};

TEST_F(VmmBackendTest, APoolHitMakesNoDriverCall) {
  make();
  for (std::size_t size : {std::size_t{256}, 5000 * std::size_t{1}, 64 * kKiB, 1 * kMiB, 64 * kMiB})
    free(alloc(size));
  fake.reset_calls();
  const std::uint64_t hits = backend->stats().device(0).hits();
  for (int i = 0; i < 100; ++i)
    for (std::size_t size :
         {std::size_t{256}, 5000 * std::size_t{1}, 64 * kKiB, 1 * kMiB, 64 * kMiB})
      free(alloc(size));
  EXPECT_EQ(fake.total_calls(), 0u);
  EXPECT_EQ(backend->stats().device(0).hits() - hits, 500u);
}

TEST_F(VmmBackendTest, ABarrierHitRecordsEventsPerEpochNotPerFree) {
  make();
  free(alloc(1 * kMiB, 0, FreeSync::barrier));
  fake.reset_calls();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) free(alloc(1 * kMiB, 0, FreeSync::barrier));
  // An epoch also closes once older than kEpochAgeNs: on a slow machine (a sanitizer) some did.
  const auto aged = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count() /
      kEpochAgeNs);
  // An epoch stays open at a shortage until it holds shortage_frees(0) frees (one legacy event):
  // the region grows by that many blocks at most, then reuses.
  EXPECT_LE(fake.calls(FakeOp::mem_map) * 2 * kMiB, shortage_frees(0) * 1 * kMiB);
  EXPECT_EQ(fake.calls(FakeOp::ctx_synchronize), 0u);
  EXPECT_LE(fake.calls(FakeOp::event_create), 1u) << "pooled";
  // The free joins the open epoch; an allocation that finds no free backed block closes it (one
  // event) once it holds that many frees, and takes the blocks back.
  EXPECT_LE(fake.calls(FakeOp::event_record), 100u / shortage_frees(0) + 1 + aged);
  EXPECT_LE(fake.calls(FakeOp::event_query), 100u);
}

// A handle and a mapping per chunk (so that any free chunk can move), access set once per run.
TEST_F(VmmBackendTest, ALargeRequestMapsPerChunkAndSetsAccessOnce) {
  make();
  const DevPtr p = alloc(1 * kGiB);
  EXPECT_EQ(fake.calls(FakeOp::mem_create), 1 * kGiB / info().chunk);
  EXPECT_EQ(fake.calls(FakeOp::mem_map), 1 * kGiB / info().chunk);
  EXPECT_EQ(fake.calls(FakeOp::mem_set_access), 1u);
  EXPECT_TRUE(fake.has_access(p + 1 * kGiB - 1, 0, true));
}

TEST_F(VmmBackendTest, ChunksInUseAreNeverUnmapped) {
  policy::BackendSpec spec;
  spec.vmm_release_threshold = 0;  // give back every wholly free chunk at once
  make(spec);
  const DevPtr small = alloc(1000);       // a slab at the start of the first chunk
  const DevPtr mid = alloc(2000 * kKiB);  // after it, reaching into the second chunk
  EXPECT_EQ(info().mapped_bytes, 4 * kMiB);
  free(mid);
  EXPECT_TRUE(fake.is_mapped(small)) << "shares its chunk with a live slab";
  EXPECT_EQ(info().mapped_bytes, 2 * kMiB);
  EXPECT_EQ(fake.used(0), 2 * kMiB) << "the wholly free chunk went back to the driver";
  EXPECT_EQ(d.memset_d8(small, 1, 1000), res::ok);
}

TEST_F(VmmBackendTest, KeepsAtMostTheReleaseThresholdOfFreeMemory) {
  policy::BackendSpec spec;
  spec.vmm_release_threshold = 4 * kMiB;
  make(spec);
  std::vector<DevPtr> v;
  for (int i = 0; i < 10; ++i) v.push_back(alloc(2 * kMiB));
  for (DevPtr p : v) free(p);
  EXPECT_LE(info().free_bytes, 4 * kMiB);
  EXPECT_EQ(backend->reserved(0), info().free_bytes);
}

TEST_F(VmmBackendTest, GrowsByReservingMoreAddressSpace) {
  policy::BackendSpec spec;
  spec.reserve = 8 * kMiB;
  make(spec);
  std::vector<DevPtr> v;
  for (int i = 0; i < 3; ++i) v.push_back(alloc(6 * kMiB));
  v.push_back(alloc(20 * kMiB));  // larger than a range: gets a range of its own size
  EXPECT_EQ(fake.reservations(), 4u);
  for (std::size_t i = 0; i < v.size(); ++i)
    EXPECT_EQ(d.memset_d8(v[i], static_cast<unsigned char>(i), i < 3 ? 6 * kMiB : 20 * kMiB),
              res::ok);
}

TEST_F(VmmBackendTest, MovesFreeChunksWhereTheyAreNeededBeforeCreatingMore) {
  make();
  const DevPtr a1 = alloc(2 * kMiB);
  const DevPtr a2 = alloc(2 * kMiB);
  alloc(4 * kMiB);
  fake.set_capacity(0, fake.used(0) + 2 * kMiB);  // 10 MiB: 2 more chunks at most
  free(a1);
  free(a2);  // two free one-chunk segments, mapped
  fake.reset_calls();
  const DevPtr p = alloc(6 * kMiB);  // does not fit the 4 MiB hole: 3 new chunks at the end
  EXPECT_EQ(fake.calls(FakeOp::mem_release), 0u) << "the free chunks' handles were remapped";
  EXPECT_EQ(fake.calls(FakeOp::mem_create), 1u) << "only for the chunk nothing free could give";
  EXPECT_EQ(d.memset_d8(p, 7, 6 * kMiB), res::ok);
  EXPECT_EQ(fake.used(0), 10 * kMiB);
}

// The free chunks of a large block's old place move where growth needs them even while a smaller
// block uses the start of it (with a mapping per run, the live block pinned all 64 MiB).
TEST_F(VmmBackendTest, FreeChunksMoveOutOfAPartlyUsedPlace) {
  make();
  free(alloc(64 * kMiB));
  const DevPtr b = alloc(3 * kMiB);  // the start of the old place: chunks 0 and 1
  fake.reset_calls();
  const DevPtr c = alloc(64 * kMiB);  // does not fit the 61 MiB left: the range's tail
  EXPECT_EQ(fake.calls(FakeOp::mem_create), 2u) << "30 chunks moved, 2 created";
  EXPECT_EQ(info().mapped_bytes, 68 * kMiB);
  EXPECT_EQ(fake.used(0), 68 * kMiB);
  EXPECT_EQ(d.memset_d8(b, 1, 3 * kMiB), res::ok);
  EXPECT_EQ(d.memset_d8(c, 2, 64 * kMiB), res::ok);
}

TEST_F(VmmBackendTest, PeerAccessCoversMappedAndFutureChunks) {
  make();
  const DevPtr before = alloc(3 * kMiB);
  EXPECT_FALSE(fake.has_access(before, 1, true));
  ASSERT_EQ(backend->enable_peer_access(1, 0), res::ok);
  EXPECT_TRUE(fake.has_access(before, 1, true));
  EXPECT_TRUE(fake.has_access(before + 3 * kMiB - 1, 1, true));
  const DevPtr after = alloc(64 * kMiB);
  EXPECT_TRUE(fake.has_access(after + 64 * kMiB - 1, 1, true));
}

// Peer access granted before a device has any memory (the program enables it first): its region,
// made later, grants the peer access to small and large blocks from the start.
TEST_F(VmmBackendTest, PeerAccessGrantedBeforeTheRegionExistsReachesItsBlocks) {
  make();
  ASSERT_EQ(backend->enable_peer_access(0, 1), res::ok);  // device 0 reads device 1's memory
  fake.set_current_device(1);
  const DevPtr small = alloc(256, 1);
  const DevPtr large = alloc(64 * kMiB, 1);
  fake.set_current_device(0);
  EXPECT_TRUE(fake.has_access(small, 0, true));
  EXPECT_TRUE(fake.has_access(large + 64 * kMiB - 1, 0, true));
  EXPECT_FALSE(fake.has_access(alloc(64 * kMiB, 0), 1, true)) << "device 1 was granted nothing";
}

// Chunks freed, kept and remapped at another address for a larger block must be granted again
// there (the mapping's access goes with the address, not with the handle).
TEST_F(VmmBackendTest, PeerAccessCoversChunksRemappedElsewhere) {
  make();
  const DevPtr small = alloc(256);
  ASSERT_EQ(backend->enable_peer_access(1, 0), res::ok);
  EXPECT_TRUE(fake.has_access(small, 1, true)) << "the small blocks' range too";
  free(alloc(64 * kMiB));
  const DevPtr b = alloc(3 * kMiB);  // the start of the old place
  fake.reset_calls();
  const DevPtr c = alloc(64 * kMiB);  // the old place's free chunks move to the range's tail
  EXPECT_EQ(fake.calls(FakeOp::mem_create), 2u) << "30 chunks moved, 2 created";
  EXPECT_TRUE(fake.has_access(b, 1, true));
  for (std::size_t off = 0; off < 64 * kMiB; off += 2 * kMiB)
    EXPECT_TRUE(fake.has_access(c + off, 1, true)) << "offset " << off;
}

TEST_F(VmmBackendTest, EachDeviceHasItsOwnRegionAndFreesGoToTheirDevice) {
  make();
  const DevPtr p0 = alloc(3 * kMiB, 0);
  fake.set_current_device(1);
  const DevPtr p1 = alloc(3 * kMiB, 1);
  fake.set_current_device(0);
  EXPECT_EQ(fake.used(0), 4 * kMiB);
  EXPECT_EQ(fake.used(1), 4 * kMiB);
  EXPECT_TRUE(fake.has_access(p1, 1, true));
  free(p1);  // from device 0's thread
  free(p0);
  EXPECT_EQ(backend->stats().device(1).live_bytes(), 0u);
  ASSERT_EQ(backend->trim(1), res::ok);
  EXPECT_EQ(fake.used(1), 0u);
  EXPECT_EQ(fake.used(0), 4 * kMiB) << "trim(1) leaves device 0 alone";
}

// ---- Measurements ------------------------------------------------------------------------------

// Fragmentation is peak reserved over peak live (the target for a mixed workload: 1.05).
class Workload {
 public:
  explicit Workload(Backend& b) : b_(b) {}
  ~Workload() {
    for (auto& [p, blk] : live_) b_.deallocate(p, blk, FreeRequest{});
  }
  DevPtr alloc(std::size_t size) {
    AllocRequest req;
    req.size = size;
    DevPtr p = 0;
    std::uint64_t cookie = 0;
    EXPECT_EQ(b_.allocate(req, FreeSync::none, &p, &cookie), res::ok);
    live_[p] = Block{size, 0, 0, Api::alloc, FreeSync::none, cookie};
    bytes_ += size;
    return p;
  }
  void free(DevPtr p) {
    auto it = live_.find(p);
    bytes_ -= it->second.size;
    b_.deallocate(p, it->second, FreeRequest{});
    live_.erase(it);
  }
  std::size_t bytes() const { return bytes_; }
  double fragmentation() const {
    const DeviceStats& s = b_.stats().device(0);
    return static_cast<double>(s.peak_reserved_bytes()) / static_cast<double>(s.peak_bytes());
  }

 private:
  Backend& b_;
  std::map<DevPtr, Block> live_;
  std::size_t bytes_ = 0;
};

// Log-uniform sizes in [lo, hi): every magnitude equally common.
std::size_t log_uniform(std::mt19937_64& rng, double lo, double hi) {
  const double u = static_cast<double>(rng() % 1000000) / 1e6;
  return static_cast<std::size_t>(std::exp(std::log(lo) + (std::log(hi) - std::log(lo)) * u));
}

// A training loop: 60 layers with persistent weights (4 KiB..32 MiB); each step allocates the
// activations (64 KiB..64 MiB) and a temporary per layer going forward, then going backward a
// gradient and a temporary per layer while the activations are freed; the optimizer frees the
// gradients. The sizes of one layer are the same every step, temporaries vary.
double training_loop(Backend& b, unsigned seed) {
  std::mt19937_64 rng(seed);
  Workload w(b);
  constexpr int kLayers = 60;
  std::vector<std::size_t> weight(kLayers), act(kLayers), tmp(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    weight[l] = log_uniform(rng, 4096, 32 * kMiB);
    act[l] = log_uniform(rng, 64 * kKiB, 64 * kMiB);
    tmp[l] = log_uniform(rng, 1024, 16 * kMiB);
  }
  for (int l = 0; l < kLayers; ++l) w.alloc(weight[l]);
  for (int step = 0; step < 20; ++step) {
    std::vector<DevPtr> acts, grads;
    for (int l = 0; l < kLayers; ++l) {
      acts.push_back(w.alloc(act[l]));
      w.free(w.alloc(tmp[l] + rng() % 65536));
    }
    for (int l = kLayers - 1; l >= 0; --l) {
      grads.push_back(w.alloc(weight[l]));
      w.free(w.alloc(log_uniform(rng, 1024, 16 * kMiB)));
      w.free(acts[static_cast<std::size_t>(l)]);
    }
    for (DevPtr g : grads) w.free(g);
  }
  return w.fragmentation();
}

// The worst case for any allocator that cannot move blocks: random lifetimes. A live set of about
// `live` bytes of log-uniform sizes from 256 B to `max`, churned by random frees.
double random_churn(Backend& b, unsigned seed, std::size_t live, std::size_t max) {
  std::mt19937_64 rng(seed);
  Workload w(b);
  std::vector<DevPtr> v;
  for (int i = 0; i < 40000; ++i) {
    const bool grow = v.empty() || (w.bytes() < live ? rng() % 4 != 0 : rng() % 4 == 0);
    if (grow) {
      v.push_back(w.alloc(log_uniform(rng, 256, static_cast<double>(max))));
    } else {
      const std::size_t k = rng() % v.size();
      w.free(v[k]);
      v[k] = v.back();
      v.pop_back();
    }
  }
  return w.fragmentation();
}

// tools/bench/alloc_latency.cu --mixed, step for step (its splitmix64 generator, phases, cap and
// default seed and op count), so the figure measured on a GPU can be reproduced and improved here.
double mixed_workload(Backend& b, std::uint64_t seed = 0x5eed, long ops = 20000,
                      std::size_t cap = 2 * kGiB) {
  bench::SplitMix rng{seed};
  const double targets[] = {1.0, 0.35, 0.85, 0.2, 0.95, 0.5};
  constexpr int kPhases = sizeof targets / sizeof targets[0];
  Workload w(b);
  std::vector<DevPtr> live;
  auto free_random = [&] {
    const std::size_t k = rng.below(live.size());
    w.free(live[k]);
    live[k] = live.back();
    live.pop_back();
  };
  for (long op = 0; op < ops; ++op) {
    const int phase = static_cast<int>(op * kPhases / ops);
    const double target = targets[phase] * static_cast<double>(cap);
    const bool grow = static_cast<double>(w.bytes()) < target;
    if (!live.empty() && rng.unit() >= (grow ? 0.75 : 0.25)) {
      free_random();
      continue;
    }
    const bool small = phase % 2 == 1 && rng.unit() < 0.8;
    const std::size_t size = small ? rng.log_size(8, 20) : rng.log_size(8, 26);
    while (!live.empty() && w.bytes() + size > cap) free_random();
    live.push_back(w.alloc(size));
  }
  return w.fragmentation();
}

TEST_F(VmmBackendTest, FragmentationOfTheMixedBenchmarkWorkload) {
  make();
  const double r = mixed_workload(*backend);
  std::printf("vmm fragmentation, alloc_latency --mixed workload: %.4f\n", r);
  EXPECT_LE(r, 1.05);  // 1.2695 measured on an H100 before chunks could move one by one
}

TEST_F(VmmBackendTest, FragmentationOfATrainingLoopIsWithinFivePercent) {
  for (unsigned seed : {1u, 2u, 3u}) {
    make();
    const double r = training_loop(*backend, seed);
    std::printf("vmm fragmentation, training loop (seed %u): %.4f\n", seed, r);
    EXPECT_LE(r, 1.05);
  }
}

TEST_F(VmmBackendTest, FragmentationUnderRandomLifetimes) {
  struct Case {
    std::size_t live, max;
  };
  for (const Case c :
       {Case{4 * kGiB, 64 * kMiB}, Case{1 * kGiB, 16 * kMiB}, Case{512 * kMiB, 4 * kMiB}}) {
    make();
    const double r = random_churn(*backend, 1, c.live, c.max);
    std::printf("vmm fragmentation, random lifetimes, %zu MiB live, 256 B..%zu MiB: %.4f\n",
                c.live / kMiB, c.max / kMiB, r);
    EXPECT_LE(r, 1.25);
  }
}

// The host-side cost of an alloc/free pair on a hit, which is all a `none` hit costs on a GPU too
// (no driver call is made). Best of five runs, printed for the record (the machine may be busy);
// the bound only catches a pathology such as a per-chunk loop on 1 GiB blocks.
TEST_F(VmmBackendTest, HitLatency) {
  make();
  for (std::size_t size : {std::size_t{256}, 64 * kKiB, 1 * kMiB, 64 * kMiB, 1 * kGiB}) {
    AllocRequest req;
    req.size = size;
    DevPtr p = 0;
    std::uint64_t cookie = 0;
    Block blk{size, 0, 0, Api::alloc, FreeSync::none, 0};
    constexpr int kPairs = 100000;
    double best = 1e30;
    for (int run = 0; run < 5; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kPairs; ++i) {
        backend->allocate(req, FreeSync::none, &p, &cookie);
        blk.cookie = cookie;
        backend->deallocate(p, blk, FreeRequest{});
      }
      const double ns =
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
          kPairs;
      best = std::min(best, ns);
    }
    std::printf("vmm none hit, %zu bytes: %.0f ns per alloc+free (backend only)\n", size, best);
    EXPECT_LT(best, 20000.0);
  }
}

}  // namespace
}  // namespace allocshim
