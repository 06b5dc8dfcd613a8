// Context reset (cuDevicePrimaryCtxReset): everything the context owns
// is destroyed at once, and handles kept across it dangle.
#include <sys/mman.h>

#include <algorithm>

#include "fake_state.h"

namespace allocshim::fake {
namespace detail {

bool State::stale(const void* handle) {
  if (handle == nullptr || reset_handles.count(handle) == 0) return false;
  ++stale_uses;
  return true;
}

void State::reset_context(int device) {
  ++resets;
  // Streams: destroyed; their states stay for the events that named them (never reused).
  for (auto it = streams.begin(); it != streams.end();) {
    if (it->second->device != device) {
      ++it;
      continue;
    }
    it->second->live = false;
    reset_handles.emplace(it->first, device);
    it = streams.erase(it);
  }
  for (auto it = events.begin(); it != events.end();) {
    if (it->second->device != device) {
      ++it;
      continue;
    }
    reset_handles.emplace(it->first, device);
    dead_events.push_back(std::move(it->second));
    it = events.erase(it);
  }
  // The context's memory: classic, managed and pool blocks (the pools' arenas go with the pools).
  for (auto it = allocs.begin(); it != allocs.end();) {
    Alloc& a = it->second;
    const bool owned =
        a.device == device && (a.kind == AllocKind::device || a.kind == AllocKind::managed ||
                               a.kind == AllocKind::pool || a.kind == AllocKind::pool_import);
    if (!owned) {
      ++it;
      continue;
    }
    if (a.kind == AllocKind::pool) {
      a.pool->used -= a.length;
      release_block(*a.pool, CachedBlock{it->first, a.length, a.pool_offset, nullptr, 0});
    } else {
      if (a.kind == AllocKind::managed) managed_used -= a.length;
      uncharge(a.device, a.counted);
      unmap(it->first, a.length);
    }
    it = allocs.erase(it);
  }
  // Pools of the device, the default one included (it is made afresh on next use).
  const auto drop_pool = [&](std::unique_ptr<PoolState>& p) {
    for (const CachedBlock& b : p->cached) release_block(*p, b);
    p->cached.clear();
    p->destroyed = true;
    reset_handles.emplace(p.get(), device);
    dead_pools.push_back(std::move(p));
  };
  for (auto it = pools.begin(); it != pools.end();) {
    if (pool_device(*it->second) != device) {
      ++it;
      continue;
    }
    drop_pool(it->second);
    it = pools.erase(it);
  }
  if (auto& p = default_pools[static_cast<std::size_t>(device)]) drop_pool(p);
  // The primary context is inactive until it is retained again (cuDevicePrimaryCtxGetState).
  contexts[static_cast<std::size_t>(device)]->active = false;
  peers.erase(std::remove_if(peers.begin(), peers.end(),
                             [&](const std::pair<int, int>& p) {
                               return p.first == device || p.second == device;
                             }),
              peers.end());
}

}  // namespace detail

void FakeDriver::reset_device(int device) {
  std::lock_guard lock(state_->mu);
  if (state_->valid_device(device)) state_->reset_context(device);
}

Result FakeDriver::reset_primary_context(int device) {
  std::lock_guard lock(state_->mu);
  if (!state_->valid_device(device)) return res::invalid_device;
  state_->reset_context(device);
  return res::ok;
}

Result FakeDriver::destroy_context(Context ctx) {
  std::lock_guard lock(state_->mu);
  for (const auto& c : state_->contexts) {
    if (c.get() != ctx) continue;
    state_->reset_context(c->device);
    return res::ok;
  }
  return res::invalid_context;
}

std::uint64_t FakeDriver::stale_uses() const {
  std::lock_guard lock(state_->mu);
  return state_->stale_uses;
}

std::uint64_t FakeDriver::resets() const {
  std::lock_guard lock(state_->mu);
  return state_->resets;
}

}  // namespace allocshim::fake
