#include "core/node_budget.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/clock.h"
#include "core/log.h"

namespace allocshim {
namespace {

// The region's mutex is held for microseconds; waiting longer means a member is wedged.
constexpr unsigned kMutexTimeoutMs = 1000;
constexpr long kPollNs = 1000000;  // how often a waiting request looks at the node again

const char* share_text(policy::Budget::Share s) {
  switch (s) {
    case policy::Budget::Share::process: return "process";
    case policy::Budget::Share::user: return "user";
    case policy::Budget::Share::group: return "group";
    case policy::Budget::Share::device: return "device";
  }
  return "?";
}

std::uint64_t round_up(std::uint64_t v, std::uint64_t unit) { return (v + unit - 1) / unit * unit; }

void note_max(std::atomic<std::uint64_t>& a, std::uint64_t v) {
  std::uint64_t cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

std::string human(std::uint64_t b) {
  char buf[32];
  if (b >= (std::uint64_t{1} << 30)) std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(b) / (1 << 30));
  else std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}

// Forked children must not keep the parent's open file description of a region (its slot would
// look alive as long as the child lives): every NodeBudget is forgotten in the child.
constexpr std::size_t kTracked = 16;
std::atomic<NodeBudget*> g_tracked[kTracked];
void forget_all_in_child() {
  for (auto& t : g_tracked)
    if (NodeBudget* n = t.load(std::memory_order_relaxed)) n->forget_after_fork();
}
void track(NodeBudget* n) {
  static const int registered = pthread_atfork(nullptr, nullptr, forget_all_in_child);
  (void)registered;
  for (auto& t : g_tracked) {
    NodeBudget* expected = nullptr;
    if (t.compare_exchange_strong(expected, n)) return;
  }
}
void untrack(NodeBudget* n) {
  for (auto& t : g_tracked) {
    NodeBudget* expected = n;
    if (t.compare_exchange_strong(expected, nullptr)) return;
  }
}

}  // namespace

NodeBudget::NodeBudget(const Driver& driver) : driver_(driver) { track(this); }

NodeBudget::~NodeBudget() {
  untrack(this);
  leave();
}

void NodeBudget::configure(Share share, std::uint32_t wait_ms) {
  std::lock_guard lock(mutex_);
  wait_ms_ = wait_ms;
  if (share == share_) return;
  region_.leave();
  slot_asked_.store(nullptr, std::memory_order_relaxed);
  for (Local& l : local_) {
    l.entry.store(-1, std::memory_order_relaxed);
    l.lease.store(0, std::memory_order_relaxed);
  }
  share_ = share;
  join_error_.clear();
  active_.store(share != Share::process && !closed_, std::memory_order_relaxed);
}

bool NodeBudget::join_locked() {
  if (region_.joined()) return true;
  if (!join_error_.empty() || closed_) return false;
  const char* dir = std::getenv("ALLOCSHIM_SHARE_DIR");
  std::string path = dir && *dir ? dir : "/dev/shm";
  path += "/allocshim-budget-v" + std::to_string(node::kLayoutVersion) + "-";
  mode_t mode = 0600;
  gid_t group = static_cast<gid_t>(-1);
  switch (share_) {
    case Share::user: path += "u" + std::to_string(::geteuid()); break;
    case Share::group:
      group = ::getegid();
      path += "g" + std::to_string(group);
      mode = 0660;
      break;
    case Share::device:
      path += "all";
      mode = 0666;
      break;
    case Share::process: return false;
  }
  if (!region_.join(path, mode, group, join_error_)) {
    if (join_error_.empty()) join_error_ = "cannot join " + path;
    log::write(log::Level::error, "budget share = \"%s\": %s; this process keeps a budget of its own",
               share_text(share_), join_error_.c_str());
    return false;
  }
  slot_asked_.store(&region_.mine().asked, std::memory_order_release);
  return true;
}

std::uint64_t NodeBudget::attach(int device, std::uint64_t mine) {
  std::lock_guard lock(mutex_);
  Local& l = at(device);
  if (!active() || !join_locked()) return mine;
  node::Uuid uuid;
  if (!driver_.device_get_uuid || driver_.device_get_uuid(uuid.bytes, device) != res::ok) {
    // Without a UUID the ordinal stands in: processes must then see the same devices in the
    // same order (the same CUDA_VISIBLE_DEVICES).
    std::snprintf(reinterpret_cast<char*>(uuid.bytes), sizeof uuid.bytes, "ordinal %d", device);
  }
  if (!region_.lock(kMutexTimeoutMs)) {
    log::write(log::Level::error, "budget share: the region's mutex is not released; device %d keeps a budget of its own", device);
    return mine;
  }
  std::uint64_t dead = 0;
  reclaimed_bytes_.fetch_add(region_.reclaim(&dead), std::memory_order_relaxed);
  reclaimed_processes_.fetch_add(dead, std::memory_order_relaxed);
  const int e = region_.attach(uuid, mine);
  const std::uint64_t limit = e >= 0 ? region_.layout().entries[e].limit.load(std::memory_order_relaxed) : mine;
  region_.unlock();
  if (e < 0) {
    log::write(log::Level::error, "budget share: %s holds %zu GPUs already; device %d keeps a budget of its own",
               region_.path().c_str(), node::kEntries, device);
    return mine;
  }
  if (limit != mine)
    log::write(log::Level::warn, "budget of device %d shared through %s: its limit is %" PRIu64
               " bytes, set by the first process using it (this policy says %" PRIu64 ")",
               device, region_.path().c_str(), limit, mine);
  l.entry.store(e, std::memory_order_relaxed);
  return limit;
}

void NodeBudget::set_lease(Local& l, std::uint64_t bytes) {
  region_.mine().lease[l.entry.load(std::memory_order_relaxed)].store(bytes, std::memory_order_relaxed);
  l.lease.store(bytes, std::memory_order_relaxed);
  note_max(l.peak_lease, bytes);
}

void NodeBudget::ask(Local& l, int e, std::uint64_t bytes) {
  node::Layout& r = region_.layout();
  const std::uint64_t bit = std::uint64_t{1} << e;
  for (std::size_t i = 0; i < node::kSlots && bytes > 0; ++i) {
    if (static_cast<int>(i) == region_.slot()) continue;
    node::Slot& s = r.slots[i];
    const std::uint64_t held = s.lease[e].load(std::memory_order_relaxed);
    if (s.in_use.load(std::memory_order_acquire) == 0 || held == 0) continue;
    const std::uint64_t want = std::min(held, bytes);
    note_max(s.want[e], want);
    if ((s.asked.fetch_or(bit, std::memory_order_release) & bit) == 0)
      l.asks.fetch_add(1, std::memory_order_relaxed);
    bytes -= want;
  }
}

std::uint64_t NodeBudget::grow(int device, std::uint64_t bytes, bool wait, bool ask_others) {
  std::lock_guard lock(mutex_);
  Local& l = at(device);
  if (l.entry.load(std::memory_order_relaxed) < 0 || !region_.joined()) return ~std::uint64_t{0};
  const std::uint64_t t0 = clock::ticks();
  bool waited = false;
  for (;;) {
    std::uint64_t lease = l.lease.load(std::memory_order_relaxed);
    if (bytes <= lease) break;
    if (!region_.lock(kMutexTimeoutMs)) break;  // a wedged member: spill rather than hang
    std::uint64_t dead = 0;
    reclaimed_bytes_.fetch_add(region_.reclaim(&dead), std::memory_order_relaxed);
    reclaimed_processes_.fetch_add(dead, std::memory_order_relaxed);
    const int e = l.entry.load(std::memory_order_relaxed);
    const node::Layout& r = region_.layout();
    const std::uint64_t limit = r.entries[e].limit.load(std::memory_order_relaxed);
    std::uint64_t others = 0;
    for (std::size_t i = 0; i < node::kSlots; ++i)
      if (static_cast<int>(i) != region_.slot()) others += r.slots[i].lease[e].load(std::memory_order_relaxed);
    const std::uint64_t room = limit > others ? limit - others : 0;
    const std::uint64_t target = std::max(lease, std::min(round_up(bytes, kLeaseUnit), room));
    if (target != lease) {
      set_lease(l, target);
      l.grows.fetch_add(1, std::memory_order_relaxed);
    }
    // Once per call: asking again while a member is still demoting for the first ask would have
    // it give the same room twice.
    if (target < bytes && ask_others && !waited) ask(l, e, bytes - target);
    region_.unlock();
    if (target >= bytes || !wait || wait_ms_ == 0) break;
    if (clock::to_ns(clock::ticks() - t0) >= std::uint64_t{wait_ms_} * 1000000u) {
      l.timeouts.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    waited = true;
    const timespec pause{0, kPollNs};
    ::nanosleep(&pause, nullptr);
  }
  if (waited) {
    l.waits.fetch_add(1, std::memory_order_relaxed);
    l.wait_ns.fetch_add(clock::to_ns(clock::ticks() - t0), std::memory_order_relaxed);
  }
  return l.lease.load(std::memory_order_relaxed);
}

void NodeBudget::settle(int device, std::uint64_t backed, std::uint64_t keep) {
  Local& l = at(device);
  if (l.entry.load(std::memory_order_relaxed) < 0) return;
  const std::uint64_t target = round_up(backed, kLeaseUnit);
  if (l.lease.load(std::memory_order_relaxed) < target + std::max<std::uint64_t>(keep, 1)) return;
  std::lock_guard lock(mutex_);
  if (!region_.joined() || l.lease.load(std::memory_order_relaxed) <= target || !region_.lock(kMutexTimeoutMs))
    return;
  set_lease(l, target);
  region_.unlock();
}

std::uint64_t NodeBudget::room(int device) const {
  const int e = at(device).entry.load(std::memory_order_relaxed);
  if (e < 0) return ~std::uint64_t{0};
  std::lock_guard lock(mutex_);
  if (!region_.joined()) return ~std::uint64_t{0};
  const node::Layout& r = region_.layout();
  const std::uint64_t limit = r.entries[e].limit.load(std::memory_order_relaxed);
  std::uint64_t others = 0;
  for (std::size_t i = 0; i < node::kSlots; ++i) {
    if (static_cast<int>(i) == region_.slot() || r.slots[i].in_use.load(std::memory_order_acquire) == 0) continue;
    const std::uint64_t held = r.slots[i].lease[e].load(std::memory_order_relaxed);
    // A dead member's lease is not room taken (the next slow path reclaims it).
    if (held != 0 && region_.alive(i)) others += held;
  }
  return limit > others ? limit - others : 0;
}

void NodeBudget::on_given(int device, std::uint64_t bytes, bool demoted) {
  if (bytes == 0) return;
  Local& l = at(device);
  l.given.fetch_add(bytes, std::memory_order_relaxed);
  if (demoted) l.yielded_ticks.store(clock::ticks(), std::memory_order_relaxed);
}

void NodeBudget::on_busy(int device) {
  Local& l = at(device);
  if (l.yielded_ticks.load(std::memory_order_relaxed) != 0) l.yielded_ticks.store(0, std::memory_order_relaxed);
}

bool NodeBudget::holding(int device) const {
  const std::uint64_t t = at(device).yielded_ticks.load(std::memory_order_relaxed);
  return t != 0 && clock::to_ns(clock::ticks() - t) < kYieldHoldMs * 1000000u;
}

std::uint64_t NodeBudget::take_request(int device) {
  Local& l = at(device);
  const int e = l.entry.load(std::memory_order_relaxed);
  if (e < 0 || slot_asked_.load(std::memory_order_relaxed) == nullptr) return 0;
  std::lock_guard lock(mutex_);
  if (!region_.joined()) return 0;
  node::Slot& s = region_.mine();
  const std::uint64_t bit = std::uint64_t{1} << e;
  if ((s.asked.fetch_and(~bit, std::memory_order_acquire) & bit) == 0) return 0;
  l.requests.fetch_add(1, std::memory_order_relaxed);
  return s.want[e].exchange(0, std::memory_order_relaxed);
}

void NodeBudget::leave() {
  std::lock_guard lock(mutex_);
  region_.leave();
  slot_asked_.store(nullptr, std::memory_order_relaxed);
  closed_ = true;
  active_.store(false, std::memory_order_relaxed);
  for (Local& l : local_) l.entry.store(-1, std::memory_order_relaxed);
}

void NodeBudget::forget_after_fork() {
  // The child is single-threaded here; the parent may have held mutex_ at fork.
  new (&mutex_) std::mutex;
  region_.forget_after_fork();
  slot_asked_.store(nullptr, std::memory_order_relaxed);
  for (Local& l : local_) {
    l.entry.store(-1, std::memory_order_relaxed);
    l.lease.store(0, std::memory_order_relaxed);
  }
  join_error_.clear();
}

std::string NodeBudget::summary() const {
  if (share_ == Share::process) return {};
  std::string out;
  const std::string where = region_.path().empty() ? std::string("not joined") : region_.path();
  for (int dev = 0; dev < static_cast<int>(kMaxDevices); ++dev) {
    const Local& l = at(dev);
    const std::uint64_t peak = l.peak_lease.load(std::memory_order_relaxed);
    if (peak == 0 && l.requests.load(std::memory_order_relaxed) == 0) continue;
    out += "  budget device " + std::to_string(dev) + " shared per " + share_text(share_) + " (" + where +
           "): lease peak " + human(peak) + " in " + std::to_string(l.grows.load(std::memory_order_relaxed)) +
           " grows; asked others " + std::to_string(l.asks.load(std::memory_order_relaxed)) + " times, waited " +
           std::to_string(l.waits.load(std::memory_order_relaxed)) + " times (" +
           std::to_string(l.wait_ns.load(std::memory_order_relaxed) / 1000000) + " ms), " +
           std::to_string(l.timeouts.load(std::memory_order_relaxed)) + " timed out; asked by others " +
           std::to_string(l.requests.load(std::memory_order_relaxed)) + " times, gave back " +
           human(l.given.load(std::memory_order_relaxed)) + "\n";
  }
  const std::uint64_t dead = reclaimed_processes_.load(std::memory_order_relaxed);
  if (dead != 0)
    out += "  budget share: reclaimed the leases of " + std::to_string(dead) + " dead processes (" +
           human(reclaimed_bytes_.load(std::memory_order_relaxed)) + ")\n";
  if (!join_error_.empty()) out += "  budget share: not shared (" + join_error_ + ")\n";
  return out;
}

const char* NodeBudget::share_name() const { return share_text(share_); }

std::vector<NodeBudget::DeviceReport> NodeBudget::device_reports() const {
  std::vector<DeviceReport> out;
  for (int dev = 0; dev < static_cast<int>(kMaxDevices); ++dev) {
    const Local& l = at(dev);
    const auto get = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
    if (get(l.peak_lease) == 0 && get(l.requests) == 0) continue;
    out.push_back(DeviceReport{dev, get(l.lease), get(l.peak_lease), get(l.grows), get(l.asks), get(l.waits),
                               get(l.wait_ns), get(l.timeouts), get(l.requests), get(l.given)});
  }
  return out;
}

}  // namespace allocshim
