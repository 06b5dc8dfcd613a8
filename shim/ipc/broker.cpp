// The exporter's broker: one thread, started by the first export, serving the protocol of
// ipc/wire.h to importers of the same uid. It never blocks on one importer for longer than the
// I/O timeout, never trusts a message, and never holds the export table's mutex across I/O.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <system_error>

#include "base/log.h"
#include "ipc/exporter.h"
#include "os/thread.h"

namespace allocshim::ipc {

Result Exporter::start_broker() {
  listener_ = wire::listen_on(wire::socket_name(geteuid(), pid_, nonce_));
  if (listener_ < 0) {
    log::write(log::Level::error, "ipc: cannot listen for importers (errno %d)", errno);
    return res::map_failed;
  }
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(listener_);
    listener_ = -1;
    return res::map_failed;
  }
  bool ok = true;
  try {
    broker_ = os::start_thread([this] { serve(); });
    pthread_setname_np(broker_.native_handle(), "allocshim-ipc");
  } catch (const std::system_error&) {
    ok = false;
  }
  if (!ok) {
    for (int& fd : wake_) close(fd), fd = -1;
    close(listener_);
    listener_ = -1;
    return res::out_of_memory;
  }
  started_.store(true);
  return res::ok;
}

void Exporter::serve() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back(pollfd{wake_[0], POLLIN, 0});
    fds.push_back(pollfd{listener_, POLLIN, 0});
    for (const Connection& c : conns_) fds.push_back(pollfd{c.fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents != 0) break;
    bool dropped = false;
    for (std::size_t i = 0; i < conns_.size(); ++i) {
      if (fds[i + 2].revents == 0) continue;
      if (!serve_message(conns_[i])) {
        drop(conns_[i]);
        dropped = true;
      }
    }
    if (dropped) {
      std::lock_guard lock(conn_mu_);
      std::erase_if(conns_, [](const Connection& c) { return c.fd < 0; });
    }
    if (fds[1].revents != 0) accept_pending();
  }
  for (Connection& c : conns_) drop(c);
  std::lock_guard lock(conn_mu_);
  conns_.clear();
}

void Exporter::accept_pending() {
  for (;;) {
    bool refused = false;
    const int fd =
        wire::accept_from(listener_, options_.peer_uid, options_.io_timeout_ms, &refused);
    if (fd < 0) {
      if (!refused) return;  // nothing more pending
      refused_.fetch_add(1);
      continue;
    }
    if (conns_.size() >= options_.max_connections) {
      close(fd);
      continue;
    }
    std::lock_guard lock(conn_mu_);
    conns_.push_back(Connection{fd, {}});
  }
}

bool Exporter::serve_message(Connection& c) {
  wire::Request req;
  const int r = wire::recv_message(c.fd, &req, sizeof req);
  if (r == 0) return false;  // the importer closed or exited: its opens end with the connection
  if (r > 0 && req.reserved[0] == 0 && req.reserved[1] == 0 && req.reserved[2] == 0) {
    // A barred connection that asks again is not an importer that read the refusal.
    if (wire::valid(req.h, wire::Type::open) && !c.barred) return serve_open(c, req);
    if (wire::valid(req.h, wire::Type::close)) return serve_close(c, req);
  }
  bad_messages_.fetch_add(1);
  return false;
}

bool Exporter::serve_open(Connection& c, const wire::Request& req) {
  wire::Reply rep;
  Export e;
  bool found = false;
  {
    std::lock_guard lock(mu_);
    auto it = exports_.find(req.export_id);
    // The handle's fields must be the export's own: a forged or stale handle names nothing here.
    if (req.nonce == nonce_ && it != exports_.end() && !it->second.freed &&
        req.kind == static_cast<std::uint8_t>(it->second.kind) && it->second.offset == req.offset &&
        it->second.block.size == req.size && it->second.secret == req.secret) {
      // Counted before any driver call, so a free racing with this open keeps the block.
      ++it->second.opens;
      ++c.opens[req.export_id];
      ++open_imports_;
      e = it->second;
      found = true;
    }
  }
  if (found && stopping_.load(std::memory_order_acquire)) {
    std::vector<Release> none;
    std::lock_guard lock(mu_);
    close_one(c, req.export_id, &none);
    rep.status = res::invalid_value;
    return wire::send_message(c.fd, &rep, sizeof rep);
  }
  if (!found) {
    // Stale, forged or guessed: answered, and the connection opens nothing more (ipc/wire.h).
    refused_opens_.fetch_add(1);
    rep.status = res::invalid_value;
    c.barred = true;
    return wire::send_message(c.fd, &rep, sizeof rep) && !c.opens.empty();
  }
  rep.kind = static_cast<std::uint8_t>(e.kind);
  rep.pieces = e.kind == Kind::vmm ? static_cast<std::uint32_t>(e.pieces.size()) : 1;
  rep.device = e.block.device;
  rep.offset = e.offset;
  rep.size = e.block.size;
  rep.total = e.total;
  if (send_layout(c, e, rep)) return true;
  return false;  // the connection is dropped, and this open with it
}

// Exports the physical allocation mapped at each of `vas` as an fd; false (none left open) if the
// driver refuses one.
static bool export_pieces(const Driver& d, const std::vector<DevPtr>& vas, int* fds) {
  for (std::size_t i = 0; i < vas.size(); ++i) {
    MemHandle h = 0;
    Result r = d.mem_retain_allocation_handle(&h, vas[i]);
    if (r == res::ok) {
      r = d.mem_export_to_fd(&fds[i], h);
      d.mem_release(h);
    }
    if (r != res::ok) {
      wire::close_all(fds, i);
      return false;
    }
  }
  return true;
}

bool Exporter::send_layout(Connection& c, const Export& e, wire::Reply& rep) {
  if (e.ctx != nullptr) driver_.ctx_set_current(e.ctx);
  auto refuse = [&] {
    std::vector<Release> out;
    {
      std::lock_guard lock(mu_);
      close_one(c, e.id, &out);
    }
    release(out);
    rep.status = res::invalid_value;
    return wire::send_message(c.fd, &rep, sizeof rep);
  };
  if (e.kind == Kind::pool) {
    int fd = -1;
    if (driver_.mem_pool_export_to_fd(&fd, e.pool) != res::ok) return refuse();
    wire::PoolData data;
    data.pool_id = reinterpret_cast<std::uintptr_t>(e.pool);
    std::copy(std::begin(e.pool_data), std::end(e.pool_data), data.data);
    const bool ok = wire::send_message(c.fd, &rep, sizeof rep) &&
                    wire::send_message(c.fd, &data, sizeof data, &fd, 1);
    close(fd);
    return ok;
  }
  bool replied = false;
  for (std::size_t first = 0; first < e.pieces.size(); first += wire::kFdsPerMessage) {
    const std::size_t n = std::min(wire::kFdsPerMessage, e.pieces.size() - first);
    wire::Pieces msg;
    msg.first = static_cast<std::uint32_t>(first);
    msg.count = static_cast<std::uint32_t>(n);
    std::vector<DevPtr> vas(n);
    for (std::size_t i = 0; i < n; ++i) {
      vas[i] = e.pieces[first + i].va;
      msg.sizes[i] = e.pieces[first + i].size;
    }
    int fds[wire::kFdsPerMessage];
    if (!export_pieces(driver_, vas, fds)) return replied ? false : refuse();
    // The reply goes once the first batch is in hand, so a refusal can still be reported cleanly.
    bool ok = replied || wire::send_message(c.fd, &rep, sizeof rep);
    replied = true;
    ok = ok && wire::send_message(c.fd, &msg, sizeof msg, fds, n);
    wire::close_all(fds, n);
    if (!ok) return false;
  }
  return true;
}

bool Exporter::serve_close(Connection& c, const wire::Request& req) {
  std::vector<Release> out;
  bool ok = false;
  {
    std::lock_guard lock(mu_);
    if (req.nonce == nonce_ && c.opens.count(req.export_id) != 0) {
      close_one(c, req.export_id, &out);
      ok = true;
    }
  }
  // Given back before the reply: when cuIpcCloseMemHandle returns, the exporter is done with it.
  release(out);
  wire::Reply rep;
  rep.status = ok ? res::ok : res::invalid_value;
  return wire::send_message(c.fd, &rep, sizeof rep) && !(c.barred && c.opens.empty());
}

void Exporter::drop(Connection& c) {
  std::vector<Release> out;
  {
    std::lock_guard lock(mu_);
    while (!c.opens.empty()) close_one(c, c.opens.begin()->first, &out);
  }
  release(out);
  std::lock_guard lock(conn_mu_);  // fork must not see a closed fd number still listed
  close(c.fd);
  c.fd = -1;
}

}  // namespace allocshim::ipc
