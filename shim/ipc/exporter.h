// The exporting side of IPC: shim handles for blocks the core serves, and the broker that lets
// other processes map them.
//
// export_block() (from cuIpcGetMemHandle) records what the block is made of, checks once that the
// driver can export it, and starts the broker on the first export: a thread serving the socket of
// ipc/wire.h. Nothing listens in a process that never exported. The broker hands out file
// descriptors made on demand (never kept: an exporter of many blocks holds no fds for them):
//   vmm (and any VMM-mapped memory): each physical allocation under the block, found with the
//     driver's cuMemGetAddressRange (which answers the mapping of one allocation handle) and
//     cuMemRetainAllocationHandle, exported with cuMemExportToShareableHandle;
//   async_pool: the backend's pool (cuMemPoolExportToShareableHandle) and the block's
//     cuMemPoolExportPointer data.
//
// Lifetime: the broker counts every open per export and per connection. A block freed by the
// program while some process has it open is kept from its backend (on_free, called by Core::free)
// and given back when the last open closes: on a close message, or when an importer's connection
// ends because it exited or was killed. An export freed with nothing open is forgotten at once, so
// a stale handle is refused. Opens of a freed block are refused.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/core.h"
#include "ipc/handle.h"
#include "ipc/wire.h"

namespace allocshim::ipc {

struct ExporterOptions {
  uid_t peer_uid = geteuid();  // the only uid whose processes may connect
  int io_timeout_ms = 5000;    // a stuck importer cannot hold the broker longer than this
  std::size_t max_connections = 1024;
};

class Exporter final : public IpcHooks {
 public:
  explicit Exporter(Core& core, ExporterOptions options = {});
  // Stops the broker, detaches from the core and gives every kept block back.
  ~Exporter();
  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;

  // A shim handle for the block containing `ptr`. *passthrough: `ptr` is not memory a shim backend
  // serves (unknown, or native): the caller asks the driver instead.
  Result export_block(DevPtr ptr, IpcHandle* out, bool* passthrough);

  bool on_free(DevPtr ptr, const Block& block, const FreeRequest& req) override;
  // The device's context is being destroyed: its exports are forgotten (their handles go stale,
  // kept blocks are never given back: the driver frees them with the context).
  void on_context_dropped(int device) override;

  // The process is exiting (the CUDA runtime's teardown is next): the broker makes no more driver
  // calls; it refuses opens, and blocks still kept go with the process.
  void stop_serving() { stopping_.store(true, std::memory_order_release); }

  struct Info {
    std::size_t exports = 0;       // live exports (freed ones still open included)
    std::size_t open_imports = 0;  // opens not yet closed, over all importers
    std::size_t deferred = 0;      // freed blocks kept for importers
    std::size_t connections = 0;
    bool listening = false;
    std::uint64_t refused_peers = 0;  // connections of another uid
    std::uint64_t bad_messages = 0;   // malformed requests (their connection was dropped)
    std::uint64_t refused_opens = 0;  // opens naming no export, or with a wrong field or secret
    std::uint64_t released = 0;       // kept blocks given back
  };
  Info info() const;
  std::uint64_t nonce() const { return nonce_; }

  // fork: the child keeps none of this (no thread runs it there); it closes the sockets so that
  // the parent's importers see its connections end and nobody else answers under its name.
  void lock_for_fork();
  void unlock_after_fork();
  void abandon_after_fork();

 private:
  struct Piece {
    DevPtr va = 0;
    std::size_t size = 0;
  };
  struct Export {
    std::uint64_t id = 0;
    std::uint64_t secret = 0;  // random; an open must present it (ipc/handle.h)
    DevPtr base = 0;
    Block block;
    Kind kind = Kind::vmm;
    std::vector<Piece> pieces;  // vmm, in address order, contiguous
    std::uint64_t offset = 0;   // of the block from pieces[0].va
    std::uint64_t total = 0;
    Pool pool = nullptr;
    unsigned char pool_data[kIpcHandleBytes] = {};
    Context ctx = nullptr;  // the exporting thread's, made current on the broker for driver calls
    std::uint32_t opens = 0;
    bool freed = false;
  };
  struct Connection {
    int fd = -1;
    std::unordered_map<std::uint64_t, std::uint32_t>
        opens;            // export id -> opens over this connection
    bool barred = false;  // an open was refused: only closes are served, and it ends with the last
  };
  struct Release {
    DevPtr ptr;
    Block block;
    Context ctx;
  };

  // Builds `e` for the block at `base` (no lock held: driver calls).
  Result describe_vmm(Export& e) const;
  Result describe_pool(Export& e) const;
  Result start_broker();  // with mu_ held
  HandleFields fields_of(const Export& e) const;

  // A counting filter over exported block addresses: a free of a block never exported (nearly
  // all of them) costs a load, not the mutex.
  static std::size_t slot_of(DevPtr ptr);
  bool maybe_exported(DevPtr ptr) const;

  // Broker (broker.cpp), all on the broker thread.
  void serve();
  void accept_pending();
  bool serve_message(Connection& c);  // false: drop the connection
  bool serve_open(Connection& c, const wire::Request& req);
  bool serve_close(Connection& c, const wire::Request& req);
  // Sends the reply and the layout with its fds; false: drop the connection.
  bool send_layout(Connection& c, const Export& e, wire::Reply& rep);
  void drop(Connection& c);
  // Counts one open of `id` over `c` off; a freed export whose last open this was is queued to
  // `out`. With mu_ held.
  void close_one(Connection& c, std::uint64_t id, std::vector<Release>* out);
  void release(const std::vector<Release>& blocks);

  Core& core_;
  const Driver& driver_;
  const ExporterOptions options_;
  const std::uint64_t nonce_;
  const pid_t pid_;

  mutable std::mutex mu_;  // exports_, by_ptr_, next_id_, the counters below
  std::unordered_map<std::uint64_t, Export> exports_;
  std::unordered_map<DevPtr, std::uint64_t> by_ptr_;
  std::uint64_t next_id_ = 1;
  std::size_t open_imports_ = 0;
  std::size_t deferred_ = 0;
  std::uint64_t released_ = 0;
  std::array<std::atomic<std::uint16_t>, 4096> filter_{};
  // Pools exported to an fd once (see describe_pool); own mutex, since that runs without mu_.
  mutable std::mutex shared_mu_;
  mutable std::unordered_set<Pool> shared_pools_;

  // Broker state. conns_ is the broker thread's; conn_mu_ is held while it changes, so that fork
  // (abandon_after_fork) sees a consistent list.
  mutable std::mutex conn_mu_;
  std::vector<Connection> conns_;
  int listener_ = -1;
  int wake_[2] = {-1, -1};
  std::thread broker_;
  std::atomic<bool> started_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> refused_{0}, bad_messages_{0}, refused_opens_{0};
};

}  // namespace allocshim::ipc
