#include "node_region_fuzz.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "node/node_region.h"

namespace allocshim::node::fuzz {
namespace {

// Input: [flags][op count][fill offset / 8, 2 bytes][ops, 12 bytes each][contents].
// flags bit 0: the file starts as a valid region with the contents written over it at the fill
// offset; otherwise the file is the contents, nothing else.
constexpr std::size_t kHead = 4, kOpSize = 12, kMaxOps = 24;

struct Op {
  std::uint8_t kind, a;
  std::uint16_t b;
  std::uint64_t v;
};

Op op_at(const std::uint8_t* p) {
  Op o{};
  o.kind = p[0];
  o.a = p[1];
  std::memcpy(&o.b, p + 2, sizeof o.b);
  std::memcpy(&o.v, p + 4, sizeof o.v);
  return o;
}

Uuid uuid_of(int device) {
  Uuid u;
  u.bytes[0] = static_cast<unsigned char>(device + 1);
  return u;
}

bool one_line(const std::string& s) { return s.find('\n') == std::string::npos; }

// One member as NodeBudget keeps it: its entries, leases and caps on this side.
struct Member {
  Region region;
  int entry[4] = {-1, -1, -1, -1};
  std::uint64_t lease[4] = {}, cap[4] = {};
};

std::string run(const std::uint8_t* data, std::size_t size, const std::string& path) {
  const Region::Scope scope{0600, static_cast<gid_t>(-1), true};
  std::size_t nops = 0;
  if (size >= kHead)
    nops = std::min<std::size_t>(data[1] % (kMaxOps + 1), (size - kHead) / kOpSize);
  const std::size_t body = size >= kHead ? kHead + nops * kOpSize : size;
  const std::uint8_t* contents = data + body;
  const std::size_t clen = size - body;

  {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return "cannot create the test file";
    bool ok = true;
    if (size >= 1 && (data[0] & 1) != 0) {
      // A valid region with no member, then the contents written over it.
      static const std::unique_ptr<Layout> fresh = [] {
        auto l = std::make_unique<Layout>();
        std::memset(l.get(), 0, sizeof(Layout));
        l->header = Header{kMagic, kLayoutVersion, sizeof(Layout), kSlots, kEntries, {}};
        return l;
      }();
      std::uint16_t at16 = 0;
      if (size >= kHead) std::memcpy(&at16, data + 2, sizeof at16);
      ok = ::pwrite(fd, fresh.get(), sizeof(Layout), 0) == static_cast<ssize_t>(sizeof(Layout)) &&
           (clen == 0 ||
            ::pwrite(fd, contents, clen, off_t{at16} * 8) == static_cast<ssize_t>(clen));
    } else if (clen > 0) {
      ok = ::pwrite(fd, contents, clen, 0) == static_cast<ssize_t>(clen);
    }
    ::close(fd);
    if (!ok) return "cannot write the test file";
  }

  Member m[2];
  std::string error;
  if (!m[0].region.join(path, scope, 0, error) && (error.empty() || !one_line(error)))
    return "join failed without one line of error: [" + error + "]";

  for (std::size_t k = 0; k < nops; ++k) {
    const Op o = op_at(data + kHead + k * kOpSize);
    Member& x = m[(o.a >> 7) & 1];
    const int dev = o.a & 3;
    const int e = x.entry[dev];
    switch (o.kind % 10) {
      case 0: {  // grow, maybe asking
        if (e < 0) break;
        Region::Grow g{};
        const std::uint64_t before = x.lease[dev];
        const std::uint64_t need = o.v >> (o.b % 64);
        const Status st =
            x.region.grow(e, before, need, need, x.cap[dev], (o.b & 0x100) != 0, 0, &g);
        if (st == Status::ok) {
          if (g.lease < before) return "grow shrank the lease";
          if (g.lease > before && g.lease > x.cap[dev]) return "grow leased more than the cap";
          x.lease[dev] = g.lease;
        } else if (g.lease != before) {
          return "a failed grow changed the lease";
        }
        break;
      }
      case 1:  // settle
        if (e >= 0 && x.region.set_lease(e, o.v, 0) == Status::ok) x.lease[dev] = o.v;
        break;
      case 2: {  // room
        if (e < 0) break;
        std::uint64_t room = 0;
        if (x.region.room(e, x.cap[dev], 0, &room) == Status::ok && room > x.cap[dev])
          return "room above the cap";
        break;
      }
      case 3: {  // take a request
        if (e < 0) break;
        std::uint64_t want = 0, pending = 0;
        x.region.take_request(e, 0, &want, &pending);
        break;
      }
      case 4: (void)x.region.asked(); break;
      case 5: {  // another process writes 8 bytes anywhere (past the end too)
        const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0) {
          (void)!::pwrite(fd, &o.v, sizeof o.v, off_t{o.b} * 8 + (o.a & 7));
          ::close(fd);
        }
        break;
      }
      case 6:  // another process cuts or extends the file
        (void)!::truncate(path.c_str(), static_cast<off_t>(o.v % (sizeof(Layout) + 4096)));
        break;
      case 7: {  // attach
        int entry = -1;
        std::uint64_t limit = 0;
        const std::uint64_t mine = o.v;
        if (x.region.attach(uuid_of(dev), mine, 0, &entry, &limit) == Status::ok && entry >= 0) {
          if (entry >= static_cast<int>(kEntries)) return "attach gave an entry out of range";
          x.entry[dev] = entry;
          x.cap[dev] = std::min(limit, mine);
        }
        break;
      }
      case 8:  // the second member joins or leaves
        if (m[1].region.joined()) {
          m[1].region.leave();
          std::fill(std::begin(m[1].entry), std::end(m[1].entry), -1);
          std::fill(std::begin(m[1].lease), std::end(m[1].lease), 0);
        } else if (!m[1].region.join(path, scope, 0, error) &&
                   (error.empty() || !one_line(error))) {
          return "join failed without one line of error: [" + error + "]";
        }
        break;
      case 9:  // the first member leaves and joins again
        m[0].region.leave();
        std::fill(std::begin(m[0].entry), std::end(m[0].entry), -1);
        std::fill(std::begin(m[0].lease), std::end(m[0].lease), 0);
        if (!m[0].region.join(path, scope, 0, error) && (error.empty() || !one_line(error)))
          return "join failed without one line of error: [" + error + "]";
        break;
    }
  }
  return "";
}

}  // namespace

std::string check_input(const std::uint8_t* data, std::size_t size, const std::string& dir) {
  const std::string path = dir + "/region";
  // The members leave at the end of run(); the file goes with the last one, or here.
  const std::string failure = run(data, size, path);
  ::unlink(path.c_str());
  return failure;
}

}  // namespace allocshim::node::fuzz
