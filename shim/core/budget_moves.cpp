// The budget's side of migration and of turns between the processes of a shared budget: safe
// points, making room for an allocation, promotion at a safe point and ahead of a launch, taking
// the room over, asking others for room and answering their requests. budget.cpp keeps the
// accounting (limits, admission, claims, reports).
#include <time.h>

#include <algorithm>

#include "core/budget.h"
#include "base/clock.h"
#include "base/events.h"
#include "base/log.h"

namespace allocshim {

void Budget::after_free(int device) {
  if (node_.active()) {
    const std::uint64_t lease = node_.lease(device);
    node_.settle(device, backed(device));
    // A free that gave room back while another member waits for room answers it as far as it goes,
    // and a program that frees tends to free more (at its end, or a framework emptying its cache):
    // demoting now would copy memory about to be freed. The rest waits for a later safe point.
    if (node_.lease(device) < lease && node_.asked()) return;
  }
  if (note_safe_point(device)) at_safe_point(device);
}

std::uint64_t Budget::demote(int device, std::uint64_t bytes, std::uint64_t newcomer) {
  return bytes == 0 ? 0
                    : migration_.demote(device, static_cast<std::size_t>(bytes),
                                        static_cast<std::size_t>(newcomer));
}

std::uint64_t Budget::make_room(int device, std::uint64_t bytes, std::uint64_t newcomer) {
  Backend* s = spill_.load(std::memory_order_acquire);
  if (s == nullptr || s->reserved(device) == 0) return 0;  // nothing to demote: no synchronization
  const std::uint64_t moved = demote(device, bytes, newcomer);
  if (moved > 0) on_shim_sync(device);  // demote synchronized the context first
  return moved;
}

std::size_t Budget::claim_new(int device, std::size_t bytes, std::size_t unit) {
  const bool auto_ = migrate() == Migrate::auto_;
  std::size_t got = claim(device, bytes, unit, auto_ ? Claim::quiet : Claim::allocation);
  if (auto_ && got < bytes && node_.active())
    got += claim(device, bytes - got, unit, Claim::waiting);
  if (auto_ && got < bytes && make_room(device, bytes - got, bytes) > 0)
    got += claim(device, bytes - got, unit, Claim::quiet);
  return got;
}

bool Budget::note_safe_point(int device, std::uint64_t waited_ns) {
  if (device < 0) {
    for (int dev = 0; dev < static_cast<int>(kMaxDevices); ++dev)
      if (at(dev).limit.load(std::memory_order_relaxed) != kUnresolved &&
          note_safe_point(dev, waited_ns))
        return true;
    return false;
  }
  const bool busy = Migration::busy(waited_ns);
  Turn& turn = at(device).turn;
  // A safe point that is not busy ends the busy phase: the next one may ask others again. So it
  // does for a phase that took the room over at a launch and waited at no busy safe point since:
  // its asks would otherwise stay out, and the phase receiving, for good.
  if (!busy && __builtin_expect(turn.computing(), 0)) {
    turn.end_phase();
    node_.end_offers(device);
    // The spill target pins for an expected demotion while the process computes, and has it
    // lapse once the process idles unasked: it looks again now that the process idles.
    if (const std::uint64_t e = turn.expected(); e > 0)
      if (Movable* m = movable()) m->expect_demotion(device, static_cast<std::size_t>(e));
  }
  if (__builtin_expect(node_.asked(), 0)) return true;  // another process waits for room
  const Movable* m = movable();
  if (m == nullptr) return false;
  if (m->host_bytes(device) == 0) {
    // All its memory is back, however it came: the room it gave is no reason to take room over.
    turn.on_got_room_back();
    // How long the program computes with all its memory on the device is what predicts its next
    // phase: a phase slowed by its own spilled memory says nothing about it.
    if (busy && node_.active()) turn.on_clean_wait(waited_ns);
    return false;
  }
  const bool ask = busy && node_.active() && turn.on_busy_wait(waited_ns, m->host_bytes(device));
  return ask || migration_.wants_safe_point(device, promotion_room(device) + cached(device));
}

std::uint64_t Budget::promotion_room(int device) {
  const std::uint64_t room = headroom(device);
  if (__builtin_expect(!node_.holding(device), 1)) return room;
  const std::uint64_t lease = node_.lease(device), b = backed(device);
  return std::min(room, lease > b ? lease - b : 0);
}

void Budget::at_safe_point(int device, std::uint64_t waited_ns) {
  if (device < 0) {
    // Only devices that were used have a resolved limit (and anything to move).
    for (int dev = 0; dev < static_cast<int>(kMaxDevices); ++dev)
      if (at(dev).limit.load(std::memory_order_relaxed) != kUnresolved)
        at_safe_point(dev, waited_ns);
    return;
  }
  const bool busy = Migration::busy(waited_ns);
  // Other processes' requests first (one relaxed load when nothing is asked): they wait for the
  // room, which promotion must not take back at the same safe point.
  if (__builtin_expect(node_.asked(), 0) && serve_requests(device, busy)) return;
  const Movable* m = movable();
  if (m == nullptr) return;
  const std::uint64_t spilled = m->host_bytes(device);
  if (spilled == 0) return;
  if (busy) {
    // The process uses the device again: a hold taken when it gave room while idle is over.
    node_.on_busy(device);
    ask_for_room(device, spilled, waited_ns);
  }
  // A busy phase taking over the room others give waits for it and promotes all of it, not one
  // safe point's share of its wait: the giver is idle, so the moves have the GPU to themselves,
  // and each pass run partly from the host costs more than the move. Once a wait found nothing
  // coming, it promotes what arrived without waiting, until a demotion step's worth arrives at
  // once: a giver demotes again (it idles now), and waiting for the rest pays again (the program's
  // kernels would slow the giver's copies down: the GPU runs one context at a time). It swaps
  // none of its own memory meanwhile: the room on its way makes such a swap moot, and the swap
  // moves bytes twice.
  Turn& turn = at(device).turn;
  if (busy && turn.handing_over()) {
    if (turn.state() == Turn::State::taking_over) {
      take_over(device);
    } else if (const std::uint64_t got = promote_at_point(device, spilled, false); got > 0) {
      offer_pieces(device);
      turn.on_arrived(got >= kDemoteStep);
      const std::uint64_t more = turn.state() == Turn::State::taking_over ? take_over(device) : 0;
      if (more == 0) after_taking(device, got);
    }
    return;
  }
  promote_at_point(device, Migration::promote_bound(waited_ns), !receiving(device));
}

std::uint64_t Budget::reserve_bound(int device) const {
  const std::uint64_t bound = host_reserve();
  if (bound == 0 || !node_.active()) return bound;
  return at(device).turn.handing_over() ? ~std::uint64_t{0} : bound;
}

void Budget::expect_demotion(int device, std::uint64_t bytes) {
  at(device).turn.set_expected(bytes);
  if (Movable* m = movable()) m->expect_demotion(device, static_cast<std::size_t>(bytes));
}

std::uint64_t Budget::promote_at_point(int device, std::uint64_t bound, bool swaps) {
  // The pools' cached memory is room too: given back when promotion would otherwise find none.
  return migration_.at_safe_point(
      device, bound,
      [&] {
        const std::uint64_t room = promotion_room(device);
        return room >= Migration::kMinRoom || !trim_caches(device) ? room : promotion_room(device);
      },
      swaps);
}

std::uint64_t Budget::take_over(int device) {
  Movable* m = movable();
  if (m == nullptr) return 0;
  Turn& turn = at(device).turn;
  // Waiting pays while the room comes: each pass the program would run meanwhile reads its spilled
  // memory over the link, which costs more than moving it. A giver that does not answer (it is
  // busy, or reaches no safe point) costs share_wait_ms once per phase, and in fewer phases the
  // more often it happened; one that gives slowly at most what moving everything at the hand-over
  // rate takes.
  const std::uint64_t start = clock::now_ns();
  const std::uint64_t gap = std::uint64_t{node_.wait_ms()} * 1000000u;
  const std::uint64_t cap = std::max(gap, Turn::long_phase_ns(m->host_bytes(device)));
  std::uint64_t moved = 0, progress = start;
  for (;;) {
    const std::uint64_t spilled = m->host_bytes(device);
    if (spilled == 0) {
      turn.on_all_back();
      break;
    }
    const std::uint64_t got = promote_at_point(device, spilled, false);
    moved += got;
    offer_pieces(device);
    const std::uint64_t now = clock::now_ns();
    if (got > 0) {
      progress = now;
    } else if (now - progress >= gap) {
      // Nothing comes: the rest of the phase promotes what arrives without waiting for it, and if
      // nothing comes in all of it, so do the next 1, 3, 7, ... phases. A giver that is only slow
      // (pinning its first demotion) gives later in the phase, and the next phase waits again.
      turn.on_nothing_came(moved == 0);
      break;
    }
    if (now - start >= cap) break;
    const timespec pause{0, static_cast<long>(NodeBudget::kPollNs)};
    ::nanosleep(&pause,
                nullptr);  // no lock held: the giver's settle and this process's frees go on
  }
  offer_pieces(device);  // what the last promotions freed
  after_taking(device, moved);
  return moved;
}

void Budget::after_taking(int device, std::uint64_t got) {
  const Movable* m = movable();
  if (got == 0 || m == nullptr || m->host_bytes(device) != 0) return;
  // The others gave room they will ask back at their turn: the host pieces for giving it (as much
  // as the host reserve keeps) are pinned while this process computes, so that the next turn
  // change only copies. Whichever promotion brought the last piece back: a take-over that ends at
  // its time bound, or a safe point that promoted what arrived without waiting for it.
  expect_demotion(device, std::max(at(device).turn.expected(), m->device_bytes(device)));
}

std::uint64_t Budget::promote_ahead(int device, const std::vector<DevPtr>& wanted,
                                    const std::vector<DevPtr>& named) {
  if (migrate() != Migrate::auto_) return 0;
  // The first launch of a phase expected long takes the room over before it runs, rather than
  // run from the host until its first synchronization asks. So does one of a process that gave its
  // memory to another member while idle (`gave_room`), with no evidence of its own yet: members
  // that trade room take turns, and the one it gave to pins the host pieces for giving it back
  // (expect_demotion), so taking it back here only copies, where waiting for the phase to turn
  // long would read one pass over the link first.
  if (node_.active() && !receiving(device)) {
    const Movable* m = movable();
    const std::uint64_t spilled = m ? m->host_bytes(device) : 0;
    Turn& turn = at(device).turn;
    const bool own = turn.long_phase(spilled);
    if (spilled > 0 && turn.may_wait() && (own || turn.gave_room())) {
      if (!own) turn.take_over();  // long from here on (Turn::long_phase)
      node_.on_busy(device);       // a launch: the process takes its turn, a hold is over
      ask_for_room(device, spilled, 0);
      const std::uint64_t moved = take_over(device);
      if (moved > 0) on_shim_sync(device);  // the moves synchronized the context
      return moved;
    }
  }
  // While room from other processes is on its way, the busy safe points promote into it.
  if (receiving(device)) return 0;
  const std::uint64_t moved = migration_.promote_ahead(
      device, wanted, named, Migration::kRebalancePerPoint, promotion_room(device));
  if (moved > 0) on_shim_sync(device);  // the move synchronized the context
  return moved;
}

void Budget::ask_for_room(int device, std::uint64_t spilled, std::uint64_t waited_ns) {
  Turn& turn = at(device).turn;
  if (!node_.active() || node_.holding(device)) return;
  const bool long_phase = turn.long_phase(spilled);
  if (!turn.may_ask(long_phase)) return;
  // A phase expected to be long (this one is, or the last one computed long with its memory on the
  // device) takes the room over: it asks for everything spilled, and promotes what arrives at once.
  // A short one asks for one safe point's promotion, since moving more costs it more than reading
  // the rest over the link.
  if (long_phase) turn.take_over();
  const std::uint64_t want =
      long_phase ? spilled : std::min(spilled, Migration::promote_bound(waited_ns));
  // Not "no room at all": promotion takes whole pieces (up to 64 MiB), so a few MiB of room left
  // by the leases' rounding would stop it without asking anyone.
  if (promotion_room(device) >= want) return;
  turn.on_ask();
  // A lease that backs what this process holds and `want` more: grow takes what the node has free
  // and asks the others for the rest. No waiting: the program's synchronization is its critical
  // path, and the room a member gives is promoted into at the next busy safe points (waiting
  // here slowed share_bench's hand-off while the giver was still pinning).
  node_.grow(device, backed(device) + want, false, true);
  // Taking the room over: the host pieces its promotions free can save the givers pinning.
  if (long_phase) node_.connect_givers(device);
}

void Budget::on_moved(int device, DevPtr ptr, std::size_t bytes, bool to_device, std::uint64_t ns) {
  Device& d = at(device);
  (to_device ? d.promoted_bytes : d.demoted_bytes).fetch_add(bytes, std::memory_order_relaxed);
  (to_device ? d.promotions : d.demotions).fetch_add(1, std::memory_order_relaxed);
  d.migrate_ns.fetch_add(ns, std::memory_order_relaxed);
  if (EventSink* tr = event_sink())
    tr->on_migrate(ptr, bytes, device, to_device ? event::kPlacementHost : event::kPlacementDevice,
                   to_device ? event::kPlacementDevice : event::kPlacementHost, ns);
}

void Budget::on_move_failed(int device, Result r) {
  if (at(device).move_failures.fetch_add(1, std::memory_order_relaxed) == 0)
    log::write(
        log::Level::warn,
        "budget device %d: a migration failed (driver error %d); the memory stays where it was",
        device, r);
}

bool Budget::serve_requests(int device, bool busy) {
  const int first = device < 0 ? 0 : device,
            last = device < 0 ? static_cast<int>(kMaxDevices) - 1 : device;
  bool served = false;
  for (int d = first; d <= last; ++d) {
    std::uint64_t want = node_.take_request(d);
    if (want == 0) continue;
    served = true;
    // Room nobody leases is the requester's for the taking: a request made before this process's
    // last gives arrived asks for them again. Taken off before the request is bounded by what this
    // process holds: a request for more than it holds still wants the rest after those gives.
    const std::uint64_t room = node_.room(d), held = node_.lease(d);
    want -= std::min(want, room > held ? room - held : 0);
    want = std::min(want, held);
    // Cheapest first: lease this process does not use, then memory its pools cache, then (migrate
    // = "auto") device memory of the spill target demoted to the host.
    const std::uint64_t before = node_.lease(d);
    node_.settle(d, backed(d), 0);
    if (before - node_.lease(d) < want && trim_caches(d)) node_.settle(d, backed(d), 0);
    // Demoted in steps, the lease given back after each: pinning host memory is slow (the
    // pin_bench benchmark; docs/design/oversubscription.md, "What a move costs"), so a requester whose wait ends before the
    // whole request is demoted still gets what was demoted by then. Only at a safe point where
    // this process is idle: one that waited for its own work keeps its memory (the requester
    // spills, and asks again at its own busy safe points once this one is idle).
    const bool moved = migrate() == Migrate::auto_ && !busy && demote_for_others(d, want, before);
    if (moved) at(d).turn.on_gave_room();
    const std::uint64_t given = before - node_.lease(d);
    node_.on_given(d, given, moved);
    // A busy process keeps its memory, and the requester asks again once it is idle: the host
    // pieces that demotion needs are pinned while this one computes, not during the hand-over,
    // where pinning stalls both processes' moves (the driver serializes them). Requests taken one
    // by one add up (each allocation of another process asks for its own room; the region merges
    // those made before this process took them); one asked again counts twice, which the host
    // reserve's bound caps. Once demoted for, nothing more is pinned for them.
    const std::uint64_t expected = at(d).turn.expected();
    if (busy && given < want && migrate() == Migrate::auto_)
      expect_demotion(
          d, expected + (want - given) < expected ? ~std::uint64_t{0} : expected + (want - given));
    else if (moved && expected > 0)
      expect_demotion(d, 0);
  }
  return served;
}

}  // namespace allocshim
