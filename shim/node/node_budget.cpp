#include "node/node_budget.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/clock.h"
#include "base/log.h"
#include "base/peak.h"
#include "os/env.h"
#include "os/fork_registry.h"

namespace allocshim {
namespace {

// The region lock is held for microseconds; waiting longer means a process does not let it go.
constexpr unsigned kMutexTimeoutMs = 1000;
constexpr long kFirstPauseNs = 20000;  // the first pause between tries of the region lock

const char* share_text(policy::Budget::Share s) {
  switch (s) {
    case policy::Budget::Share::process: return "process";
    case policy::Budget::Share::user: return "user";
    case policy::Budget::Share::group: return "group";
    case policy::Budget::Share::device: return "device";
  }
  return "?";
}

std::string human(std::uint64_t b) {
  char buf[32];
  if (b >= (std::uint64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(b) / (1 << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}

}  // namespace

NodeBudget::NodeBudget(const Driver& driver) : driver_(driver) {
  os::ForkRegistry<NodeBudget>::track(this);
}

NodeBudget::~NodeBudget() {
  os::ForkRegistry<NodeBudget>::untrack(this);
  leave();
}

// Under mutex_: stops reading the region and forgets every lease (the region's side is left by
// the caller).
void NodeBudget::forget_region() {
  polling_.store(false, std::memory_order_relaxed);
  asked_bits_.store(0, std::memory_order_relaxed);
  for (Local& l : local_) {
    l.entry.store(-1, std::memory_order_relaxed);
    l.lease.store(0, std::memory_order_relaxed);
    l.cap.store(0, std::memory_order_relaxed);
  }
}

void NodeBudget::configure(Share share, std::uint32_t wait_ms) {
  node::Region old;
  {
    std::lock_guard lock(mutex_);
    wait_ms_.store(wait_ms, std::memory_order_relaxed);
    if (share == share_) return;
    forget_region();
    region_.swap(old);
    ++generation_;
    share_ = share;
    join_error_.clear();
    active_.store(share != Share::process && !closed_, std::memory_order_relaxed);
  }
  // A reload runs under the core's and the budget's locks: the old region is left with one try of
  // its lock, and if another process holds it the next member reclaims this slot instead.
  old.leave(0);
}

bool NodeBudget::join() {
  Share share;
  std::uint64_t generation;
  {
    std::lock_guard lock(mutex_);
    if (!active() || closed_ || !join_error_.empty()) return false;
    if (region_.joined()) return true;
    share = share_;
    generation = generation_;
  }
  std::string path = node::share_dir() + "/" + node::region_prefix();
  node::Region::Scope scope{0600, static_cast<gid_t>(-1), false};
  switch (share) {
    case Share::user:
      path += "u" + std::to_string(::geteuid());
      scope.per_user = true;
      break;
    case Share::group:
      scope.group = ::getegid();
      path += "g" + std::to_string(scope.group);
      scope.mode = 0660;
      break;
    case Share::device:
      path += "all";
      scope.mode = 0666;
      break;
    case Share::process: return false;
  }
  // Joined on a region of its own, without mutex_: the join may wait for the region lock.
  node::Region fresh;
  joining_.store(&fresh, std::memory_order_release);
  struct Joined {
    std::atomic<node::Region*>& joining;
    ~Joined() { joining.store(nullptr, std::memory_order_release); }  // before fresh is gone
  } joined{joining_};
  std::string error;
  const bool ok = fresh.join(path, scope, kMutexTimeoutMs, error);
  // Listening before mutex_ is taken: the channel's lock is held while its callers take the spill
  // target's, which takes mutex_ (a promotion claiming room), so it is never taken under mutex_.
  // Without a name nobody passes this process host pieces: it pins.
  const std::uint64_t channel = ok && pieces_.listen() ? pieces_.channel() : 0;
  std::lock_guard lock(mutex_);
  if (generation != generation_) return false;  // reconfigured or left meanwhile: fresh is left
  if (!ok) {
    join_error_ = error.empty() ? "cannot join " + path : error;
    log::write(log::Level::error,
               "budget share = \"%s\": %s; this process keeps a budget of its own",
               share_text(share_), join_error_.c_str());
    return false;
  }
  region_.swap(fresh);
  path_ = region_.path();
  const std::uint64_t probe = std::uint64_t{1} << 30;
  const std::uint64_t ns = std::max<std::uint64_t>(clock::to_ns(probe), 1);
  poll_ticks_ =
      static_cast<std::uint64_t>(static_cast<double>(probe) * kPollNs / static_cast<double>(ns));
  next_poll_.store(0, std::memory_order_relaxed);
  polling_.store(true, std::memory_order_release);
  // The name's random part is published in this member's slot, where takers read it.
  if (channel != 0) region_.set_channel(channel, kMutexTimeoutMs);
  return true;
}

void NodeBudget::poll() const {
  // A try: a thread in a slow path has the mutex for microseconds, and asked() must never wait.
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  next_poll_.store(clock::ticks() + poll_ticks_, std::memory_order_relaxed);
  asked_bits_.store(region_.asked(), std::memory_order_relaxed);
  const std::uint64_t now = clock::now_ns();
  if (!usage_source_ || now < next_publish_ns_) return;
  next_publish_ns_ = now + node::kPublishNs;
  std::uint64_t wait_ns = 0;
  for (const Local& l : local_) wait_ns += l.wait_ns.load(std::memory_order_relaxed);
  for (std::size_t d = 0; d < kMaxDevices; ++d) {
    const int e = local_[d].entry.load(std::memory_order_relaxed);
    if (e >= 0)
      region_.publish(e, usage_source_(static_cast<int>(d)), wait_ns,
                      asleep_.load(std::memory_order_relaxed) ? node::kAsleep : 0);
  }
}

void NodeBudget::set_asleep(bool on) {
  asleep_.store(on, std::memory_order_relaxed);
  std::lock_guard lock(mutex_);
  next_publish_ns_ = 0;  // views see it at the next poll
  next_poll_.store(0, std::memory_order_relaxed);
}

void NodeBudget::count_dead() const {
  if (region_.dead_processes == 0 && region_.dead_bytes == 0) return;
  // Saturating: these count what other processes' slots said, which a scribble can make anything.
  const auto add = [](std::atomic<std::uint64_t>& to, std::uint64_t v) {
    const std::uint64_t now = to.load(std::memory_order_relaxed);
    to.store(now + v < now ? ~std::uint64_t{0} : now + v, std::memory_order_relaxed);
  };
  add(reclaimed_processes_, region_.dead_processes);
  add(reclaimed_bytes_, region_.dead_bytes);
  region_.dead_processes = region_.dead_bytes = 0;
}

node::Status NodeBudget::with_region(bool patient, node::Status (*op)(void*), void* ctx) const {
  // Once the lock was not released in time, operations try it once until it is had again: a
  // process that holds it for good costs others one wait, not one per slow path.
  const bool wait = patient && !stuck_.load(std::memory_order_relaxed);
  const std::uint64_t deadline =
      clock::now_ns() + (wait ? std::uint64_t{kMutexTimeoutMs} * 1000000u : 0);
  for (long pause = kFirstPauseNs;; pause = std::min(pause * 2, static_cast<long>(kPollNs))) {
    {
      std::lock_guard lock(mutex_);
      const node::Status st = op(ctx);
      count_dead();
      if (st == node::Status::ok) {
        stuck_.store(false, std::memory_order_relaxed);
        return st;
      }
      if (st == node::Status::damaged) {
        damaged_.fetch_add(1, std::memory_order_relaxed);
        if (!said_damaged_.exchange(true, std::memory_order_relaxed))
          log::write(
              log::Level::error,
              "budget share: %s is damaged or gone (another process wrote, cut or removed it); this "
              "process keeps the lease it has and takes no more: past it, allocations spill or are refused",
              region_.path().c_str());
      }
      if (st != node::Status::busy) return st;
    }
    const std::uint64_t now = clock::now_ns();
    if (now >= deadline) break;
    const timespec t{0, static_cast<long>(std::min<std::uint64_t>(static_cast<std::uint64_t>(pause),
                                                                  deadline - now))};
    ::nanosleep(&t, nullptr);
  }
  lock_timeouts_.fetch_add(1, std::memory_order_relaxed);
  if (patient) stuck_.store(true, std::memory_order_relaxed);
  if (patient && !said_stuck_.exchange(true, std::memory_order_relaxed)) {
    std::lock_guard lock(mutex_);  // the path changes under it
    log::write(
        log::Level::error,
        "budget share: the lock of %s was not released within %u ms (another process holds it); until it "
        "is, this process keeps the lease it has and takes no more: past it, allocations spill or are refused",
        region_.path().c_str(), kMutexTimeoutMs);
  }
  return node::Status::busy;
}

std::uint64_t NodeBudget::attach(int device, std::uint64_t mine) {
  {
    std::lock_guard lock(join_mutex_);
    if (!join()) return mine;
  }
  Local& l = at(device);
  node::Uuid uuid;
  if (!driver_.device_get_uuid || driver_.device_get_uuid(uuid.bytes, device) != res::ok) {
    // Without a UUID the ordinal stands in: processes must then see the same devices in the
    // same order (the same CUDA_VISIBLE_DEVICES).
    std::snprintf(reinterpret_cast<char*>(uuid.bytes), sizeof uuid.bytes, "ordinal %d", device);
  }
  int e = -1;
  std::uint64_t limit = mine;
  const node::Status st = with_region(true, [&] {
    const node::Status s = region_.attach(uuid, mine, 0, &e, &limit);
    if (s == node::Status::ok && e >= 0) {
      // The shared limit is a number another process wrote: never more than this policy's own.
      l.cap.store(std::min(limit, mine), std::memory_order_relaxed);
      l.entry.store(e, std::memory_order_relaxed);
    }
    return s;
  });
  std::lock_guard lock(mutex_);  // the path changes under it
  if (st != node::Status::ok) {
    if (st != node::Status::closed)
      log::write(
          log::Level::error, "budget share: %s %s; device %d keeps a budget of its own",
          region_.path().c_str(),
          st == node::Status::busy ? "has a lock another process does not release" : "is damaged",
          device);
    return mine;
  }
  if (e < 0) {
    log::write(log::Level::error,
               "budget share: %s holds %zu GPUs already; device %d keeps a budget of its own",
               region_.path().c_str(), node::kEntries, device);
    return mine;
  }
  const std::uint64_t in_force = std::min(limit, mine);
  if (limit != mine)
    log::write(log::Level::warn,
               "budget of device %d shared through %s: its limit is %" PRIu64
               " bytes, set by the first process using it (this policy says %" PRIu64
               "); this process uses %" PRIu64,
               device, region_.path().c_str(), limit, mine, in_force);
  return in_force;
}

void NodeBudget::leave() {
  node::Region old;  // left after mutex_ is released (declared first, destroyed last)
  {
    std::lock_guard lock(mutex_);
    forget_region();
    region_.swap(old);
    ++generation_;
    closed_ = true;
    active_.store(false, std::memory_order_relaxed);
  }
  pieces_.close();
  // Waits for the region lock (another process's) holding nothing other threads need: their
  // frees, cuMemGetInfo and safe points find nothing shared any more and go on.
  old.leave();
}

void NodeBudget::forget_after_fork() {
  // The child is single-threaded here; the parent may have held either mutex at fork.
  new (&mutex_) std::mutex;
  new (&join_mutex_) std::mutex;
  region_.forget_after_fork();
  pieces_.forget_after_fork();
  if (node::Region* r = joining_.exchange(nullptr, std::memory_order_acquire))
    r->forget_after_fork();
  forget_region();
  join_error_.clear();
}

std::string NodeBudget::summary() const {
  if (share_ == Share::process) return {};
  std::string out;
  const std::string where = path_.empty() ? std::string("not joined") : path_;
  for (int dev = 0; dev < static_cast<int>(kMaxDevices); ++dev) {
    const Local& l = at(dev);
    const std::uint64_t peak = l.peak_lease.load(std::memory_order_relaxed);
    if (peak == 0 && l.requests.load(std::memory_order_relaxed) == 0) continue;
    out += "  budget device " + std::to_string(dev) + " shared per " + share_text(share_) + " (" +
           where + "): lease peak " + human(peak) + " in " +
           std::to_string(l.grows.load(std::memory_order_relaxed)) + " grows; asked others " +
           std::to_string(l.asks.load(std::memory_order_relaxed)) + " times, waited " +
           std::to_string(l.waits.load(std::memory_order_relaxed)) + " times (" +
           std::to_string(l.wait_ns.load(std::memory_order_relaxed) / 1000000) + " ms), " +
           std::to_string(l.timeouts.load(std::memory_order_relaxed)) +
           " timed out; asked by others " +
           std::to_string(l.requests.load(std::memory_order_relaxed)) + " times, gave back " +
           human(l.given.load(std::memory_order_relaxed)) + "; host pieces passed " +
           human(l.pieces_sent.load(std::memory_order_relaxed)) + " out, " +
           human(l.pieces_received.load(std::memory_order_relaxed)) + " in\n";
  }
  const std::uint64_t dead = reclaimed_processes_.load(std::memory_order_relaxed);
  if (dead != 0)
    out += "  budget share: reclaimed the leases of " + std::to_string(dead) + " dead processes (" +
           human(reclaimed_bytes_.load(std::memory_order_relaxed)) + ")\n";
  const std::uint64_t timeouts = lock_timeouts(), bad = damaged();
  if (timeouts != 0 || bad != 0)
    out += "  budget share: the region's lock was not released " + std::to_string(timeouts) +
           " times, the region found damaged " + std::to_string(bad) + " times\n";
  if (!join_error_.empty()) out += "  budget share: not shared (" + join_error_ + ")\n";
  return out;
}

const char* NodeBudget::share_name() const { return share_text(share_); }

std::vector<NodeBudget::DeviceReport> NodeBudget::device_reports() const {
  std::vector<DeviceReport> out;
  for (int dev = 0; dev < static_cast<int>(kMaxDevices); ++dev) {
    const Local& l = at(dev);
    const auto get = [](const std::atomic<std::uint64_t>& a) {
      return a.load(std::memory_order_relaxed);
    };
    if (get(l.peak_lease) == 0 && get(l.requests) == 0) continue;
    out.push_back(DeviceReport{dev, get(l.lease), get(l.peak_lease), get(l.grows), get(l.asks),
                               get(l.waits), get(l.wait_ns), get(l.timeouts), get(l.requests),
                               get(l.given), get(l.pieces_sent), get(l.pieces_received)});
  }
  return out;
}

}  // namespace allocshim
