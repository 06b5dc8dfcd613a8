// A member's lease of a shared budget: growing it from the node (asking the others for room and
// waiting for it), giving what it does not back back, the requests of the others, and the host
// pieces passed with the room (node_pieces.h). Joining, leaving and reports are node_budget.cpp's.
#include <time.h>

#include <algorithm>
#include <array>
#include <cinttypes>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "base/peak.h"
#include "node/node_budget.h"

namespace allocshim {

void NodeBudget::set_lease(Local& l, std::uint64_t bytes) {
  l.lease.store(bytes, std::memory_order_relaxed);
  raise_peak(l.peak_lease, bytes);
}

std::uint64_t NodeBudget::grow(int device, std::uint64_t bytes, bool wait, bool ask_others) {
  Local& l = at(device);
  if (l.entry.load(std::memory_order_relaxed) < 0) return ~std::uint64_t{0};
  const std::uint64_t t0 = clock::ticks();
  std::uint64_t progress = clock::now_ns();  // the start, or when the lease last grew
  bool waited = false, arrived = false;
  for (;;) {
    bool covered = false, grew = false, asked_back = false;
    const node::Status st = with_region(true, [&] {
      const int e = l.entry.load(std::memory_order_relaxed);
      if (e < 0) return node::Status::closed;  // left meanwhile
      const std::uint64_t lease = l.lease.load(std::memory_order_relaxed);
      if (bytes <= lease) {
        covered = true;
        return node::Status::ok;
      }
      node::Region::Grow g{};
      // Asks once per call: asking again while a member is still demoting for the first ask would
      // have it give the same room twice.
      const node::Status s =
          region_.grow(e, lease, bytes, round_to_lease(bytes),
                       l.cap.load(std::memory_order_relaxed), ask_others && !waited, 0, &g);
      if (s != node::Status::ok) return s;
      if (g.lease != lease) {
        set_lease(l, g.lease);
        l.grows.fetch_add(1, std::memory_order_relaxed);
        grew = g.lease > lease;
      }
      l.asks.fetch_add(g.asks, std::memory_order_relaxed);
      if (g.asked > 0) {
        std::copy_n(g.asked_pids, g.asked, l.asked_pids.begin());
        std::copy_n(g.asked_channels, g.asked, l.asked_channels.begin());
        l.asked = g.asked;
      }
      covered = g.lease >= bytes;
      // Others have asked this process for room on the device too, and none has arrived: a member
      // that wants room gives none (it waits in an allocation, or computes), so waiting for it
      // would only time out, while it waits for this process in turn.
      asked_back = wait && !covered && !arrived && (region_.asked() >> e & 1) != 0;
      return s;
    });
    const std::uint32_t wait_ms = wait_ms_.load(std::memory_order_relaxed);
    if (st != node::Status::ok || covered || !wait || wait_ms == 0 || asked_back) break;
    // The wait is for the next room to arrive, as a take-over's: a member demoting for this
    // request gives it in steps, and spilling the rest would pin it here and move it twice.
    const std::uint64_t now = clock::now_ns();
    if (grew) progress = now;
    arrived = arrived || (grew && waited);
    if (now - progress >= std::uint64_t{wait_ms} * 1000000u) {
      l.timeouts.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    waited = true;
    const timespec pause{0, static_cast<long>(kPollNs)};
    ::nanosleep(&pause, nullptr);  // no lock held: frees, cuMemGetInfo and safe points go on
  }
  if (waited) {
    l.waits.fetch_add(1, std::memory_order_relaxed);
    l.wait_ns.fetch_add(clock::to_ns(clock::ticks() - t0), std::memory_order_relaxed);
  }
  return l.entry.load(std::memory_order_relaxed) < 0 ? ~std::uint64_t{0}
                                                     : l.lease.load(std::memory_order_relaxed);
}

void NodeBudget::settle(int device, std::uint64_t backed, std::uint64_t keep) {
  Local& l = at(device);
  if (l.entry.load(std::memory_order_relaxed) < 0) return;
  const std::uint64_t target = round_to_lease(backed);
  if (l.lease.load(std::memory_order_relaxed) < target + std::max<std::uint64_t>(keep, 1)) return;
  // At a free (keep > 0) one try: a later free gives the slack back if the lock is busy now.
  with_region(keep == 0, [&] {
    const int e = l.entry.load(std::memory_order_relaxed);
    if (e < 0) return node::Status::closed;
    if (l.lease.load(std::memory_order_relaxed) <= target) return node::Status::ok;
    const node::Status s = region_.set_lease(e, target, 0);
    if (s == node::Status::ok) set_lease(l, target);
    return s;
  });
}

std::uint64_t NodeBudget::room(int device) const {
  const Local& l = at(device);
  if (l.entry.load(std::memory_order_relaxed) < 0) return ~std::uint64_t{0};
  std::uint64_t room = 0;
  const node::Status st = with_region(true, [&] {
    const int e = l.entry.load(std::memory_order_relaxed);
    if (e < 0) return node::Status::closed;
    return region_.room(e, l.cap.load(std::memory_order_relaxed), 0, &room);
  });
  if (st == node::Status::closed) return ~std::uint64_t{0};
  // Not readable: what this process holds is all it may count on.
  return st == node::Status::ok ? room : l.lease.load(std::memory_order_relaxed);
}

void NodeBudget::on_given(int device, std::uint64_t bytes, bool demoted) {
  if (bytes == 0) return;
  Local& l = at(device);
  l.given.fetch_add(bytes, std::memory_order_relaxed);
  if (demoted) l.yielded_ticks.store(clock::ticks(), std::memory_order_relaxed);
}

void NodeBudget::on_busy(int device) {
  Local& l = at(device);
  if (l.yielded_ticks.load(std::memory_order_relaxed) != 0)
    l.yielded_ticks.store(0, std::memory_order_relaxed);
}

bool NodeBudget::holding(int device) const {
  const std::uint64_t t = at(device).yielded_ticks.load(std::memory_order_relaxed);
  return t != 0 && clock::to_ns(clock::ticks() - t) < kYieldHoldMs * 1000000u;
}

std::uint64_t NodeBudget::take_request(int device) {
  Local& l = at(device);
  const int e0 = l.entry.load(std::memory_order_relaxed);
  if (e0 < 0 || (asked_bits_.load(std::memory_order_relaxed) & (std::uint64_t{1} << e0)) == 0)
    return 0;
  std::uint64_t want = 0;
  const node::Status st = with_region(true, [&] {
    const int e = l.entry.load(std::memory_order_relaxed);
    if (e < 0) return node::Status::closed;
    std::uint64_t pending = 0;
    const node::Status s = region_.take_request(e, 0, &want, &pending);
    if (s == node::Status::ok) asked_bits_.store(pending, std::memory_order_relaxed);
    return s;
  });
  if (st != node::Status::ok) {
    // Not answerable now: forget the hint until the next poll rather than retry at every safe point.
    asked_bits_.fetch_and(~(std::uint64_t{1} << e0), std::memory_order_relaxed);
    return 0;
  }
  if (want != 0) l.requests.fetch_add(1, std::memory_order_relaxed);
  return want;
}

void NodeBudget::connect_givers(int device) {
  Local& l = at(device);
  const int e = l.entry.load(std::memory_order_relaxed);
  if (e < 0) return;
  std::array<std::int32_t, node::Region::Grow::kAskedPids> pids;
  std::array<std::uint64_t, node::Region::Grow::kAskedPids> channels;
  std::size_t n;
  {
    std::lock_guard lock(mutex_);
    pids = l.asked_pids;
    channels = l.asked_channels;
    n = l.asked;
  }
  for (std::size_t i = 0; i < n; ++i) pieces_.connect(e, pids[i], channels[i]);
  l.offering.store(pieces_.connected(e), std::memory_order_relaxed);
  if (log::enabled(log::Level::debug))
    log::write(log::Level::debug,
               "budget share: device %d asked %zu members, passing host pieces to %s", device, n,
               l.offering.load(std::memory_order_relaxed) ? "them" : "none");
}

std::uint64_t NodeBudget::offer_pieces(int device, const node::PieceChannel::Give& give) {
  Local& l = at(device);
  const int e = l.entry.load(std::memory_order_relaxed);
  if (e < 0 || !l.offering.load(std::memory_order_relaxed)) return 0;
  const std::uint64_t sent = pieces_.offer(e, give);
  l.pieces_sent.fetch_add(sent, std::memory_order_relaxed);
  if (sent > 0 && log::enabled(log::Level::debug))
    log::write(log::Level::debug, "budget share: device %d passed %" PRIu64 " bytes of host pieces",
               device, sent);
  return sent;
}

void NodeBudget::end_offers(int device) {
  Local& l = at(device);
  if (!l.offering.exchange(false, std::memory_order_relaxed)) return;
  const int e = l.entry.load(std::memory_order_relaxed);
  if (e >= 0) pieces_.disconnect(e);
}

std::size_t NodeBudget::receive_pieces(int device, std::uint64_t lack, int wait_ms,
                                       const node::PieceChannel::Take& take) {
  Local& l = at(device);
  const int e = l.entry.load(std::memory_order_relaxed);
  if (e < 0) return 0;
  std::vector<pid_t> members;
  {
    // The region as this process last read it: the taker asked before this process was told to give.
    std::lock_guard lock(mutex_);
    members = region_.member_pids();
  }
  return pieces_.receive(e, lack, wait_ms, members, [&](const node::GivenPiece& p) {
    l.pieces_received.fetch_add(p.bytes, std::memory_order_relaxed);
    take(p);
  });
}

}  // namespace allocshim
