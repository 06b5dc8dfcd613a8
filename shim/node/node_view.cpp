#include "node/node_view.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>

#include "os/file_io.h"

namespace allocshim::node {
namespace {

std::string why(const std::string& what) { return what + " (" + std::strerror(errno) + ")"; }

std::string uuid_text(const unsigned char (&b)[16]) {
  char s[48];
  std::snprintf(s, sizeof s,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return s;
}

// Whether a process holds slot `i`'s lock; true when that cannot be told.
bool slot_held(int fd, std::size_t i) {
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  l.l_start = kSlotLockBase + static_cast<off_t>(i);
  l.l_len = 1;
  if (::fcntl(fd, F_OFD_GETLK, &l) != 0) return true;
  return l.l_type != F_UNLCK;
}

}  // namespace

RegionView read_region(const std::string& path) {
  RegionView v;
  v.path = path;
  const std::size_t slash = path.rfind('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string prefix = region_prefix(), compute = compute_region_prefix();
  v.compute = name.rfind(compute, 0) == 0;
  v.scope = name.rfind(prefix, 0) == 0 ? name.substr(prefix.size())
            : v.compute                ? name.substr(compute.size())
                                       : name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    v.error = errno == ELOOP ? "a symbolic link: not followed" : why("cannot open it");
    return v;
  }
  struct stat st {};
  std::unique_ptr<Layout> r(new (std::nothrow) Layout);
  if (::fstat(fd, &st) != 0)
    v.error = why("cannot stat it");
  else if (!S_ISREG(st.st_mode))
    v.error = "not a regular file";
  else if (st.st_size != static_cast<off_t>(sizeof(Layout)))
    v.error = "not a budget region of this version (wrong size)";
  else if (!r)
    v.error = "no memory to read it";
  else if (!os::pread_full(fd, r.get(), sizeof(Layout), 0))
    v.error = why("cannot read it");
  else if (r->header.magic != kMagic || r->header.version != kLayoutVersion ||
           r->header.size != sizeof(Layout) || r->header.slots != kSlots ||
           r->header.entries != kEntries)
    v.error = "damaged (its header is not a region's)";
  if (!v.error.empty()) {
    ::close(fd);
    return v;
  }
  for (std::size_t e = 0; e < kEntries; ++e) {
    const Entry& x = r->entries[e];
    if (x.used == 0) continue;
    GpuView g;
    g.entry = static_cast<int>(e);
    g.uuid = uuid_text(x.uuid);
    g.limit = x.limit;
    g.holder = r->slices[e].holder;
    v.gpus.push_back(g);
  }
  for (std::size_t i = 0; i < kSlots; ++i) {
    const Slot& s = r->slots[i];
    if (s.in_use == 0) continue;
    MemberView m;
    m.slot = static_cast<int>(i);
    m.pid = s.pid;
    m.uid = s.uid;
    m.pid_ns = s.pid_ns;
    m.alive = slot_held(fd, i);
    m.wait_ns = s.wait_ns;
    m.asleep = (s.flags & kAsleep) != 0;
    for (std::size_t e = 0; e < kEntries; ++e) {
      if (((s.attached >> e) & 1) == 0 || r->entries[e].used == 0) continue;
      MemberView::Use u;
      u.entry = static_cast<int>(e);
      u.lease = r->lease[e][i];
      u.usage = r->usage[i][e];
      u.demand = r->demand[e][i];
      m.gpus.push_back(u);
    }
    v.members.push_back(std::move(m));
  }
  ::close(fd);
  return v;
}

std::vector<RegionView> read_regions(const std::string& dir) {
  std::vector<RegionView> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    RegionView v;
    v.path = dir;
    v.error = why("cannot list the directory");
    out.push_back(v);
    return out;
  }
  const std::string prefixes[] = {region_prefix(), compute_region_prefix()};
  std::vector<std::string> names[2];
  while (const dirent* e = ::readdir(d))
    for (int k = 0; k < 2; ++k)
      if (std::strncmp(e->d_name, prefixes[k].c_str(), prefixes[k].size()) == 0)
        names[k].push_back(e->d_name);
  ::closedir(d);
  for (auto& kind : names) {
    std::sort(kind.begin(), kind.end());
    for (const std::string& n : kind) out.push_back(read_region(dir + "/" + n));
  }
  return out;
}

}  // namespace allocshim::node
