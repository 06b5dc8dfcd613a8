// The export table and the free hook. The broker thread that serves it is in broker.cpp.
#include "ipc/exporter.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/log.h"
#include "os/unix_socket.h"

namespace allocshim::ipc {
namespace {

// An export's secret: from the kernel's generator only (a guessable one would protect nothing).
bool random_secret(std::uint64_t* out) {
  for (;;) {
    const ssize_t n = getrandom(out, sizeof *out, 0);
    if (n == static_cast<ssize_t>(sizeof *out)) return true;
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  // Kernels before getrandom(2) (3.17) still have the device.
  const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = read(fd, out, sizeof *out) == static_cast<ssize_t>(sizeof *out);
  close(fd);
  return ok;
}

// Logged once per process per reason: a program that exports in a loop must not flood stderr.
void log_once(std::atomic<bool>& said, const char* message, const char* detail) {
  if (!said.exchange(true)) log::write(log::Level::warn, "ipc: %s%s", message, detail);
}
std::atomic<bool> g_said_pool{false}, g_said_vmm{false}, g_said_kind{false}, g_said_managed{false},
    g_said_range{false};

// Which part of `p` sends a block like `b` to its backend: a rule (where it is written) or the
// defaults. Rules that match on the call stack cannot be re-evaluated here (the stack is gone).
std::string chosen_by(const policy::Policy& p, const Block& b) {
  if (p.uses_callsite()) return "a rule of " + p.source + " (it matches on the call stack)";
  const policy::Decision d = policy::match(p, b.size, b.api, b.device);
  if (d.rule < 0) return "the default backend of " + p.source;
  const policy::Rule& r = p.rules[static_cast<std::size_t>(d.rule)];
  return "the rule at " + p.source + ":" + std::to_string(r.line) + ":" + std::to_string(r.column);
}

}  // namespace

Exporter::Exporter(Core& core, ExporterOptions options)
    : core_(core),
      driver_(core.driver()),
      options_(options),
      nonce_(os::random_name_part()),
      pid_(getpid()) {
  core_.set_ipc(this);
}

Exporter::~Exporter() {
  core_.set_ipc(nullptr);
  if (started_.load()) {
    const char byte = 1;
    ssize_t ignored = ::write(wake_[1], &byte, 1);
    (void)ignored;
    broker_.join();  // drops every connection: their opens are counted off
  }
  std::vector<Release> kept;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, e] : exports_)
      if (e.freed) kept.push_back(Release{e.base, e.block, e.ctx});
    exports_.clear();
    by_ptr_.clear();
  }
  release(kept);
  for (int& fd : wake_)
    if (fd >= 0) close(fd);
  if (listener_ >= 0) close(listener_);
}

std::size_t Exporter::slot_of(DevPtr ptr) {
  return static_cast<std::size_t>(((ptr >> 8) * 0x9e3779b97f4a7c15ull) >> 52);  // 12 bits
}

bool Exporter::maybe_exported(DevPtr ptr) const {
  return filter_[slot_of(ptr)].load(std::memory_order_acquire) != 0;
}

HandleFields Exporter::fields_of(const Export& e) const {
  HandleFields f;
  f.pid = static_cast<std::uint32_t>(pid_);
  f.nonce = nonce_;
  f.export_id = e.id;
  f.offset = e.offset;
  f.size = e.block.size;
  f.secret = e.secret;
  f.kind = e.kind;
  return f;
}

Result Exporter::describe_vmm(Export& e) const {
  const DevPtr end = e.base + (e.block.size > 0 ? e.block.size : 1);
  for (DevPtr at = e.base; at < end;) {
    DevPtr base = 0;
    std::size_t size = 0;
    // The backend's own record of its pieces where it keeps one (host: on host-located VMM memory
    // driver 580 answers success with base 0); otherwise the driver, which on VMM memory
    // answers the mapping of one physical allocation.
    if ((!core_.physical(e.block, at, &base, &size) &&
         driver_.mem_get_address_range(&base, &size, at) != res::ok) ||
        size == 0 || base > at || at - base >= size || (!e.pieces.empty() && base != at)) {
      log_once(g_said_range,
               "cannot find the physical allocations under the block: ", "cannot export it");
      return res::invalid_value;
    }
    if (e.pieces.size() >= wire::kMaxPieces) return res::invalid_value;
    if (e.pieces.empty()) {
      // Exportable at all? (Chunks must have been created with POSIX-FD handles.) Checked now, so
      // that cuIpcGetMemHandle fails where native IPC would, not the importer later. Checked on
      // the first piece only: a backend creates all its chunks with the same handle types, and
      // one cuMemExportToShareableHandle costs about a millisecond, so checking every piece would
      // make a large block's handle cost that per 2 MiB chunk (ipc_bench).
      MemHandle h = 0;
      if (driver_.mem_retain_allocation_handle(&h, at) != res::ok) {
        log_once(g_said_kind, "memory is neither VMM-mapped nor pooled: ", "cannot export it");
        return res::invalid_value;
      }
      int fd = -1;
      const Result r = driver_.mem_export_to_fd(&fd, h);
      driver_.mem_release(h);
      if (r != res::ok) {
        log_once(g_said_vmm,
                 "VMM memory not exportable (chunks created without POSIX-FD handles): ",
                 "cuIpcGetMemHandle fails on it");
        return res::invalid_value;
      }
      close(fd);
      e.offset = e.base - base;
    }
    e.pieces.push_back(Piece{base, size});
    e.total += size;
    at = base + size;
  }
  return e.pieces.empty() ? res::invalid_value : res::ok;
}

Result Exporter::describe_pool(Export& e) const {
  const Backend& b = core_.backend(e.block.backend);
  e.pool = b.ipc_pool(e.block.device);
  if (e.pool == nullptr) return res::invalid_value;
  {
    // The driver exports a pointer only from a pool that is already shared: before the pool has
    // been exported to an fd once, cuMemPoolExportPointer answers CUDA_ERROR_INVALID_VALUE (driver
    // 580; tests/gpu/pool_export_probe.cpp). The fd itself is not needed
    // here: the broker makes its own for each importer.
    std::lock_guard lock(shared_mu_);
    if (!shared_pools_.count(e.pool)) {
      int fd = -1;
      if (driver_.mem_pool_export_to_fd(&fd, e.pool) == res::ok) {
        close(fd);
        shared_pools_.insert(e.pool);
      }
    }
  }
  if (driver_.mem_pool_export_pointer(e.pool_data, e.base) != res::ok) {
    // Like native IPC on memory it cannot export: the program gets the error, the log says why.
    log_once(g_said_pool, "async_pool memory is exportable only from a pool created for it: ",
             "the policy sets `ipc = false` on the backend, or the device has no POSIX-FD handles");
    return res::invalid_value;
  }
  e.offset = 0;
  e.total = e.block.size;
  return res::ok;
}

Result Exporter::export_block(DevPtr ptr, IpcHandle* out, bool* passthrough) {
  *passthrough = false;
  if (out == nullptr) return res::invalid_value;
  DevPtr base = 0;
  Block block;
  if (!core_.lookup(ptr, &base, &block) || block.backend >= core_.backend_count() ||
      core_.backend(block.backend).kind() == BackendKind::native) {
    // Not the shim's memory (or served by the driver as it is): native IPC is exact for it.
    *passthrough = true;
    return res::ok;
  }
  {
    std::lock_guard lock(mu_);
    if (auto it = by_ptr_.find(base); it != by_ptr_.end()) {
      encode(fields_of(exports_.at(it->second)), out);
      return res::ok;
    }
  }

  if (core_.backend(block.backend).kind() == BackendKind::managed) {
    // Managed memory cannot be shared by CUDA IPC at all; the program asked for cudaMalloc memory,
    // which natively it could share, so say which part of the policy made it managed.
    if (!g_said_managed.exchange(true))
      log::write(
          log::Level::error,
          "ipc: cudaIpcGetMemHandle refused: the block was served by backend \"%s\" (managed "
          "memory, which CUDA IPC cannot share), chosen by %s; route memory the program shares "
          "to another backend",
          core_.backend(block.backend).name().c_str(), chosen_by(core_.policy(), block).c_str());
    return res::invalid_value;
  }
  Export e;
  e.base = base;
  e.block = block;
  e.kind = core_.backend(block.backend).kind() == BackendKind::async_pool ? Kind::pool : Kind::vmm;
  if (e.block.size == 0) return res::invalid_value;
  const Result r = e.kind == Kind::pool ? describe_pool(e) : describe_vmm(e);
  if (r != res::ok) return r;
  if (driver_.ctx_get_current(&e.ctx) != res::ok) e.ctx = nullptr;
  if (!random_secret(&e.secret)) {
    log::write(log::Level::error,
               "ipc: no random numbers for the handle's secret (errno %d): not exported", errno);
    return res::unknown;
  }

  std::lock_guard lock(mu_);
  if (!started_.load()) {
    if (const Result s = start_broker(); s != res::ok) return s;
  }
  if (auto it = by_ptr_.find(base); it != by_ptr_.end()) {  // another thread exported it meanwhile
    encode(fields_of(exports_.at(it->second)), out);
    return res::ok;
  }
  e.id = next_id_++;
  encode(fields_of(e), out);
  core_.on_exported(base, block);
  by_ptr_.emplace(base, e.id);
  filter_[slot_of(base)].fetch_add(1, std::memory_order_release);
  exports_.emplace(e.id, std::move(e));
  return res::ok;
}

bool Exporter::on_free(DevPtr ptr, const Block& block, const FreeRequest& req) {
  if (__builtin_expect(!maybe_exported(ptr), 1)) return false;
  {
    std::lock_guard lock(mu_);
    auto it = by_ptr_.find(ptr);
    if (it == by_ptr_.end()) return false;
    const std::uint64_t id = it->second;
    by_ptr_.erase(it);
    filter_[slot_of(ptr)].fetch_sub(1, std::memory_order_release);
    Export& e = exports_.at(id);
    if (e.opens == 0) {
      exports_.erase(id);  // nobody has it: the handle goes stale with the free
      return false;
    }
    e.freed = true;
    e.block = block;
    ++deferred_;
  }
  // cuMemFree synchronizes; the backend would have done so for `device` frees. The program's
  // side of the free keeps that meaning even though the block itself is kept.
  if (block.free_sync == FreeSync::device && !req.async) driver_.ctx_synchronize();
  return true;
}

void Exporter::on_context_dropped(int device) {
  {
    std::lock_guard lock(mu_);
    for (auto it = exports_.begin(); it != exports_.end();) {
      const Export& e = it->second;
      if (e.block.device != device) {
        ++it;
        continue;
      }
      if (e.freed) {
        --deferred_;
      } else if (by_ptr_.erase(e.base) == 1) {
        filter_[slot_of(e.base)].fetch_sub(1, std::memory_order_release);
      }
      it = exports_.erase(it);
    }
  }
  // A new pool may get a destroyed one's handle: it must be shared afresh.
  std::lock_guard lock(shared_mu_);
  shared_pools_.clear();
}

void Exporter::close_one(Connection& c, std::uint64_t id, std::vector<Release>* out) {
  auto ci = c.opens.find(id);
  if (ci == c.opens.end()) return;
  if (--ci->second == 0) c.opens.erase(ci);
  --open_imports_;
  auto it = exports_.find(id);
  if (it == exports_.end()) return;
  Export& e = it->second;
  if (--e.opens == 0 && e.freed) {
    out->push_back(Release{e.base, e.block, e.ctx});
    --deferred_;
    exports_.erase(it);
  }
}

void Exporter::release(const std::vector<Release>& blocks) {
  if (stopping_.load(std::memory_order_acquire)) return;  // the driver may be torn down already
  for (const Release& r : blocks) {
    // The backends expect the context of the device they serve (the broker thread has none).
    if (r.ctx != nullptr) driver_.ctx_set_current(r.ctx);
    core_.release_deferred(r.ptr, r.block);
  }
  if (!blocks.empty()) {
    std::lock_guard lock(mu_);
    released_ += blocks.size();
  }
}

Exporter::Info Exporter::info() const {
  Info i;
  std::lock_guard lock(mu_);
  i.exports = exports_.size();
  i.open_imports = open_imports_;
  i.deferred = deferred_;
  i.released = released_;
  i.listening = listener_ >= 0;
  i.refused_peers = refused_.load();
  i.bad_messages = bad_messages_.load();
  i.refused_opens = refused_opens_.load();
  {
    std::lock_guard c(conn_mu_);
    i.connections = conns_.size();
  }
  return i;
}

void Exporter::lock_for_fork() {
  mu_.lock();
  conn_mu_.lock();
}

void Exporter::unlock_after_fork() {
  conn_mu_.unlock();
  mu_.unlock();
}

void Exporter::abandon_after_fork() {
  core_.set_ipc(nullptr);  // frees in the child must not wait for this object's (held) mutex
  for (const Connection& c : conns_)
    if (c.fd >= 0) close(c.fd);
  for (int fd : wake_)
    if (fd >= 0) close(fd);
  if (listener_ >= 0) close(listener_);
  // The object itself is leaked by the caller: its thread does not exist here and its mutexes
  // stay held, so it must never be used or destroyed again.
}

}  // namespace allocshim::ipc
