// A read-only view of the shared budgets' regions, and of the compute slices' (node/compute_share.h),
// for the people who run the node (allocshim top, its metrics): what each scope's file says of
// each GPU and each member. Read with the same
// distrust as a member reads it (node_region.h): the file is opened without following links and
// without blocking, its size and header are checked, and every value is a number that is shown,
// never used as a pointer, an index or a size. It is never locked or written, so a view cannot
// delay a member; a value a member is writing meanwhile may be shown half old.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "node/node_region.h"

namespace allocshim::node {

struct GpuView {
  int entry = -1;
  std::string uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi writes it
  std::uint64_t limit = 0;
  int holder = -1;  // compute regions: the slot whose slice of the GPU's time it is
};

struct MemberView {
  int slot = -1;
  pid_t pid = 0;             // in the member's own PID namespace
  std::uint64_t pid_ns = 0;  // that namespace's inode (0: unknown)
  uid_t uid = 0;
  bool alive = true;          // its slot lock is held (false: dead, the next member reclaims it)
  std::uint64_t wait_ns = 0;  // waited for room, in all
  bool asleep = false;        // put to sleep (allocshim ctl, idle_sleep_ms)
  struct Use {
    int entry = -1;
    std::uint64_t lease = 0;
    Usage usage{};
    Demand demand{};  // compute regions: what it wants of the GPU's time
  };
  std::vector<Use> gpus;  // the entries it is attached to
};

struct RegionView {
  std::string path;
  std::string scope;     // the name's end: "u<uid>", "g<gid>" or "all"
  bool compute = false;  // a region of compute slices (its members' leases and usage are 0)
  std::string error;     // why it could not be read; nothing else is set then
  std::vector<GpuView> gpus;
  std::vector<MemberView> members;
};

// Reads the region at `path` once.
RegionView read_region(const std::string& path);
// Every region of this layout in `dir` (names beginning with region_prefix(), then those beginning
// with compute_region_prefix()), each kind sorted by name; a directory that cannot be read gives
// one view with its error.
std::vector<RegionView> read_regions(const std::string& dir);

}  // namespace allocshim::node
