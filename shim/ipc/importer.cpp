#include "ipc/importer.h"

#include <poll.h>

#include <algorithm>

namespace allocshim::ipc {

Importer::Importer(const Driver& driver, ImporterOptions options)
    : driver_(driver), options_(options) {}

Importer::~Importer() {
  std::lock_guard lock(mu_);
  for (auto& [ptr, imp] : imports_) unmap(imp);
  imports_.clear();
  by_key_.clear();
  // Closing the connections ends their leases: the exporters count every open over them closed.
  for (auto& [key, c] : conns_) close_conn(c);
  for (const ConnPtr& c : retired_) close_conn(c);
}

// A connection never hears from its exporter unasked: one that is readable or hung up between
// requests belongs to an exporter that is gone (or misbehaves). Its imports stay mapped; the
// descriptor goes now, so that exporters that come and go never add up to EMFILE.
void Importer::reap_hung_up() {
  std::vector<ConnPtr> gone;
  std::vector<pollfd> fds;
  for (auto& [key, c] : conns_) fds.push_back(pollfd{c->fd, POLLIN | POLLRDHUP, 0});
  if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return;
  std::size_t i = 0;
  for (auto& [key, c] : conns_)
    if (fds[i++].revents != 0) gone.push_back(c);
  for (const ConnPtr& c : gone) {
    retire(c);
    if (c->fd >= 0) {  // still leasing imports, but there is nobody left to tell
      ::close(c->fd);
      c->fd = -1;
      std::erase(retired_, c);
    }
  }
}

Importer::ConnPtr Importer::connection(const HandleFields& h) {
  const auto key = std::make_pair(h.pid, h.nonce);
  if (auto it = conns_.find(key); it != conns_.end()) return it->second;
  reap_hung_up();
  const int fd =
      wire::connect_to(wire::socket_name(options_.peer_uid, static_cast<pid_t>(h.pid), h.nonce),
                       options_.peer_uid, options_.io_timeout_ms);
  if (fd < 0) return nullptr;  // no such exporter (any more), or not of our uid
  auto c = std::make_shared<Conn>();
  c->fd = fd;
  c->pid = h.pid;
  c->nonce = h.nonce;
  conns_.emplace(key, c);
  return c;
}

void Importer::retire(const ConnPtr& c) {
  if (c->retired) return;
  c->retired = true;
  if (auto it = conns_.find(std::make_pair(c->pid, c->nonce));
      it != conns_.end() && it->second == c)
    conns_.erase(it);
  if (c->leases == 0)
    close_conn(c);
  else
    retired_.push_back(c);
}

void Importer::close_conn(const ConnPtr& c) {
  if (c->fd >= 0) ::close(c->fd);
  c->fd = -1;
}

// A connection leasing nothing is closed: an importer holds one descriptor per exporter it has
// something open from, not per exporter it ever used.
void Importer::release_if_idle(const ConnPtr& c) {
  if (c->leases > 0) return;
  if (!c->retired) {
    c->retired = true;
    if (auto it = conns_.find(std::make_pair(c->pid, c->nonce));
        it != conns_.end() && it->second == c)
      conns_.erase(it);
  }
  std::erase(retired_, c);
  close_conn(c);
}

void Importer::drop_lease(const ConnPtr& c) {
  --c->leases;
  release_if_idle(c);
}

bool Importer::request(const ConnPtr& c, wire::Type type, const HandleFields& h, wire::Reply* rep) {
  wire::Request req;
  req.h.type = type;
  req.kind = static_cast<std::uint8_t>(h.kind);
  req.nonce = h.nonce;
  req.export_id = h.export_id;
  req.offset = h.offset;
  req.size = h.size;
  req.secret = h.secret;
  if (wire::send_message(c->fd, &req, sizeof req) &&
      wire::recv_message(c->fd, rep, sizeof *rep) == 1 && wire::valid(rep->h, wire::Type::reply))
    return true;
  retire(c);
  return false;
}

void Importer::grant_access(DevPtr va, std::size_t bytes, unsigned flags, int device) const {
  if ((flags & kLazyEnablePeerAccess) == 0) return;
  int count = 0;
  if (driver_.device_get_count(&count) != res::ok) return;
  // Every device that can reach the memory; those that cannot simply refuse.
  for (int d = 0; d < count && d < static_cast<int>(kMaxDevices); ++d)
    if (d != device) driver_.mem_set_access(va, bytes, d, true);
}

Result Importer::map_vmm(const ConnPtr& c, const wire::Reply& rep, unsigned flags, int device,
                         Import* imp, DevPtr* out, bool* broken) {
  if (rep.pieces == 0 || rep.pieces > wire::kMaxPieces || rep.total == 0 ||
      rep.offset >= rep.total || rep.size > rep.total - rep.offset) {
    *broken = true;
    return res::invalid_value;
  }
  DevPtr va = 0;
  if (const Result r = driver_.mem_address_reserve(&va, rep.total, 0, 0); r != res::ok) {
    *broken = true;  // the layout messages are left unread
    return r;
  }
  Result err = res::ok;
  std::size_t at = 0;
  for (std::uint32_t index = 0; index < rep.pieces;) {
    const std::uint32_t n = std::min<std::uint32_t>(wire::kFdsPerMessage, rep.pieces - index);
    wire::Pieces msg;
    int fds[wire::kFdsPerMessage];
    if (wire::recv_message(c->fd, &msg, sizeof msg, fds, n) != 1) {
      *broken = true;
      err = res::invalid_value;
      break;
    }
    const bool well_formed =
        wire::valid(msg.h, wire::Type::pieces) && msg.first == index && msg.count == n;
    if (!well_formed && err == res::ok) err = res::invalid_value;
    // After an error the rest is still read (and its fds closed): the conversation stays in step.
    for (std::uint32_t i = 0; i < n && err == res::ok; ++i) {
      const std::size_t size = msg.sizes[i];
      if (size == 0 || size > rep.total - at) {
        err = res::invalid_value;
        break;
      }
      MemHandle h = 0;
      err = driver_.mem_import_from_fd(&h, fds[i]);
      if (err != res::ok) break;
      err = driver_.mem_map(va + at, size, 0, h);
      driver_.mem_release(h);  // the mapping holds the memory from here on
      if (err != res::ok) break;
      imp->pieces.push_back(size);
      at += size;
    }
    wire::close_all(fds, n);
    index += n;
  }
  if (err == res::ok && at != rep.total) err = res::invalid_value;
  if (err == res::ok) err = driver_.mem_set_access(va, rep.total, device, true);
  imp->va = va;
  imp->total = rep.total;
  if (err != res::ok) {
    unmap(*imp);
    return err;
  }
  grant_access(va, rep.total, flags, device);
  *out = va + rep.offset;
  return res::ok;
}

Result Importer::map_pool(const ConnPtr& c, const HandleFields& h, unsigned flags, int device,
                          Import* imp, DevPtr* out, bool* broken) {
  wire::PoolData data;
  int fd = -1;
  if (wire::recv_message(c->fd, &data, sizeof data, &fd, 1) != 1) {
    *broken = true;
    return res::invalid_value;
  }
  if (!wire::valid(data.h, wire::Type::pool) || data.reserved != 0) {
    ::close(fd);
    return res::invalid_value;
  }
  const PoolKey key{h.pid, h.nonce, data.pool_id};
  auto it = pools_.find(key);
  if (it == pools_.end()) {
    Pool pool = nullptr;
    const Result r = driver_.mem_pool_import_from_fd(&pool, fd);
    ::close(fd);
    if (r != res::ok) return r;
    it = pools_.emplace(key, ImportedPool{pool, 0}).first;
  } else {
    ::close(fd);  // imported already: this process's pool stands for it
  }
  Pool pool = it->second.pool;
  // The pool's own device has access already (and may refuse to be told); others need it granted.
  driver_.mem_pool_set_access(pool, device, true);
  if ((flags & kLazyEnablePeerAccess) != 0) {
    int count = 0;
    if (driver_.device_get_count(&count) == res::ok)
      for (int d = 0; d < count && d < static_cast<int>(kMaxDevices); ++d)
        if (d != device) driver_.mem_pool_set_access(pool, d, true);
  }
  DevPtr p = 0;
  if (const Result r = driver_.mem_pool_import_pointer(&p, pool, data.data); r != res::ok) {
    if (it->second.refs == 0) {
      driver_.mem_pool_destroy(pool);
      pools_.erase(it);
    }
    return r;
  }
  ++it->second.refs;
  imp->pool_key = key;
  imp->pool_ptr = p;
  *out = p + h.offset;
  return res::ok;
}

void Importer::unmap(Import& imp) {
  if (imp.kind == Kind::vmm) {
    std::size_t at = 0;
    for (std::size_t size : imp.pieces) {
      driver_.mem_unmap(imp.va + at, size);
      at += size;
    }
    imp.pieces.clear();
    if (imp.va != 0) driver_.mem_address_free(imp.va, imp.total);
    imp.va = 0;
    return;
  }
  if (imp.pool_ptr == 0) return;
  // Freed here before the exporter hears of the close: it may free the block only after us.
  driver_.mem_free(imp.pool_ptr);
  imp.pool_ptr = 0;
  auto it = pools_.find(imp.pool_key);
  if (it != pools_.end() && --it->second.refs == 0) {
    driver_.mem_pool_destroy(it->second.pool);
    pools_.erase(it);
  }
}

Result Importer::open(const HandleFields& h, unsigned flags, DevPtr* out) {
  if (out == nullptr || (flags & ~kLazyEnablePeerAccess) != 0) return res::invalid_value;
  std::lock_guard lock(mu_);
  int device = 0;
  if (const Result r = driver_.ctx_get_device(&device); r != res::ok) return r;
  const auto key = std::make_tuple(h.pid, h.nonce, h.export_id, device);
  if (auto it = by_key_.find(key); it != by_key_.end()) {
    ++imports_.at(it->second).refs;
    *out = it->second;
    return res::ok;
  }
  const ConnPtr c = connection(h);
  if (!c) return res::invalid_value;
  wire::Reply rep;
  if (!request(c, wire::Type::open, h, &rep)) return res::invalid_value;
  if (rep.status != res::ok) {
    // The exporter knows no such export; it bars this connection from opening more (ipc/wire.h).
    retire(c);
    return res::invalid_value;
  }
  Import imp;
  imp.key = key;
  imp.handle = h;
  imp.conn = c;
  imp.kind = h.kind;
  bool broken = false;
  DevPtr ptr = 0;
  Result r = res::invalid_value;
  // The exporter's record must be the handle's, or the handle was forged from another one.
  if (rep.kind != static_cast<std::uint8_t>(h.kind) || rep.offset != h.offset || rep.size != h.size)
    broken = true;  // its layout messages are left unread
  else if (h.kind == Kind::vmm)
    r = map_vmm(c, rep, flags, device, &imp, &ptr, &broken);
  else
    r = map_pool(c, h, flags, device, &imp, &ptr, &broken);
  if (r != res::ok) {
    // The exporter counted this open. In step, say it is closed; out of step, retire the connection
    // (its close ends the open once the imports it leases are closed).
    wire::Reply ignored;
    if (broken)
      retire(c);
    else
      request(c, wire::Type::close, h, &ignored);
    release_if_idle(c);
    return r;
  }
  ++c->leases;
  by_key_.emplace(key, ptr);
  imports_.emplace(ptr, std::move(imp));
  *out = ptr;
  return res::ok;
}

Result Importer::close(DevPtr ptr, bool* ours) {
  std::lock_guard lock(mu_);
  auto it = imports_.find(ptr);
  *ours = it != imports_.end();
  if (!*ours) return res::ok;
  Import& imp = it->second;
  if (--imp.refs > 0) return res::ok;
  unmap(imp);
  const ConnPtr c = imp.conn;
  wire::Reply ignored;
  // Our mapping is gone whatever the exporter answers; if it cannot be told, the connection's end
  // tells it.
  if (!c->retired) request(c, wire::Type::close, imp.handle, &ignored);
  by_key_.erase(imp.key);
  imports_.erase(it);
  drop_lease(c);
  return res::ok;
}

std::size_t Importer::open_count() const {
  std::lock_guard lock(mu_);
  return imports_.size();
}

std::size_t Importer::connections() const {
  std::lock_guard lock(mu_);
  return conns_.size() + retired_.size();
}

std::size_t Importer::imported_pools() const {
  std::lock_guard lock(mu_);
  return pools_.size();
}

void Importer::abandon_after_fork() {
  for (auto& [key, c] : conns_) close_conn(c);
  for (const ConnPtr& c : retired_) close_conn(c);
}

}  // namespace allocshim::ipc
