// The region's leases (node/node_region.h): a member attaching to a GPU's entry, growing and
// setting its lease, the room left, requests for room between members, what each publishes for
// views, its channel for host pieces. Each runs under the region lock (begin ... end).
#include <algorithm>
#include <cstring>

#include "node/node_region.h"

namespace allocshim::node {
namespace {

using os::pread_full;

std::uint64_t add_sat(std::uint64_t a, std::uint64_t b) {
  return a + b < a ? ~std::uint64_t{0} : a + b;
}

}  // namespace

Status Region::attach(const Uuid& uuid, std::uint64_t mine, unsigned timeout_ms, int* entry,
                      std::uint64_t* limit) {
  *entry = -1;
  *limit = mine;
  const Status st = begin(kHead, timeout_ms);
  if (st != Status::ok) return st;
  Layout& r = *copy_;
  int found = -1, free_entry = -1;
  for (std::size_t e = 0; e < kEntries && found < 0; ++e) {
    if (r.entries[e].used == 0) {
      if (free_entry < 0) free_entry = static_cast<int>(e);
    } else if (std::memcmp(r.entries[e].uuid, uuid.bytes, sizeof uuid.bytes) == 0) {
      found = static_cast<int>(e);
    }
  }
  if (found < 0) {
    if (free_entry < 0) return end(true);
    found = free_entry;
    r.entries[found].used = 1;
    std::memcpy(r.entries[found].uuid, uuid.bytes, sizeof uuid.bytes);
  }
  const std::uint64_t bit = std::uint64_t{1} << found;
  bool others = false;
  for (std::size_t i = 0; i < kSlots && !others; ++i)
    others =
        static_cast<int>(i) != slot_ && r.slots[i].in_use != 0 && (r.slots[i].attached & bit) != 0;
  if (!others) r.entries[found].limit = mine;
  write_failed_ |= !put(r.entries[found]);
  attached_ |= bit;
  uuids_[found] = uuid;
  r.slots[slot_].attached = attached_;
  write_failed_ |= !put(r.slots[slot_]);
  *entry = found;
  *limit = r.entries[found].limit;
  return end(true);
}

Status Region::grow(int e, std::uint64_t lease, std::uint64_t need, std::uint64_t target,
                    std::uint64_t cap, bool ask_others, unsigned timeout_ms, Grow* out) {
  out->lease = lease;
  out->asks = 0;
  out->asked = 0;
  const Status st = begin_entry(e, timeout_ms);
  if (st != Status::ok) return st;
  Layout& r = *copy_;
  const std::uint64_t limit = std::min(r.entries[e].limit, cap);
  std::uint64_t others = 0;
  for (std::size_t i = 0; i < kSlots; ++i)
    if (static_cast<int>(i) != slot_) others = add_sat(others, r.lease[e][i]);
  const std::uint64_t room = limit > others ? limit - others : 0;
  const std::uint64_t next = std::max(lease, std::min(target, room));
  if (next != r.lease[e][slot_]) {
    r.lease[e][slot_] = next;
    write_failed_ |= !put(r.lease[e][slot_]);
  }
  mine_[e] = next;
  out->lease = next;
  std::uint64_t ask = ask_others && next < need ? need - next : 0;
  const std::uint64_t bit = std::uint64_t{1} << e;
  for (std::size_t i = 0; i < kSlots && ask > 0; ++i) {
    if (static_cast<int>(i) == slot_) continue;
    Slot& s = r.slots[i];
    const std::uint64_t held = r.lease[e][i];
    if (s.in_use == 0 || held == 0) continue;
    const std::uint64_t want = std::min(held, ask);
    write_failed_ |= !get(r.want[i][e]);
    if (r.want[i][e] < want) {
      r.want[i][e] = want;
      write_failed_ |= !put(r.want[i][e]);
    }
    if ((s.asked & bit) == 0) {
      s.asked |= bit;
      write_failed_ |= !put(s.asked);
      ++out->asks;
    }
    if (out->asked < Grow::kAskedPids) {
      out->asked_pids[out->asked] = s.pid;
      out->asked_channels[out->asked++] = s.channel;
    }
    ask -= want;
  }
  return end(true);
}

Status Region::set_lease(int e, std::uint64_t bytes, unsigned timeout_ms) {
  const Status st = begin_entry(e, timeout_ms);
  if (st != Status::ok) return st;
  std::uint64_t& lease = copy_->lease[e][slot_];
  if (lease != bytes) {
    lease = bytes;
    write_failed_ |= !put(lease);
  }
  mine_[e] = bytes;
  return end(true);
}

Status Region::room(int e, std::uint64_t cap, unsigned timeout_ms, std::uint64_t* room) {
  *room = 0;
  const Status st = begin_entry(e, timeout_ms);
  if (st != Status::ok) return st;
  const Layout& r = *copy_;
  const std::uint64_t limit = std::min(r.entries[e].limit, cap);
  std::uint64_t others = 0;
  for (std::size_t i = 0; i < kSlots; ++i)
    if (static_cast<int>(i) != slot_) others = add_sat(others, r.lease[e][i]);
  *room = limit > others ? limit - others : 0;
  return end(true);
}

Status Region::take_request(int e, unsigned timeout_ms, std::uint64_t* want,
                            std::uint64_t* pending) {
  *want = 0;
  *pending = 0;
  const Status st = begin_entry(e, timeout_ms);
  if (st != Status::ok) return st;
  Layout& r = *copy_;
  Slot& s = r.slots[slot_];
  const std::uint64_t bit = std::uint64_t{1} << e;
  if ((s.asked & bit) != 0) {
    s.asked &= ~bit;
    write_failed_ |= !put(s.asked);
    write_failed_ |= !get(r.want[slot_][e]);
    *want = r.want[slot_][e];
    r.want[slot_][e] = 0;
    write_failed_ |= !put(r.want[slot_][e]);
  }
  *pending = s.asked & attached_;
  return end(true);
}

void Region::publish(int e, const Usage& usage, std::uint64_t wait_ns, std::uint32_t flags) {
  if (fd_ < 0 || slot_ < 0 || e < 0 || static_cast<std::size_t>(e) >= kEntries) return;
  copy_->usage[slot_][e] = usage;
  copy_->slots[slot_].wait_ns = wait_ns;
  copy_->slots[slot_].flags = flags;
  put(copy_->usage[slot_][e]);
  put(copy_->slots[slot_].wait_ns);
  put(copy_->slots[slot_].flags);
}

Status Region::set_channel(std::uint64_t channel, unsigned timeout_ms) {
  channel_ = channel;
  const Status st = begin(-1, timeout_ms);  // writes the slot, channel included
  return st == Status::ok ? end(true) : st;
}

std::vector<pid_t> Region::member_pids() const {
  std::vector<pid_t> out;
  if (fd_ < 0 || slot_ < 0 || !copy_) return out;
  for (std::size_t i = 0; i < kSlots; ++i)
    if (static_cast<int>(i) != slot_ && copy_->slots[i].in_use != 0 && copy_->slots[i].pid > 0)
      out.push_back(copy_->slots[i].pid);
  return out;
}

std::uint64_t Region::asked() const {
  if (fd_ < 0 || slot_ < 0) return 0;
  // The header first: bits read from a file that is no region any more are no request.
  Header h{};
  std::uint64_t v = 0;
  const off_t off =
      static_cast<off_t>(offsetof(Layout, slots) + static_cast<std::size_t>(slot_) * sizeof(Slot) +
                         offsetof(Slot, asked));
  if (!pread_full(fd_, &h, sizeof h, 0) || h.magic != kMagic || h.version != kLayoutVersion ||
      h.size != sizeof(Layout) || h.slots != kSlots || h.entries != kEntries)
    return 0;
  return pread_full(fd_, &v, sizeof v, off) ? v & attached_ : 0;
}

}  // namespace allocshim::node
