// Migration's moves through the mechanism (placement/movable.h), accounted with the ledger: a
// promotion moves each piece into room the ledger gave it, what it did not take goes back, and
// every move and refusal is reported. The mechanism itself accounts for nothing.

#include "placement/migration.h"

namespace allocshim {

std::size_t Migration::to_device(Movable& t, int device, const std::vector<DevPtr>& order,
                                 std::size_t max_bytes) {
  std::size_t claimed = 0;
  const Movable::Moves m = t.promote(device, order, max_bytes, [&](std::size_t bytes) {
    const std::size_t got = ledger_.claim_promotion(device, bytes);
    claimed += got;
    return got == bytes;
  });
  if (m.bytes < claimed) ledger_.release_device(device, claimed - m.bytes);
  account(device, m, true);
  return m.bytes;
}

std::size_t Migration::to_host(Movable& t, int device, const std::vector<DevPtr>& order,
                               std::size_t want_bytes) {
  const Movable::Moves m = t.demote(device, order, want_bytes);
  if (m.bytes > 0) ledger_.release_device(device, m.bytes);
  account(device, m, false);
  return m.bytes;
}

void Migration::account(int device, const Movable::Moves& m, bool to_device) {
  for (const Movable::Moves::Piece& p : m.pieces)
    ledger_.on_moved(device, p.at, p.bytes, to_device, p.ns);
  if (m.failed != res::ok) ledger_.on_move_failed(device, m.failed);
}

}  // namespace allocshim
