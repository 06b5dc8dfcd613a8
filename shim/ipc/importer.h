// The importing side of IPC: cuIpcOpenMemHandle / cuIpcCloseMemHandle of shim handles.
//
// open() asks the exporter's broker for the layout and the fds (ipc/wire.h), then maps them:
//   vmm:  every physical allocation is imported (cuMemImportFromShareableHandle), mapped in order
//         into one new VA reservation and released (the mapping holds it); access is granted to the
//         current device, and with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS to every other device that
//         can have it. The pointer returned is the reservation's start plus the block's offset.
//   pool: the pool is imported once per exporter pool (cuMemPoolImportFromShareableHandle) and
//         the block imported with cuMemPoolImportPointer.
// Every received fd is closed once imported. As with the driver, opening a handle this context
// (here: device) has open already returns the same pointer and counts a reference; close() drops
// one, and the last one unmaps (or frees the imported pointer) and tells the exporter.
//
// One connection per exporter carries all of this process's requests to it, one at a time, and is
// the lease on everything imported over it: if this process dies, the exporter counts those opens
// closed. It is closed as soon as it leases nothing (the last import from that exporter closed), and
// when its exporter is found gone (checked before each new connection). A conversation that goes
// wrong midway (the exporter stalls past the timeout, or sends something malformed) or an open the
// exporter refuses (which bars the connection, ipc/wire.h) retires it: later requests use a new
// one, and the retired one is closed when the imports it leases are.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "base/driver.h"
#include "ipc/handle.h"
#include "ipc/wire.h"

namespace allocshim::ipc {

struct ImporterOptions {
  uid_t peer_uid = geteuid();  // the exporter must run as this uid
  int io_timeout_ms = 5000;
};

// cuIpcOpenMemHandle's only flag.
inline constexpr unsigned kLazyEnablePeerAccess = 0x1;

class Importer {
 public:
  explicit Importer(const Driver& driver, ImporterOptions options = {});
  // Unmaps whatever is still open and closes every connection.
  ~Importer();
  Importer(const Importer&) = delete;
  Importer& operator=(const Importer&) = delete;

  // Maps the export `h` names; CUDA_ERROR_INVALID_VALUE for a handle no live exporter knows (forged,
  // stale, its exporter gone) or bad flags.
  Result open(const HandleFields& h, unsigned flags, DevPtr* out);
  // Closes a pointer open() returned. *ours: false if it is not one (the caller forwards it).
  Result close(DevPtr ptr, bool* ours);

  std::size_t open_count() const;   // distinct open mappings
  std::size_t connections() const;  // open connections to exporters, retired ones included
  std::size_t imported_pools() const;

  void lock_for_fork() { mu_.lock(); }
  void unlock_after_fork() { mu_.unlock(); }
  // The child closes its copies of the connections, so that an exporter sees this process's
  // leases end when this process does, not when its children do.
  void abandon_after_fork();

 private:
  struct Conn {
    int fd = -1;  // -1 once closed (its exporter gone) while imports still point at it
    std::uint32_t pid = 0;
    std::uint64_t nonce = 0;
    std::size_t leases = 0;  // imports open over it
    bool retired = false;
  };
  using ConnPtr = std::shared_ptr<Conn>;
  using PoolKey = std::tuple<std::uint32_t, std::uint64_t, std::uint64_t>;  // pid, nonce, pool id
  struct ImportedPool {
    Pool pool = nullptr;
    std::size_t refs = 0;
  };
  struct Import {
    std::tuple<std::uint32_t, std::uint64_t, std::uint64_t, int>
        key;  // pid, nonce, export id, device
    HandleFields handle;
    ConnPtr conn;
    std::uint32_t refs = 1;
    Kind kind = Kind::vmm;
    DevPtr va = 0;                    // vmm: the reservation
    std::vector<std::size_t> pieces;  // vmm: the mapped allocations, in order from va
    std::size_t total = 0;
    PoolKey pool_key{};  // pool
    DevPtr pool_ptr = 0;
  };

  ConnPtr connection(const HandleFields& h);  // the live connection to h's exporter, or null
  void reap_hung_up();
  void retire(const ConnPtr& c);
  void release_if_idle(const ConnPtr& c);
  void close_conn(const ConnPtr& c);
  // One request and its reply; false (connection retired) if the conversation failed.
  bool request(const ConnPtr& c, wire::Type type, const HandleFields& h, wire::Reply* rep);
  // Read the layout that follows an open's reply and map it; *out: the block's address here.
  // *broken: the conversation fell out of step (the connection must be retired).
  Result map_vmm(const ConnPtr& c, const wire::Reply& rep, unsigned flags, int device, Import* imp,
                 DevPtr* out, bool* broken);
  Result map_pool(const ConnPtr& c, const HandleFields& h, unsigned flags, int device, Import* imp,
                  DevPtr* out, bool* broken);
  void grant_access(DevPtr va, std::size_t bytes, unsigned flags, int device) const;
  void unmap(Import& imp);  // undoes map_vmm / map_pool
  void drop_lease(const ConnPtr& c);

  const Driver& driver_;
  const ImporterOptions options_;
  mutable std::mutex mu_;
  std::map<std::pair<std::uint32_t, std::uint64_t>, ConnPtr> conns_;  // live, by (pid, nonce)
  std::vector<ConnPtr> retired_;                                      // still leasing imports
  std::unordered_map<DevPtr, Import> imports_;                        // by returned pointer
  std::map<std::tuple<std::uint32_t, std::uint64_t, std::uint64_t, int>, DevPtr> by_key_;
  std::map<PoolKey, ImportedPool> pools_;
};

}  // namespace allocshim::ipc
