// The region's GPU time slices (node/compute_share.h): each member's demand of a GPU's time, and
// whose slice it is. Demands are written without the region lock (each member writes only its
// own); a slice changes hands under the lock, and only from the sequence number its hander saw.
#include <cstddef>

#include "node/node_region.h"
#include "os/file_io.h"

namespace allocshim::node {
namespace {

bool in_range(int e) { return e >= 0 && static_cast<std::size_t>(e) < kEntries; }

template <class T>
off_t offset_in(const Layout& base, const T& field) {
  return reinterpret_cast<const char*>(&field) - reinterpret_cast<const char*>(&base);
}

}  // namespace

void Region::publish_demand(int e, const Demand& demand) {
  if (fd_ < 0 || slot_ < 0 || !in_range(e)) return;
  Demand& mine = copy_->demand[e][slot_];
  mine = demand;
  os::pwrite_full(fd_, &mine, sizeof mine, offset_in(*copy_, mine));
}

bool Region::read_slices(int e, Slice* slice, Demand (&demand)[kSlots]) const {
  if (fd_ < 0 || slot_ < 0 || !in_range(e)) return false;
  // The header first: numbers read from a file that is no region any more mean nothing.
  Header h{};
  if (!os::pread_full(fd_, &h, sizeof h, 0) || h.magic != kMagic || h.version != kLayoutVersion ||
      h.size != sizeof(Layout) || h.slots != kSlots || h.entries != kEntries)
    return false;
  return os::pread_full(fd_, slice, sizeof *slice, offset_in(*copy_, copy_->slices[e])) &&
         os::pread_full(fd_, demand, sizeof demand, offset_in(*copy_, copy_->demand[e]));
}

Status Region::hand_slice(int e, std::uint32_t seen_seq, int to, std::uint64_t start_ns,
                          std::uint64_t round_ns, unsigned timeout_ms, bool* handed) {
  *handed = false;
  const Status st = begin_entry(e, timeout_ms);
  if (st != Status::ok) return st;
  Slice& s = copy_->slices[e];
  if (!os::pread_full(fd_, &s, sizeof s, offset_in(*copy_, s))) return end(false);
  if (s.seq == seen_seq) {
    s.holder = to;
    s.seq = seen_seq + 1;
    s.start_ns = start_ns;
    s.round_ns = round_ns;
    write_failed_ |= !os::pwrite_full(fd_, &s, sizeof s, offset_in(*copy_, s));
    *handed = true;
  }
  return end(true);
}

}  // namespace allocshim::node
