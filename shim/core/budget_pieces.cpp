// The budget's side of passing host pieces between the members of a shared budget
// (node/node_pieces.h; docs/design/oversubscription.md, "Passing host pieces"): when a giver
// demotes for a taker, and what of the taker's host reserve goes to it.
#include <algorithm>
#include <cinttypes>
#include <vector>

#include "core/budget.h"
#include "base/log.h"

namespace allocshim {

void Budget::offer_pieces(int device) {
  if (__builtin_expect(!node_.offering(device), 1)) return;
  Movable* m = movable();
  if (m == nullptr) return;
  node_.offer_pieces(device, [&](std::uint64_t bytes, std::vector<node::GivenPiece>& out) {
    std::vector<Movable::Given> given;
    m->give_host(device, static_cast<std::size_t>(bytes), given);
    for (const Movable::Given& g : given) out.push_back(node::GivenPiece{g.bytes, g.fd});
  });
}

bool Budget::demote_for_others(int device, std::uint64_t want, std::uint64_t before) {
  Movable* m = movable();
  // What the demotion lacks of host memory it holds already: the takers' pieces cover it, each
  // step's after the step before freed their room (the first pins, unless the reserve covers it).
  std::uint64_t lack = 0, received = 0;
  const auto take = [&](const node::GivenPiece& p) {
    if (m != nullptr && m->adopt_host(device, static_cast<std::size_t>(p.bytes), p.fd))
      received += p.bytes;
  };
  if (m != nullptr && host_reserve() > 0) {
    // Pieces serve the steps after the first only (nothing is freed before the taker promotes
    // into the room the first one gives), and no more than the host reserve may keep
    // (HostBackend::reserve_bound): pieces past it would be released here, lost to the taker too.
    const std::uint64_t given = before - node_.lease(device), spare = m->host_spare(device);
    const std::uint64_t need = want > given ? want - given : 0;
    const std::uint64_t later =
        need > std::max(spare, kDemoteStep) ? need - std::max(spare, kDemoteStep) : 0;
    const std::uint64_t room = std::max(reserve_bound(device), expected_demotion(device));
    lack = std::min(later, room > spare ? room - spare : 0);
    node_.receive_pieces(device, lack, 0, take);
  }
  bool moved = false, waits = true;
  while (before - node_.lease(device) < want) {
    const std::uint64_t lease = node_.lease(device);
    const std::uint64_t step = std::min(want - (before - lease), kDemoteStep);
    if (moved && lack > received && waits) {
      // A taker that sends nothing within the wait does not pass pieces: the rest pins.
      const std::uint64_t had = received;
      const std::uint64_t spare = m->host_spare(device);
      if (spare < step)
        node_.receive_pieces(device, lack - received,
                             piece_wait_ms_.load(std::memory_order_relaxed), take);
      waits = received > had || spare >= step;
    }
    if (demote(device, step) == 0) break;
    moved = true;
    node_.settle(device, backed(device), 0);
    if (node_.lease(device) == lease) break;  // the region could not be updated: stop moving
  }
  // Done: the takers send no more (what is on its way is read now, or at the next request).
  if (lack > 0) node_.receive_pieces(device, 0, 0, take);
  if (log::enabled(log::Level::debug))
    log::write(log::Level::debug,
               "budget device %d: gave %" PRIu64 " of %" PRIu64
               " bytes asked; host pieces lacking %" PRIu64 ", received %" PRIu64,
               device, before - node_.lease(device), want, lack, received);
  return moved;
}

}  // namespace allocshim
