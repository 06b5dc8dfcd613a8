// The fake driver's instance: construction, call counters and injected failures, devices and
// contexts, and the test-facing queries of fake_driver.h.
#include "fake_driver.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fake_state.h"

namespace allocshim::fake {
namespace detail {
namespace {

std::atomic<FakeDriver*> g_current{nullptr};
std::atomic<std::uint64_t> g_next_instance{1};

// The calling thread's current context. Tagged with the instance so that a context set under one
// FakeDriver is not mistaken for one of the next.
struct CurrentContext {
  std::uint64_t instance = 0;
  ContextState* ctx = nullptr;
};
thread_local CurrentContext t_current;

// Fork while another thread holds the state lock must not leave the child with a held lock
// (preload tests fork while allocating through the fake libcuda).
void atfork_prepare() {
  if (FakeDriver* f = g_current.load()) f->state().mu.lock();
}
void atfork_release() {
  if (FakeDriver* f = g_current.load()) f->state().mu.unlock();
}
std::once_flag g_atfork_once;

}  // namespace

State::State(const FakeConfig& c) : config(c) {
  if (config.devices < 1) config.devices = 1;
  if (static_cast<std::size_t>(config.devices) > kMaxDevices) config.devices = kMaxDevices;
  instance_id = g_next_instance.fetch_add(1);
  const auto n = static_cast<std::size_t>(config.devices);
  capacity.assign(n, config.capacity);
  used.assign(n, 0);
  default_pools.resize(n);
  for (int d = 0; d < config.devices; ++d) {
    auto ctx = std::make_unique<ContextState>();
    ctx->device = d;
    ctx->id = ++next_context_id;
    contexts.push_back(std::move(ctx));
    for (auto* list : {&legacy, &per_thread}) {
      auto s = std::make_unique<StreamState>();
      s->device = d;
      s->builtin = true;
      list->push_back(s.get());
      all_streams.push_back(std::move(s));
    }
  }
}

// Gives every mapping and fd back, so tests can create thousands of instances.
State::~State() {
  for (const auto& [ptr, a] : allocs) munmap(reinterpret_cast<void*>(ptr), a.length);
  for (const auto& [ptr, bytes] : reservations) munmap(reinterpret_cast<void*>(ptr), bytes);
  for (const auto& [h, p] : phys) close(p.fd);
  auto close_pool = [](PoolState& p) {
    for (const CachedBlock& b : p.cached) munmap(reinterpret_cast<void*>(b.ptr), b.length);
    if (p.arena_fd >= 0) close(p.arena_fd);
  };
  for (auto& [h, p] : pools) close_pool(*p);
  for (auto& p : default_pools)
    if (p) close_pool(*p);
  for (auto& p : dead_pools) close_pool(*p);
}

Result State::enter(FakeOp op) {
  const auto i = static_cast<std::size_t>(op);
  calls[i].fetch_add(1, std::memory_order_relaxed);
  if (!any_failure.load(std::memory_order_relaxed)) return res::ok;
  std::function<void()> hook;
  {
    std::lock_guard lock(fail_mu);
    hook = on_call[i];
  }
  if (hook) hook();
  std::lock_guard lock(fail_mu);
  Failure& f = failures[i];
  if (f.count <= 0) return res::ok;
  if (f.skip > 0) {
    --f.skip;
    return res::ok;
  }
  --f.count;
  return f.result;
}

int State::current_device() const {
  if (t_current.instance == instance_id && t_current.ctx != nullptr) return t_current.ctx->device;
  return config.implicit_context ? 0 : -1;
}

bool State::charge(int device, std::size_t bytes) {
  std::size_t& u = device < 0 ? host_used : used[static_cast<std::size_t>(device)];
  const std::size_t cap =
      device < 0 ? config.host_capacity : capacity[static_cast<std::size_t>(device)];
  if (bytes > cap || u > cap - bytes) return false;
  u += bytes;
  return true;
}

void State::uncharge(int device, std::size_t bytes) {
  std::size_t& u = device < 0 ? host_used : used[static_cast<std::size_t>(device)];
  u -= std::min(u, bytes);
}

State& state() {
  FakeDriver* f = g_current.load(std::memory_order_acquire);
  if (f == nullptr) {
    std::fputs("allocshim fake driver: driver table called with no FakeDriver alive\n", stderr);
    std::abort();
  }
  return f->state();
}

// ---- Devices and contexts -------------------------------------------------------------------
namespace impl {

Result init(unsigned flags) {
  FAKE_ENTRY(init);
  return flags == 0 ? res::ok : res::invalid_value;
}

Result driver_get_version(int* version) {
  FAKE_ENTRY(driver_get_version);
  if (version == nullptr) return res::invalid_value;
  *version = s.config.driver_version;
  return res::ok;
}

Result device_get_count(int* count) {
  FAKE_ENTRY(device_get_count);
  if (count == nullptr) return res::invalid_value;
  *count = s.config.devices;
  return res::ok;
}

Result device_get_attribute(int* value, DevAttr attr, int device) {
  FAKE_ENTRY(device_get_attribute);
  if (value == nullptr) return res::invalid_value;
  if (!s.valid_device(device)) return res::invalid_device;
  const auto i = static_cast<std::size_t>(attr);
  if (i >= std::size(s.config.attributes)) return res::invalid_value;
  *value = s.config.attributes[i];
  return res::ok;
}

Result device_get_name(char* name, int len, int device) {
  FAKE_ENTRY(device_get_name);
  if (name == nullptr || len <= 0) return res::invalid_value;
  if (!s.valid_device(device)) return res::invalid_device;
  std::snprintf(name, static_cast<std::size_t>(len), "allocshim fake device %d", device);
  return res::ok;
}

Result device_total_mem(std::size_t* bytes, int device) {
  FAKE_ENTRY(device_total_mem);
  if (bytes == nullptr) return res::invalid_value;
  if (!s.valid_device(device)) return res::invalid_device;
  std::lock_guard lock(s.mu);
  *bytes = s.capacity[static_cast<std::size_t>(device)];
  return res::ok;
}

// The same simulated GPU answers the same UUID in every process (forked tests share budgets).
Result device_get_uuid(unsigned char uuid[16], int device) {
  FAKE_ENTRY(device_get_uuid);
  if (uuid == nullptr) return res::invalid_value;
  if (!s.valid_device(device)) return res::invalid_device;
  std::memset(uuid, 0, 16);
  std::memcpy(uuid, "allocshim-fake", 14);
  uuid[15] = static_cast<unsigned char>(device);
  return res::ok;
}

Result ctx_get_device(int* device) {
  FAKE_ENTRY(ctx_get_device);
  if (device == nullptr) return res::invalid_value;
  const int d = s.current_device();
  if (d < 0) return res::invalid_context;
  *device = d;
  return res::ok;
}

Result ctx_get_current(Context* ctx) {
  FAKE_ENTRY(ctx_get_current);
  if (ctx == nullptr) return res::invalid_value;
  // No implicit context here: the runtime asks this to learn whether it must make one current.
  *ctx = t_current.instance == s.instance_id ? t_current.ctx : nullptr;
  return res::ok;
}

Result ctx_set_current(Context ctx) {
  FAKE_ENTRY(ctx_set_current);
  if (ctx == nullptr) {
    t_current = {};
    return res::ok;
  }
  for (const auto& c : s.contexts) {
    if (c.get() == ctx) {
      t_current = {s.instance_id, c.get()};
      return res::ok;
    }
  }
  return res::invalid_context;
}

Result ctx_synchronize() {
  FAKE_ENTRY(ctx_synchronize);
  const int d = s.current_device();
  if (d < 0) return res::invalid_context;
  std::lock_guard lock(s.mu);
  s.complete_device(d);
  s.apply_release_thresholds();
  return res::ok;
}

Result primary_ctx_retain(Context* ctx, int device) {
  FAKE_ENTRY(primary_ctx_retain);
  if (ctx == nullptr) return res::invalid_value;
  if (!s.valid_device(device)) return res::invalid_device;
  std::lock_guard lock(s.mu);
  ContextState* c = s.contexts[static_cast<std::size_t>(device)].get();
  ++c->retains;
  if (!c->active) c->id = ++s.next_context_id;  // made again after a reset or its last release
  c->active = true;
  *ctx = c;
  return res::ok;
}

Result primary_ctx_release(int device) {
  FAKE_ENTRY(primary_ctx_release);
  if (!s.valid_device(device)) return res::invalid_device;
  std::lock_guard lock(s.mu);
  ContextState* c = s.contexts[static_cast<std::size_t>(device)].get();
  if (c->retains <= 0) return res::invalid_context;
  if (--c->retains == 0 && s.config.release_destroys) {
    s.reset_context(device);
    c->active = false;
  }
  return res::ok;
}

Result primary_ctx_active(int device, int* active) {
  FAKE_ENTRY(primary_ctx_active);
  if (!s.valid_device(device)) return res::invalid_device;
  if (active == nullptr) return res::invalid_value;
  std::lock_guard lock(s.mu);
  *active = s.contexts[static_cast<std::size_t>(device)]->active ? 1 : 0;
  return res::ok;
}

Result ctx_get_id(Context ctx, std::uint64_t* id) {
  FAKE_ENTRY(ctx_get_id);
  if (id == nullptr) return res::invalid_value;
  std::lock_guard lock(s.mu);
  for (const auto& c : s.contexts) {
    if (c.get() != ctx) continue;
    if (!c->active) return res::context_is_destroyed;
    *id = c->id;
    return res::ok;
  }
  return res::invalid_context;
}

Result ctx_enable_peer_access(Context peer, unsigned flags) {
  FAKE_ENTRY(ctx_enable_peer_access);
  if (flags != 0) return res::invalid_value;
  const int from = s.current_device();
  if (from < 0) return res::invalid_context;
  int to = -1;
  for (const auto& c : s.contexts)
    if (c.get() == peer) to = c->device;
  if (to < 0) return res::invalid_context;
  if (to == from) return res::invalid_device;
  std::lock_guard lock(s.mu);
  const std::pair<int, int> pair{from, to};
  if (std::find(s.peers.begin(), s.peers.end(), pair) != s.peers.end())
    return res::peer_access_already_enabled;
  s.peers.push_back(pair);
  return res::ok;
}

Result mem_get_info(std::size_t* free, std::size_t* total) {
  FAKE_ENTRY(mem_get_info);
  if (free == nullptr || total == nullptr) return res::invalid_value;
  const int d = s.current_device();
  if (d < 0) return res::invalid_context;
  std::lock_guard lock(s.mu);
  const auto i = static_cast<std::size_t>(d);
  *total = s.capacity[i];
  *free = s.capacity[i] - std::min(s.capacity[i], s.used[i]);
  return res::ok;
}

}  // namespace impl
}  // namespace detail

// ---- The test-facing API ----------------------------------------------------------------------

namespace {
constexpr const char* kOpNames[] = {
#define ALLOCSHIM_FAKE_OP_NAME(name) #name,
    ALLOCSHIM_FAKE_OPS(ALLOCSHIM_FAKE_OP_NAME)
#undef ALLOCSHIM_FAKE_OP_NAME
};
}  // namespace

const char* op_name(FakeOp op) { return kOpNames[static_cast<std::size_t>(op)]; }

bool op_from_name(std::string_view name, FakeOp* op) {
  for (int i = 0; i < kFakeOpCount; ++i) {
    if (name == kOpNames[i]) {
      *op = static_cast<FakeOp>(i);
      return true;
    }
  }
  return false;
}

FakeDriver::FakeDriver(FakeConfig config) : state_(std::make_unique<detail::State>(config)) {
  FakeDriver* expected = nullptr;
  if (!detail::g_current.compare_exchange_strong(expected, this)) {
    std::fputs("allocshim fake driver: only one FakeDriver may exist at a time\n", stderr);
    std::abort();
  }
  std::call_once(detail::g_atfork_once, [] {
    pthread_atfork(detail::atfork_prepare, detail::atfork_release, detail::atfork_release);
  });
#define ALLOCSHIM_FAKE_FILL(name) table_.name = &detail::impl::name;
  ALLOCSHIM_FAKE_OPS(ALLOCSHIM_FAKE_FILL)
#undef ALLOCSHIM_FAKE_FILL
}

FakeDriver::~FakeDriver() { detail::g_current.store(nullptr); }

FakeDriver* FakeDriver::current() { return detail::g_current.load(std::memory_order_acquire); }

const FakeConfig& FakeDriver::config() const { return state_->config; }

void FakeDriver::fail_next(FakeOp op, Result result, int count, int skip) {
  std::lock_guard lock(state_->fail_mu);
  state_->failures[static_cast<std::size_t>(op)] = {result, count, skip};
  state_->any_failure.store(true);
}

void FakeDriver::clear_failures() {
  std::lock_guard lock(state_->fail_mu);
  state_->failures = {};
  state_->on_call = {};
  state_->any_failure.store(false);
}

void FakeDriver::on_call(FakeOp op, std::function<void()> fn) {
  std::lock_guard lock(state_->fail_mu);
  state_->on_call[static_cast<std::size_t>(op)] = std::move(fn);
  state_->any_failure.store(true);
}

void FakeDriver::set_param_layout(void* function,
                                  std::vector<std::pair<std::size_t, std::size_t>> params,
                                  bool kernel) {
  std::lock_guard lock(state_->mu);
  state_->layouts[kernel ? 1 : 0][function] = std::move(params);
}

namespace detail::impl {
namespace {
Result param_info(FakeOp op, int which, void* f, std::size_t i, std::size_t* offset,
                  std::size_t* size) {
  State& s = state();
  if (Result r = s.enter(op)) return r;
  std::lock_guard lock(s.mu);
  auto it = s.layouts[which].find(f);
  if (it == s.layouts[which].end()) return res::invalid_handle;
  if (i >= it->second.size() || !offset || !size) return res::invalid_value;
  *offset = it->second[i].first;
  *size = it->second[i].second;
  return res::ok;
}
}  // namespace
Result func_get_param_info(void* f, std::size_t i, std::size_t* offset, std::size_t* size) {
  return param_info(FakeOp::func_get_param_info, 0, f, i, offset, size);
}
Result kernel_get_param_info(void* k, std::size_t i, std::size_t* offset, std::size_t* size) {
  return param_info(FakeOp::kernel_get_param_info, 1, k, i, offset, size);
}
}  // namespace detail::impl

std::uint64_t FakeDriver::calls(FakeOp op) const {
  return state_->calls[static_cast<std::size_t>(op)].load();
}

std::uint64_t FakeDriver::total_calls() const {
  std::uint64_t n = 0;
  for (const auto& c : state_->calls) n += c.load();
  return n;
}

void FakeDriver::reset_calls() {
  for (auto& c : state_->calls) c.store(0);
}

std::size_t FakeDriver::capacity(int device) const {
  std::lock_guard lock(state_->mu);
  return state_->valid_device(device) ? state_->capacity[static_cast<std::size_t>(device)] : 0;
}

void FakeDriver::set_capacity(int device, std::size_t bytes) {
  std::lock_guard lock(state_->mu);
  if (state_->valid_device(device)) state_->capacity[static_cast<std::size_t>(device)] = bytes;
}

std::size_t FakeDriver::used(int device) const {
  std::lock_guard lock(state_->mu);
  return state_->valid_device(device) ? state_->used[static_cast<std::size_t>(device)] : 0;
}

std::size_t FakeDriver::host_used() const {
  std::lock_guard lock(state_->mu);
  return state_->host_used;
}

std::size_t FakeDriver::managed_used() const {
  std::lock_guard lock(state_->mu);
  return state_->managed_used;
}

std::size_t FakeDriver::live_allocations() const {
  std::lock_guard lock(state_->mu);
  std::size_t n = 0;
  for (const auto& [ptr, a] : state_->allocs)
    if (a.kind != detail::AllocKind::pool_import && a.kind != detail::AllocKind::ipc_open) ++n;
  return n;
}

std::vector<AdviceRecord> FakeDriver::advice() const {
  std::lock_guard lock(state_->mu);
  return state_->advice;
}

std::vector<PrefetchRecord> FakeDriver::prefetches() const {
  std::lock_guard lock(state_->mu);
  return state_->prefetches;
}

bool FakeDriver::peer_enabled(int from_device, int to_device) const {
  std::lock_guard lock(state_->mu);
  const std::pair<int, int> pair{from_device, to_device};
  return std::find(state_->peers.begin(), state_->peers.end(), pair) != state_->peers.end();
}

void FakeDriver::set_current_device(int device) {
  if (!state_->valid_device(device)) return;
  detail::t_current = {state_->instance_id,
                       state_->contexts[static_cast<std::size_t>(device)].get()};
}

}  // namespace allocshim::fake
