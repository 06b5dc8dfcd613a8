// Pinning ahead ([backends.host] pin_ahead; docs/design/oversubscription.md, "Pinning ahead"): host
// pieces for the next demotion, made on the pinner's thread (host_pinner.h) while the program
// computes, so that the demotion takes them as it takes the host reserve's and only copies.
//
// When: with migrate = "auto", after an allocation of the spill target leaves less room under the
// budget than the device's largest allocation so far, or a quarter of the budget (the next
// allocation of that size demotes), and after each demotion (the budget is full, and the pieces
// just taken are gone); never while an allocation of the spill target is in progress (the driver
// serializes cuMemCreate: pinning then would slow that allocation down). Without pin_ahead too,
// for a demotion a shared budget expects (expect_demotion: the next hand-over to another process),
// but only while the process computes. How much: the sizes of the device pieces a demotion would
// take first (the oldest allocations' pieces, most of them kMovePiece bytes), up to the smallest of
// the reserve's bound, the spill target's device bytes and the largest allocation (with pin_ahead)
// or the expected demotion, whichever is larger, counting what the reserve and earlier passes
// hold. Given back: when unused for pin_ahead_idle_ms, when the host runs short (MemAvailable
// under an eighth of MemTotal, read at each pass and every second while pieces are held, or a
// cuMemCreate refused), and then not made again until the next demotion (or expectation; one
// lapses once the process has idled pin_ahead_idle_ms without giving); with the
// reserve (every allocation freed, a context reset); at exit.
#include <algorithm>
#include <chrono>
#include <map>
#include <utility>
#include <vector>

#include "backends/host_impl.h"
#include "core/budget.h"
#include "base/scoped_context.h"

namespace allocshim::host_detail {
namespace {

// Pinned only while a quarter of the host's memory stays available after the piece, and given
// back below an eighth: pinned memory cannot be swapped, and the program may need the rest.
bool room_to_pin(std::uint64_t available, std::uint64_t total, std::size_t bytes) {
  return available >= bytes && available - bytes >= total / 4;
}
bool host_short(std::uint64_t available, std::uint64_t total) { return available < total / 8; }
constexpr auto kPressureCheck = std::chrono::seconds(1);
constexpr auto kComputingCheck = std::chrono::milliseconds(10);

}  // namespace

bool HostBackend::demotion_near(int device, std::size_t largest) {
  const std::uint64_t lim = budget_->limit(device);
  if (lim == policy::kUnlimited) return false;
  return budget_->headroom(device) < std::max<std::uint64_t>(lim / 4, largest);
}

bool HostBackend::pins_ahead(int device) const {
  return pin_ahead_.load(std::memory_order_relaxed) ||
         (budget_->expected_demotion(device) > 0 && budget_->migrate() == Budget::Migrate::auto_ &&
          host_reserve_.load(std::memory_order_relaxed) > 0);
}

bool HostBackend::keeps_ahead() const {
  return pin_ahead_.load(std::memory_order_relaxed) ||
         (budget_->migrate() == Budget::Migrate::auto_ &&
          host_reserve_.load(std::memory_order_relaxed) > 0);
}

void HostBackend::kick_ahead(DeviceState& s, int device) {
  if (s.ready && s.ahead_armed && pins_ahead(device)) pinner_->kick();
}

void HostBackend::expect_demotion(int device, std::size_t bytes) {
  DeviceState* s = devices_.at(device);
  if (s == nullptr || budget_ == nullptr) return;
  std::lock_guard lock(mutex_);
  if (!s->ready) return;
  // Pieces pinned for an expectation that is over stay for what of the hand-over is still to come,
  // and go back unused after pin_ahead_idle_ms like any pinned ahead; the reserve keeps no more
  // than its bound now allows.
  s->expected_idle = {};
  trim_reserve(*s, device);
  if (bytes == 0) return;
  s->ahead_armed = true;
  kick_ahead(*s, device);
}

std::size_t HostBackend::ahead_next(const DeviceState& s, int device) const {
  const std::size_t bound = host_reserve_.load(std::memory_order_relaxed);
  // Pinned for an expected demotion only while the process computes: while it idles, the others'
  // moves are under way, and pinning would stall them (the driver serializes both). Nor while
  // it waits for room from others with memory of its own still on the host: the givers pin for
  // that demotion now, and pinning here would slow it down.
  const bool now =
      budget_->computing(device) &&
      (s.host_bytes.load(std::memory_order_relaxed) == 0 || !budget_->receiving(device));
  const std::size_t expected = now ? budget_->expected_demotion(device) : 0;
  const std::size_t wanted =
      std::max(pin_ahead_.load(std::memory_order_relaxed) ? s.largest : 0, expected);
  const std::size_t target =
      std::min({bound, s.device_bytes.load(std::memory_order_relaxed), wanted});
  std::size_t held = s.reserve_bytes + s.ahead_bytes;
  if (held >= target) return 0;
  // What the reserve and earlier passes hold, by size: a piece of a size held already is covered.
  // Each size's held pieces are counted off in place as device pieces of that size come up, so a
  // pass copies neither map (pieces are multiples of the chunk up to kMovePiece: few sizes).
  using Held = std::multimap<std::size_t, MemHandle>::const_iterator;
  struct Size {
    std::size_t bytes;
    Held reserve, reserve_end, ahead, ahead_end;
  };
  std::vector<Size> sizes;
  const auto take_held = [&](std::size_t bytes) {
    auto it =
        std::find_if(sizes.begin(), sizes.end(), [&](const Size& z) { return z.bytes == bytes; });
    if (it == sizes.end()) {
      const auto [r, r_end] = s.reserve.equal_range(bytes);
      const auto [a, a_end] = s.ahead.equal_range(bytes);
      it = sizes.insert(sizes.end(), Size{bytes, r, r_end, a, a_end});
    }
    if (it->reserve != it->reserve_end)
      ++it->reserve;
    else if (it->ahead != it->ahead_end)
      ++it->ahead;
    else
      return false;
    return true;
  };
  // Device pieces oldest allocation first: the order demotion falls back to (placement/migration.h).
  // The device's allocations are kept in that order (by_age): the walk stops at the first piece
  // not covered, and never looks at the younger ones, however many the device has.
  std::size_t covered = 0;
  for (const auto& [seq, a] : s.by_age) {
    if (a->exported) continue;
    for (const Piece& p : a->pieces) {
      if (!p.on_device) continue;
      if (covered >= target) return 0;
      if (!take_held(p.bytes)) return held + p.bytes <= bound ? p.bytes : 0;
      covered += p.bytes;
    }
  }
  return 0;
}

void HostBackend::drop_ahead(DeviceState& s, int device) {
  budget_->forget_demotion(
      device, budget_->expected_demotion(device));  // pinned again only for the next request
  if (s.ahead.empty()) return;
  for (const auto& [bytes, h] : s.ahead) driver().mem_release(h);
  const std::size_t n = s.ahead.size();
  s.ahead.clear();
  s.ahead_bytes = 0;
  budget_->on_ahead(device, 0, 0, 0, n);
}

Pinner::Clock::time_point HostBackend::ahead_pass() {
  using Clock = Pinner::Clock;
  // The driver serializes cuMemCreate: while the program allocates from the spill target, pinning
  // here would only slow that allocation down. Looked at again shortly.
  const auto yield = [&] { return allocating_.load(std::memory_order_relaxed) > 0; };
  constexpr auto kYield = std::chrono::milliseconds(1);
  if (yield()) return Clock::now() + kYield;
  Clock::time_point due = Clock::time_point::max();
  bool pinned = false;
  std::uint64_t available = 0, total = 0;
  const bool known = memory_probe_.load(std::memory_order_relaxed)(&available, &total);
  const auto idle = std::chrono::milliseconds(pin_ahead_idle_ms_.load(std::memory_order_relaxed));
  for (int device = 0; device < static_cast<int>(kMaxDevices); ++device) {
    DeviceState& s = *devices_.at(device);
    std::size_t bytes = 0;
    Context ctx = nullptr;
    Location host;
    {
      std::lock_guard lock(mutex_);
      if (!s.ready) continue;
      const Clock::time_point now = Clock::now();
      if (!keeps_ahead() || (known && host_short(available, total)) ||
          (!s.ahead.empty() && now - s.ahead_touched >= idle)) {
        // Turned off by a reload, the host is short, or no demotion came: the pieces go back, and
        // none are made again before the next demotion (or the next request expecting one).
        if (!s.ahead.empty()) s.ahead_armed = false;
        drop_ahead(s, device);
        continue;
      }
      // While it holds pieces the thread looks at the host's memory every kPressureCheck too, and
      // while a demotion is expected and the process idles, whether it computes again.
      if (!s.ahead.empty()) due = std::min({due, s.ahead_touched + idle, now + kPressureCheck});
      const std::uint64_t expected = budget_->expected_demotion(device);
      if (expected > 0 && budget_->computing(device)) {
        s.expected_idle = {};
        // Waiting for room (ahead_next): it looks again once its memory is back.
        if (s.host_bytes.load(std::memory_order_relaxed) > 0 && budget_->receiving(device))
          due = std::min(due, now + kComputingCheck);
      } else if (expected > 0) {
        // Nobody asked while it idled that long: the others need no room from it, and its pieces
        // pinned ahead go back after as long unused. Without this the thread would look every
        // kComputingCheck for as long as the process lives idle.
        if (s.expected_idle == Clock::time_point{}) s.expected_idle = now;
        if (now - s.expected_idle < idle) {
          due = std::min(due, now + kComputingCheck);
        } else {
          budget_->forget_demotion(device, expected);
          trim_reserve(s, device);
        }
      }
      if (!s.ahead_armed || (bytes = ahead_next(s, device)) == 0) continue;
      if (known && !room_to_pin(available, total, bytes)) continue;
      ctx = s.ctx;
      host = s.host;
    }
    if (yield()) return Clock::now() + kYield;
    driver().ctx_set_current(ctx);
    MemHandle h = 0;
    const Result r = create(s, bytes, host, &h);
    std::lock_guard lock(mutex_);
    if (r != res::ok) {
      // The host is short, or the driver refuses: what was pinned ahead is better given back.
      s.ahead_armed = false;
      drop_ahead(s, device);
      continue;
    }
    if (!s.ready || s.ctx != ctx || !pins_ahead(device) || ahead_next(s, device) != bytes) {
      driver().mem_release(h);  // no longer wanted (memory freed or demoted meanwhile)
      continue;
    }
    s.ahead.emplace(bytes, h);
    s.ahead_bytes += bytes;
    s.ahead_touched = Clock::now();
    budget_->on_ahead(device, s.ahead_bytes, 1, 0, 0);
    pinned = true;
  }
  return pinned ? Clock::time_point::min() : due;
}

void HostBackend::close_ahead() {
  std::lock_guard lock(mutex_);
  for (int device = 0; device < static_cast<int>(kMaxDevices); ++device) {
    DeviceState& s = *devices_.at(device);
    if (s.ahead.empty()) continue;
    ScopedContext scope(driver(), s.ctx);
    s.ahead_armed = false;
    drop_ahead(s, device);
  }
}

}  // namespace allocshim::host_detail
