#include "placement/host_cost.h"

#include <algorithm>

namespace allocshim {

std::uint32_t HostCost::cost_of(std::uint64_t ns, std::uint64_t host_bytes) {
  if (host_bytes == 0) return 0;
  const unsigned __int128 c =
      static_cast<unsigned __int128>(ns) * kLinkBytesPerNs * kPrior / host_bytes;
  return static_cast<std::uint32_t>(std::clamp<unsigned __int128>(c, 1, kMaxCost));
}

std::uint32_t HostCost::begin(int device, Stream stream, std::uint64_t epoch,
                              std::vector<Named> named) {
  if (named.empty() || driver_.event_elapsed_time == nullptr) return 0;
  Sample* s = nullptr;
  std::uint32_t token = 0;
  {
    std::lock_guard lock(mutex_);
    if (epoch_ != epoch) {
      epoch_ = epoch;
      in_epoch_ = 0;
    }
    if (in_epoch_ >= kMaxPerEpoch) return 0;
    for (std::uint32_t i = 0; i < kMaxPending && s == nullptr; ++i)
      if (!samples_[i].used) {
        s = &samples_[i];
        token = i + 1;
      }
    if (s == nullptr) return 0;
    ++in_epoch_;
    *s = Sample{};
    s->used = true;
  }
  // The events are made in the launch's context, outside the lock: a driver call may be slow.
  Context ctx = nullptr;
  Event start = nullptr, end = nullptr;
  const bool ok = driver_.ctx_get_current(&ctx) == res::ok && ctx != nullptr &&
                  driver_.event_create(&start, 0) == res::ok &&
                  driver_.event_create(&end, 0) == res::ok &&
                  driver_.event_record(start, stream) == res::ok;
  std::lock_guard lock(mutex_);
  s->device = device;
  s->ctx = ctx;
  s->start = start;
  s->end = end;
  s->epoch = epoch;
  s->named = std::move(named);
  if (!ok) {
    drop(*s, true);
    return 0;
  }
  ++timed_;
  return token;
}

void HostCost::end(std::uint32_t token, Stream stream, bool launched) {
  if (token == 0 || token > kMaxPending) return;
  Sample& s = samples_[token - 1];
  // The token's holder owns the sample until `ended`: no other thread touches its events.
  const bool ok = launched && driver_.event_record(s.end, stream) == res::ok;
  std::lock_guard lock(mutex_);
  if (ok)
    s.ended = true;
  else
    drop(s, true);
}

void HostCost::harvest(int device, std::uint64_t epoch,
                       const std::function<void(DevPtr, std::uint32_t)>& apply) {
  std::lock_guard lock(mutex_);
  for (Sample& s : samples_) {
    if (!s.used || !s.ended || s.device != device) continue;
    float ms = 0;
    const Result r = driver_.event_elapsed_time(&ms, s.start, s.end);
    if (r == res::not_ready && epoch - s.epoch < kMaxAgeEpochs) continue;
    if (r == res::ok) {
      std::uint64_t host = 0;
      for (const Named& n : s.named) host += n.host_bytes;
      const std::uint32_t cost =
          cost_of(static_cast<std::uint64_t>(std::max(ms, 0.0f) * 1e6), host);
      for (const Named& n : s.named) apply(n.base, cost);
      ++measured_;
    }
    drop(s, true);
  }
}

void HostCost::forget(int device, Context ctx, bool alive) {
  std::lock_guard lock(mutex_);
  // A sample still being launched (not ended) belongs to its thread, which ends it.
  for (Sample& s : samples_)
    if (s.used && s.ended && s.device == device && s.ctx == ctx) drop(s, alive);
}

void HostCost::drop(Sample& s, bool destroy) {
  if (destroy) {
    if (s.start != nullptr) driver_.event_destroy(s.start);
    if (s.end != nullptr) driver_.event_destroy(s.end);
  }
  s = Sample{};
}

HostCost::Counts HostCost::counts() const {
  std::lock_guard lock(mutex_);
  return Counts{timed_, measured_};
}

}  // namespace allocshim
