#include "node/compute_share.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "base/clock.h"
#include "base/launch_gate.h"
#include "base/log.h"
#include "os/fork_registry.h"
#include "os/thread.h"

namespace allocshim {
namespace {

constexpr unsigned kRegionWaitMs = 200;  // how long a hand-over waits for the region lock
constexpr std::uint32_t kWhole = 1000;   // thousandths

int num(std::uint32_t priority) { return static_cast<int>(std::min<std::uint32_t>(priority, 2)); }

}  // namespace

// Runs the process's drain on a thread of its own, so that the slicing thread waits for it only
// until a deadline: work that waits for another process's (a kernel polling memory the next slice's
// holder writes) must not keep the slice from being handed on.
class ComputeShare::Drainer {
 public:
  explicit Drainer(std::function<void()> drain) : state_(std::make_shared<State>()) {
    state_->drain = std::move(drain);
  }
  ~Drainer() {
    {
      std::lock_guard lock(state_->mutex);
      state_->stop = true;
    }
    state_->cv.notify_all();
    if (!thread_.joinable()) return;
    // A drain stuck in the driver is left to finish on its own: the state outlives this object.
    std::unique_lock lock(state_->mutex);
    const bool stuck = state_->started != state_->done;
    lock.unlock();
    if (stuck)
      thread_.detach();
    else
      thread_.join();
  }
  Drainer(const Drainer&) = delete;
  Drainer& operator=(const Drainer&) = delete;

  // Drains, waiting up to `deadline_ns`; false when the drain (or one before it) was still going.
  bool drain(std::uint64_t deadline_ns) {
    if (!thread_.joinable()) thread_ = os::start_thread([s = state_] { serve(*s); });
    std::unique_lock lock(state_->mutex);
    const auto until =
        std::chrono::steady_clock::now() +
        std::chrono::nanoseconds(deadline_ns - std::min(deadline_ns, clock::now_ns()));
    // One drain at a time: a late one is waited for first, and then it covers this request too
    // only if it began after the work was held, so a fresh one is asked for.
    if (!state_->cv.wait_until(lock, until, [&] { return state_->started == state_->done; }))
      return false;
    const std::uint64_t mine = ++state_->asked;
    state_->cv.notify_all();
    return state_->cv.wait_until(lock, until, [&] { return state_->done >= mine; });
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    std::function<void()> drain;
    std::uint64_t asked = 0, started = 0, done = 0;
    bool stop = false;
  };
  static void serve(State& s) {
    std::unique_lock lock(s.mutex);
    for (;;) {
      s.cv.wait(lock, [&] { return s.stop || s.asked != s.started; });
      if (s.stop) return;
      s.started = s.asked;
      lock.unlock();
      s.drain();
      lock.lock();
      s.done = s.started;
      s.cv.notify_all();
    }
  }
  std::shared_ptr<State> state_;
  std::thread thread_;
};

ComputeShare::ComputeShare(Process process)
    : process_(std::move(process)), drainer_(std::make_unique<Drainer>(process_.drain)) {
  os::ForkRegistry<ComputeShare>::track(this);
}

ComputeShare::~ComputeShare() {
  os::ForkRegistry<ComputeShare>::untrack(this);
  stop();
}

void ComputeShare::parts(const std::uint32_t* caps, std::size_t n, std::uint32_t* out) {
  // Water-filling: members in order of their caps; each gets an even split of what is left, or
  // its cap if that is less.
  std::uint32_t order[node::kSlots];
  n = std::min(n, node::kSlots);
  for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<std::uint32_t>(i);
  std::sort(order, order + n, [&](std::uint32_t a, std::uint32_t b) { return caps[a] < caps[b]; });
  std::uint32_t left = kWhole;
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint32_t even = left / static_cast<std::uint32_t>(n - k);
    const std::uint32_t i = order[k];
    out[i] = std::min(std::clamp<std::uint32_t>(caps[i], 1, kWhole), even);
    left -= out[i];
  }
}

bool ComputeShare::join_region(const policy::Compute& compute) {
  std::string path = node::share_dir() + "/" + node::compute_region_prefix();
  node::Region::Scope scope{0600, static_cast<gid_t>(-1), false};
  switch (compute.scope) {
    case policy::Budget::Share::user:
    case policy::Budget::Share::process:
      path += "u" + std::to_string(::geteuid());
      scope.per_user = true;
      break;
    case policy::Budget::Share::group:
      scope.group = ::getegid();
      path += "g" + std::to_string(scope.group);
      scope.mode = 0660;
      break;
    case policy::Budget::Share::device:
      path += "all";
      scope.mode = 0666;
      break;
  }
  std::string error;
  if (region_.join(path, scope, kRegionWaitMs, error)) return true;
  log::write(log::Level::error, "[compute]: %s; this process takes no slices (it runs as if alone)",
             error.c_str());
  return false;
}

bool ComputeShare::start(const policy::Compute& compute) {
  if (running() || !compute.enabled || process_.gate == nullptr) return running();
  compute_ = compute;
  if (!join_region(compute)) return false;
  {
    std::lock_guard lock(report_mutex_);
    report_.active = true;
    report_.region = region_.path();
  }
  stopping_ = false;
  thread_ = os::start_thread([this] { run(); });
  return true;
}

void ComputeShare::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(stop_mutex_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
  release();
  region_.leave();
}

void ComputeShare::forget_after_fork() {
  // The child's work goes through a core of its own; this one (with its thread object, whose
  // thread stayed in the parent) is never used or destroyed there.
  region_.forget_after_fork();
  entry_ = -1;
}

void ComputeShare::run() {
  std::unique_lock lock(stop_mutex_);
  while (!stopping_) {
    lock.unlock();
    tick(clock::now_ns());
    lock.lock();
    const std::uint64_t pause = held_ || running_ ? kTickNs : kAloneTickNs;
    stop_cv_.wait_for(lock, std::chrono::nanoseconds(pause), [&] { return stopping_; });
  }
}

bool ComputeShare::attach_device() {
  if (entry_ >= 0) return true;
  node::Uuid uuid;
  if (!process_.device || !process_.device(&uuid)) return false;
  std::uint64_t limit = 0;
  int entry = -1;
  if (region_.attach(uuid, 0, kRegionWaitMs, &entry, &limit) != node::Status::ok || entry < 0)
    return false;
  entry_ = entry;
  return true;
}

void ComputeShare::hold() {
  if (held_) return;
  if (!process_.gate->close(std::uint64_t{compute_.period_ms} * 1'000'000)) return;  // next tick
  held_ = true;
  // What the process queued before runs into someone's slice unless waited for.
  const std::uint64_t deadline = clock::now_ns() + std::uint64_t{compute_.period_ms} * 1'000'000;
  if (!drainer_->drain(deadline)) {
    std::lock_guard lock(report_mutex_);
    ++report_.drain_overruns;
  }
}

void ComputeShare::wait_turn() {
  if (running_) {  // the slice went to another member (taken over, or a higher priority came)
    running_ = false;
    debt_ns_ = 0;
  }
  hold();
}

void ComputeShare::release() {
  if (held_) process_.gate->open();
  held_ = false;
  running_ = false;
}

void ComputeShare::hand_on(const node::Slice& slice, int next, bool wraps) {
  hold();
  const std::uint64_t end = clock::now_ns();
  const std::uint64_t period = std::uint64_t{compute_.period_ms} * 1'000'000;
  const std::uint64_t used = end - std::min(end, began_ns_);
  debt_ns_ = std::min(used > quantum_ns_ ? used - quantum_ns_ : 0, period);
  {
    std::lock_guard lock(report_mutex_);
    ++report_.slices;
    report_.used_ns += used;
  }
  running_ = false;
  // A new round begins a period after the last one did: members whose caps leave part of the
  // period unused wait for it, so that a cap holds even when the others are capped too.
  const std::uint64_t round = wraps ? std::max(end, slice.round_ns + period) : slice.round_ns;
  bool handed = false;
  region_.hand_slice(entry_, slice.seq, next, wraps ? round : end, round, kRegionWaitMs, &handed);
}

bool ComputeShare::rotation(std::uint64_t now, const node::Demand* demand, Rotation& out) const {
  // Who wants the GPU: live members that wanted it within a period (a clock ahead of ours is no
  // want; a slot no process holds wants nothing, whatever was written there).
  const std::uint64_t period = std::uint64_t{compute_.period_ms} * 1'000'000;
  const int me = region_.slot();
  int top = -1, wanting = 0;
  bool wants[node::kSlots] = {};
  for (std::size_t i = 0; i < node::kSlots; ++i) {
    const std::uint64_t w = demand[i].want_ns;
    wants[i] = w != 0 && w <= now + period && now - std::min(now, w) <= period &&
               (static_cast<int>(i) == me || region_.slot_held(i));
    if (!wants[i]) continue;
    ++wanting;
    top = std::max(top, num(demand[i].priority));
  }
  if (wanting < 2 || !wants[me]) return false;
  out.below = num(demand[me].priority) < top;
  // The rotation: members of the top priority that want the GPU, by slot.
  std::uint32_t caps[node::kSlots];
  for (std::size_t i = 0; i < node::kSlots; ++i)
    if (wants[i] && num(demand[i].priority) == top) {
      if (static_cast<int>(i) == me) out.mine = out.n;
      caps[out.n] = demand[i].share;
      out.members[out.n++] = static_cast<int>(i);
    }
  parts(caps, out.n, out.part);
  return true;
}

void ComputeShare::tick(std::uint64_t now) {
  const std::uint64_t since = last_tick_ns_ != 0 && now > last_tick_ns_ ? now - last_tick_ns_ : 0;
  last_tick_ns_ = now;
  if (!region_.joined() || !attach_device()) return release();
  // Wanting the GPU: work submitted since the last tick, a submission inside the gate (a copy that
  // waits for the device), a thread waiting at the gate or inside a synchronization for the work
  // it queued.
  const std::uint64_t submissions = process_.gate->counts().submissions;
  const bool waiting = process_.gate->waiting() > 0;
  const bool busy = submissions != seen_submissions_ || waiting || process_.gate->anyone_inside() ||
                    (process_.syncing && process_.syncing());
  seen_submissions_ = submissions;
  if (busy) want_ns_ = now;
  if (waiting && held_ && !running_) {
    std::lock_guard lock(report_mutex_);
    report_.waited_ns += since;
  }
  const Report r = report();
  region_.publish_demand(
      entry_, node::Demand{want_ns_, compute_.share_permille,
                           static_cast<std::uint32_t>(compute_.priority), r.used_ns, r.waited_ns});

  node::Slice slice{};
  static thread_local node::Demand demand[node::kSlots];
  if (!region_.read_slices(entry_, &slice, demand)) return release();
  const int me = region_.slot();
  demand[me] = node::Demand{want_ns_, compute_.share_permille,
                            static_cast<std::uint32_t>(compute_.priority), 0, 0};
  const std::uint64_t period = std::uint64_t{compute_.period_ms} * 1'000'000;
  Rotation rot;
  if (!rotation(now, demand, rot)) return release();  // alone, or not wanting: no slices
  if (rot.below) return wait_turn();                  // a higher priority wants it
  const int* members = rot.members;
  const std::size_t n = rot.n, mine = rot.mine;
  const std::uint32_t* part = rot.part;
  const int holder = slice.holder;
  if (holder == me) {
    if (!running_) {
      if (now < slice.start_ns && slice.start_ns - now <= 2 * period) return hold();
      release();
      running_ = true;
      began_ns_ = now;
      const std::uint64_t q = period * part[mine] / kWhole;
      quantum_ns_ = q - std::min(q, debt_ns_);
      return;
    }
    const int next = members[(mine + 1) % n];
    if (now - began_ns_ < quantum_ns_ && busy) return;
    if (next == me) {  // the only one of its priority: a fresh slice, nothing to hand on
      began_ns_ = now;
      quantum_ns_ = period * part[mine] / kWhole;
      debt_ns_ = 0;
      bool handed = false;  // restarted in the region too, so that nobody finds it overdue
      region_.hand_slice(entry_, slice.seq, me, now, now, kRegionWaitMs, &handed);
      return;
    }
    return hand_on(slice, next, next <= me);
  }
  wait_turn();
  // Taken over when nobody holds it (the holder stopped wanting it, or is of a lower priority) or
  // when the holder did not hand it on.
  bool holder_in = false;
  for (std::size_t k = 0; k < n; ++k) holder_in = holder_in || members[k] == holder;
  // (A start further ahead than a round can be was not written by a member that hands on.)
  const bool overdue =
      now > slice.start_ns + kOverduePeriods * period || slice.start_ns > now + 2 * period;
  if (holder_in && !overdue) return;
  bool handed = false;
  region_.hand_slice(entry_, slice.seq, me, now, now, kRegionWaitMs, &handed);
  if (handed && holder_in) {
    std::lock_guard lock(report_mutex_);
    ++report_.taken_over;
  }
}

ComputeShare::Report ComputeShare::report() const {
  std::lock_guard lock(report_mutex_);
  return report_;
}

}  // namespace allocshim
