#include "core/core.h"

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/events.h"
#include "base/log.h"

namespace allocshim {

Core::Core(const Driver& driver, policy::Policy policy) : driver_(driver) {
  clock::to_ns(0);  // calibrate the tick rate now rather than inside the first timed call
  native_ = add_backend(make_native_passthrough(driver_));
  if (!install(std::move(policy), error_)) {
    // A policy the shim cannot serve is not half-applied: everything goes native, and the reason is
    // reported (once, by the caller) instead of the program failing.
    std::string ignored;
    install(native_policy(policy::default_policy().source + " (fallback)"), ignored);
  }
}

Core::~Core() { stop_control(); }

policy::Policy native_policy(std::string source) {
  policy::Policy p;
  policy::BackendSpec native;
  native.name = "native";
  p.backends.push_back(native);
  p.source = std::move(source);
  return p;
}

std::uint32_t Core::add_backend(std::unique_ptr<Backend> b) {
  const std::size_t i = backend_count_.load(std::memory_order_relaxed);
  backends_[i] = std::move(b);
  backend_count_.store(i + 1, std::memory_order_release);
  return static_cast<std::uint32_t>(i);
}

bool Core::install(policy::Policy p, std::string& error) {
  std::lock_guard lock(install_mutex_);
  auto route = std::make_unique<Route>();
  const Route* current = route_.load(std::memory_order_acquire);
  std::vector<std::unique_ptr<Backend>> fresh;  // built for this policy, added only if all build
  std::vector<std::uint32_t> index;
  const std::size_t count = backend_count();
  for (const policy::BackendSpec& spec : p.backends) {
    // Reuse an instance of the current policy with the same name and options: its cached memory
    // and live blocks carry over. The native passthrough needs no instance of its own.
    std::uint32_t found = UINT32_MAX;
    if (spec.kind == BackendKind::native) found = native_;
    for (std::size_t i = 0; current && found == UINT32_MAX && i < current->policy.backends.size();
         ++i)
      if (current->policy.backends[i].same_instance(spec)) found = current->index[i];
    if (found != UINT32_MAX) {
      index.push_back(found);
      continue;
    }
    if (count + fresh.size() >= kMaxBackends) {
      error =
          "too many backends over the program's lifetime (" + std::to_string(kMaxBackends) + ")";
      return false;
    }
    std::string why;
    std::unique_ptr<Backend> b = make_backend(spec, driver_, streams_, why);
    if (!b) {
      error = "backend \"" + spec.name + "\": " + why;
      return false;
    }
    index.push_back(static_cast<std::uint32_t>(count + fresh.size()));
    fresh.push_back(std::move(b));
  }
  // The budget's spill target: one instance per kind for the core's lifetime (blocks it served are
  // freed by it whatever later reloads say).
  const auto spill = static_cast<std::size_t>(p.budget.spill);
  std::unique_ptr<Backend> spill_fresh;
  if (p.budget.spill != policy::Budget::Spill::none && spill_index_[spill] == kNoSpill) {
    std::string why;
    spill_fresh = make_spill_backend(p.budget.spill, driver_, budget_, why);
    if (!spill_fresh || count + fresh.size() + 1 > kMaxBackends) {
      error = "budget spill target: " + (spill_fresh ? std::string("too many backends") : why);
      return false;
    }
  }
  EventSink* const tr = event_sink();
  if (spill_fresh) fresh.push_back(std::move(spill_fresh));
  for (auto& b : fresh) {
    const std::uint32_t i = add_backend(std::move(b));
    attach_budget(*backends_[i], budget_);
    if (tr) tr->describe_backend(static_cast<int>(i), backends_[i]->kind(), backends_[i]->name());
  }
  // The spill target, when new, was added last.
  if (p.budget.spill != policy::Budget::Spill::none && spill_index_[spill] == kNoSpill)
    spill_index_[spill] = static_cast<std::uint32_t>(backend_count() - 1);
  route->spill = p.budget.spill != policy::Budget::Spill::none ? spill_index_[spill] : kNoSpill;
  budget_.configure(p.budget, route->spill != kNoSpill ? backends_[route->spill].get() : nullptr);
  if (route->spill != kNoSpill)
    configure_spill(*backends_[route->spill], p.host_side(), budget_.migrate());
  control_.set_idle_ms(p.budget.idle_sleep_ms);
  route->budget = budget_.active();
  route->rules = !p.rules.empty();
  route->callsite = p.uses_callsite();
  route->policy = std::move(p);
  route->index = std::move(index);
  route_.store(route.get(), std::memory_order_release);
  routes_.push_back(std::move(route));
  return true;
}

bool Core::trim_others(std::uint32_t refused, int device) {
  // The refusing backend has already released its own cache and retried; what other backends
  // hold cached (freed blocks, pool reservations) is memory the program gave back, so it goes back
  // to the driver before the refusal is final.
  bool released = false;
  for (std::size_t i = 0; i < backend_count(); ++i) {
    if (i == refused) continue;
    Backend& other = *backends_[i];
    const std::size_t before = other.reserved(device);
    if (other.trim(device) == res::ok && other.reserved(device) < before) released = true;
  }
  return released;
}

void Core::enable_reload(std::unique_ptr<policy::PolicyWatcher> watcher) {
  std::lock_guard lock(reload_mutex_);
  watcher_ = std::move(watcher);
}

void Core::poll_reload() {
  std::unique_lock lock(reload_mutex_, std::try_to_lock);
  if (!lock.owns_lock() || !watcher_) return;  // another thread is polling: no waiting here
  policy::Policy next;
  std::vector<policy::Diagnostic> errors;
  const auto change = watcher_->poll_if_due(clock::now_ns() / 1'000'000, next, errors);
  if (change == policy::PolicyWatcher::Change::none) return;
  EventSink* const tr = event_sink();
  std::string why;
  if (change == policy::PolicyWatcher::Change::reloaded && install(std::move(next), why)) {
    reloads_.fetch_add(1, std::memory_order_relaxed);
    log::write(log::Level::info, "policy %s reloaded", watcher_->path().c_str());
    if (tr) tr->on_reload(watcher_->path(), true);
    return;
  }
  for (const auto& e : errors) log::write(log::Level::error, "%s", e.str().c_str());
  if (!why.empty()) log::write(log::Level::error, "%s", why.c_str());
  log::write(log::Level::error, "policy %s not reloaded: keeping the current policy",
             watcher_->path().c_str());
  if (tr) tr->on_reload(watcher_->path(), false);
}

int Core::current_device() const {
  // With one device the answer is 0 whatever the context, and 0 is also what a failing query
  // (no current context, driver torn down) gives below: the query, a good part of a pool hit
  // (tools/bench/hit_path), is skipped.
  const int count = device_count_.load(std::memory_order_relaxed);
  if (count == 1) return 0;
  int device = 0;
  if (driver_.ctx_get_device(&device) != res::ok) return 0;
  if (count == 0) {
    // A context exists, so the driver is initialized and the count is final.
    int n = 0;
    if (driver_.device_get_count(&n) == res::ok && n > 0)
      device_count_.store(n, std::memory_order_relaxed);
  }
  return device;
}

Result Core::alloc(AllocRequest& req, DevPtr* out) {
  if (!out) return res::invalid_value;
  if (__builtin_expect(watcher_ != nullptr, 0)) poll_reload();
  req.device = current_device();
  const Route* route = route_.load(std::memory_order_acquire);
  const policy::Decision d =
      !route->rules
          ? policy::Decision{route->policy.default_backend, route->policy.default_free_sync, -1}
      : __builtin_expect(route->callsite, 0)
          ? policy::match_callsite_bits(route->policy, req.size, req.api, req.device,
                                        callsites_.bits(route->policy))
          : policy::match(route->policy, req.size, req.api, req.device);
  // Managed and stream-ordered requests keep their own semantics (host access; the program's pool
  // and stream) unless the rule that matched names their api: defaults and rules without `api`
  // are for cudaMalloc-style memory.
  std::uint32_t index = static_cast<std::size_t>(d.backend) < route->index.size()
                            ? route->index[static_cast<std::size_t>(d.backend)]
                            : native_;
  if ((req.api == Api::managed || req.api == Api::async) &&
      (d.rule < 0 || route->policy.rules[static_cast<std::size_t>(d.rule)].api_mask == ~0u))
    index = native_;

  EventSink* const tr = event_sink();
  // Past the device's budget the spill target serves the request, or it fails as on a full device.
  Budget::Ticket ticket;
  std::uint32_t trace_flags = 0;
  if (__builtin_expect(route->budget, 0) && route->spill != kNoSpill &&
      budget_.migratable(req.device, req.size, backends_[index]->kind(), req.api)) {
    index = route->spill;  // migrate = "auto": served where its device memory can be demoted later
  } else if (__builtin_expect(route->budget, 0) &&
             !budget_.admit(req.device, req.size, backends_[index]->kind(), req.api, &ticket)) {
    if (route->spill == kNoSpill) {
      budget_.on_refused(req.device);
      backends_[index]->count_refused(req.device);
      if (req.size > budget_.limit(req.device)) log_larger_than_budget(req.device, req.size);
      if (tr)
        tr->on_oom(req.size, req.device, budget_.limit(req.device), budget_.backed(req.device));
      return res::out_of_memory;
    }
    index = route->spill;
    trace_flags = event::kAllocSpilled;
  }

  std::uint64_t cookie = 0;
  Backend& b = *backends_[index];  // the policy's choice (a fallback below may change `index`)
  const std::uint64_t t0 = tr ? clock::ticks() : 0;
  AllocRequest spill_req;
  std::size_t placed = 0;
  const AllocRequest& asked =
      __builtin_expect(index == route->spill, 0) ? claim_spill(b, req, spill_req, placed) : req;
  Result r = b.allocate(asked, d.free_sync, out, &cookie);
  if (__builtin_expect(r == res::out_of_memory, 0) && trim_others(index, req.device))
    r = b.allocate(asked, d.free_sync, out, &cookie);  // memory cached elsewhere is free memory
  if (__builtin_expect(asked.device_part > 0, 0))
    budget_.unclaim(req.device, r == res::ok ? asked.device_part - placed : asked.device_part);
  if (__builtin_expect(r == res::not_supported, 0) && index != native_) {
    // The device cannot do what the backend needs (no VMM, no memory pools): the program gets
    // what it would have got without the shim rather than an error it never sees natively.
    if (index == route->spill) log_spill_unsupported(req.device);
    index = native_;
    r = backends_[index]->allocate(req, d.free_sync, out, &cookie);
  }
  if (__builtin_expect(route->budget, 0)) budget_.finish(ticket);
  if (__builtin_expect(tr != nullptr, 0)) {
    const std::uint64_t ns = clock::to_ns(clock::ticks() - t0);
    if (r == res::ok)
      tr->on_alloc(*out, req.size, req.device, static_cast<int>(index), req.api, ns, trace_flags);
    else
      tr->on_alloc_failed(req.size, req.device, static_cast<int>(index), req.api, r, ns);
  }
  if (r != res::ok) return r;
  registry_.insert(*out, Block{req.size, index, static_cast<std::int16_t>(req.device), req.api,
                               d.free_sync, cookie});
  return r;
}

Result Core::free(DevPtr ptr, const FreeRequest& req) {
  Block block;
  if (!registry_.erase(ptr, &block)) {
    // Not ours (allocated before the shim saw it, or not an allocation at all): the driver decides.
    if (ptr != 0) unknown_frees_.fetch_add(1, std::memory_order_relaxed);
    return req.async ? driver_.mem_free_async(ptr, req.stream) : driver_.mem_free(ptr);
  }
  EventSink* const tr = event_sink();
  if (IpcHooks* ipc = ipc_.load(std::memory_order_acquire); __builtin_expect(ipc != nullptr, 0)) {
    if (ipc->on_free(ptr, block, req)) {
      // Kept for another process (docs/ipc.md): freed as far as the program is concerned.
      if (tr)
        tr->on_free(ptr, block.size, block.device, static_cast<int>(block.backend), 0,
                    req.async ? event::kFreeAsync : 0);
      return res::ok;
    }
  }
  // A synchronous free, which the program expects to wait, is a safe point under a budget: unused
  // shared lease goes back, other processes' requests are answered, spilled memory may move back.
  if (__builtin_expect(tr == nullptr && !budget_.watches_frees(), 1))
    return backends_[block.backend]->deallocate(ptr, block, req);
  const std::uint64_t t0 = tr ? clock::ticks() : 0;
  const Result r = backends_[block.backend]->deallocate(ptr, block, req);
  if (tr)
    tr->on_free(ptr, block.size, block.device, static_cast<int>(block.backend),
                clock::to_ns(clock::ticks() - t0), req.async ? event::kFreeAsync : 0);
  if (budget_.watches_frees() && !req.async) budget_.after_free(block.device);
  return r;
}

Result Core::host_alloc(void** ptr, std::size_t bytes, unsigned flags, bool portable_api) {
  const std::uint64_t t0 = clock::ticks();
  const Result r =
      portable_api ? driver_.mem_host_alloc(ptr, bytes, flags) : driver_.mem_alloc_host(ptr, bytes);
  if (r != res::ok) {
    host_stats_.device(0).on_failure();
    return r;
  }
  host_stats_.device(0).on_alloc(bytes, clock::to_ns(clock::ticks() - t0), Api::host);
  registry_.insert(reinterpret_cast<DevPtr>(*ptr),
                   Block{bytes, native_, -1, Api::host, FreeSync::none, 0});
  return r;
}

Result Core::host_free(void* ptr) {
  Block block;
  const std::uint64_t t0 = clock::ticks();
  const bool known = registry_.erase(reinterpret_cast<DevPtr>(ptr), &block);
  const Result r = driver_.mem_free_host(ptr);
  if (known) host_stats_.device(0).on_free(block.size, clock::to_ns(clock::ticks() - t0));
  return r;
}

bool Core::find_block(DevPtr ptr, DevPtr* base, std::size_t* size) const {
  for (std::size_t i = 0; i < backend_count(); ++i)
    if (backends_[i]->find(ptr, base, size)) return true;
  return false;
}

bool Core::lookup(DevPtr ptr, DevPtr* base, Block* block) const {
  if (registry_.find(ptr, block)) {
    *base = ptr;
    return true;
  }
  // An interior pointer: sub-allocating backends know the enclosing block.
  std::size_t size = 0;
  return find_block(ptr, base, &size) && registry_.find(*base, block);
}

Result Core::release_deferred(DevPtr ptr, const Block& block) {
  if (block.backend >= backend_count()) return res::invalid_value;
  return backends_[block.backend]->deallocate(ptr, block, FreeRequest{});
}

void Core::on_stream_created(Stream stream, unsigned flags) {
  streams_.add(stream, flags, current_device());
}

void Core::on_stream_destroyed(Stream stream) {
  // Forgotten first, so that no close from now on takes it in its snapshot of the streams (a
  // close that did took and recorded it under the device lock, which close_epochs waits for);
  // then, while the stream exists, every open epoch is closed with an event on it too.
  const int device = streams_.device_of(stream);
  streams_.remove(stream);
  if (device >= 0) {
    const std::size_t n = backend_count();
    for (std::size_t i = 0; i < n; ++i) backends_[i]->close_epochs(device, stream);
  }
}

Result Core::enable_peer_access(Context peer, unsigned flags) {
  const Result r = driver_.ctx_enable_peer_access(peer, flags);
  if (r != res::ok && r != res::peer_access_already_enabled) return r;
  // Find the peer context's device: make it current for a moment, then restore.
  const int accessing = current_device();
  Context saved = nullptr;
  int peer_device = -1;
  if (driver_.ctx_get_current(&saved) == res::ok && driver_.ctx_set_current(peer) == res::ok) {
    driver_.ctx_get_device(&peer_device);
    driver_.ctx_set_current(saved);
  }
  if (peer_device < 0) return r;
  // Every backend is extended even if one fails (the others' memory stays reachable); the first
  // failure is returned, since the program's kernels would fault on that backend's memory and an
  // error now is easier to find than an illegal address later.
  Result first_error = res::ok;
  for (std::size_t i = 0; i < backend_count(); ++i) {
    auto& b = backends_[i];
    const Result e = b->enable_peer_access(accessing, peer_device);
    if (e == res::ok) continue;
    log::write(log::Level::error,
               "backend %s: peer access for device %d to device %d failed (error %d)",
               b->name().c_str(), accessing, peer_device, e);
    if (first_error == res::ok) first_error = e;
  }
  return first_error != res::ok ? first_error : r;
}

}  // namespace allocshim
