// The broker protocol: messages between an importer and an exporter's broker, and the socket
// plumbing under them.
//
// Transport: an abstract-namespace UNIX socket (nothing on disk to clean up; gone when the exporter
// exits), SOCK_SEQPACKET so that every message arrives whole and alone with exactly its own file
// descriptors (SCM_RIGHTS), named from the exporter's uid, pid and nonce. Both ends check the other's
// uid with SO_PEERCRED; no ptrace rights are ever needed (the exporter sends the fds itself, nothing
// takes them with pidfd_getfd).
//
// Conversation on one connection, one request at a time:
//   importer: Request{open}     exporter: Reply, then (status ok) the layout:
//                                 vmm:  ceil(pieces / kFdsPerMessage) Pieces messages, fds attached
//                                 pool: one PoolData message, the pool's fd attached
//   importer: Request{close}    exporter: Reply
// The connection is the importer's lease: when it closes (the importer closed it or died), every
// import it still held is closed too. An open the exporter refuses (no such export, or a field or
// the secret is not the export's: a guess) bars the connection from further opens: the broker
// closes it at once, or, while it still leases imports, serves only their closes and ends it with
// the last one. A process that guesses secrets pays a new connection per guess.
//
// Every message is a fixed-size struct; a message of the wrong length, magic, version or type, a
// truncated one, or one carrying fds it should not, ends the conversation. Both ends are the same
// build on the same host, so structs go as they are in memory.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/types.h"

namespace allocshim::ipc::wire {

inline constexpr std::uint32_t kMagic = 0x50495341;  // "ASIP"
inline constexpr std::uint16_t kVersion = 2;
inline constexpr std::size_t kFdsPerMessage = 64;
// The most physical allocations one export may span (a block of 128 GiB made of 2 MiB handles).
inline constexpr std::uint32_t kMaxPieces = 65536;

enum class Type : std::uint16_t { open = 1, close = 2, reply = 3, pieces = 4, pool = 5 };

struct Header {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kVersion;
  Type type = Type::open;
};

// open: map export `export_id`; close: drop one open of it. `kind`, `nonce`, `offset`, `size` and
// `secret` come from the handle and must match the exporter's own record, or the handle is refused
// as forged.
struct Request {
  Header h;
  std::uint8_t kind = 0;  // ipc::Kind
  std::uint8_t reserved[3] = {};
  std::uint64_t nonce = 0;
  std::uint64_t export_id = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::uint64_t secret = 0;
};

struct Reply {
  Header h{kMagic, kVersion, Type::reply};
  std::int32_t status = 0;    // a CUresult
  std::uint8_t kind = 0;      // ipc::Kind
  std::uint8_t reserved[3] = {};
  std::uint32_t pieces = 0;   // vmm: physical allocations, in address order; pool: 1
  std::int32_t device = 0;    // the exporter's ordinal of the memory's device (informational)
  std::uint64_t offset = 0;   // of the block from the start of the first piece
  std::uint64_t size = 0;     // of the block
  std::uint64_t total = 0;    // vmm: bytes of all pieces (the VA the importer reserves)
};

struct Pieces {
  Header h{kMagic, kVersion, Type::pieces};
  std::uint32_t first = 0;   // index of the first piece in this message
  std::uint32_t count = 0;   // pieces (and fds) in this message, 1..kFdsPerMessage
  std::uint64_t sizes[kFdsPerMessage] = {};
};

struct PoolData {
  Header h{kMagic, kVersion, Type::pool};
  std::uint32_t reserved = 0;
  std::uint64_t pool_id = 0;  // the exporter's pool, so an importer imports each pool once
  unsigned char data[kIpcHandleBytes] = {};  // cuMemPoolExportPointer's CUmemPoolPtrExportData
};

// Whether `h` is a well-formed header of type `type` (magic, version).
bool valid(const Header& h, Type type);

// The abstract socket name of the broker of (uid, pid, nonce), as a sockaddr_un length + bytes.
std::string socket_name(uid_t uid, pid_t pid, std::uint64_t nonce);

// A listening socket bound to `name` (non-blocking, close-on-exec); -1 with errno on failure.
int listen_on(const std::string& name);
// A connection to `name` whose peer runs as `uid`; -1 if there is none (or it runs as another uid).
// Sends and receives time out after `timeout_ms`.
int connect_to(const std::string& name, uid_t uid, int timeout_ms);
// Accepts one pending connection whose peer runs as `uid`; -1 if none is pending or the peer was
// refused (its connection is then closed at once). *refused tells the two apart.
int accept_from(int listener, uid_t uid, int timeout_ms, bool* refused);

// Sends one message with `nfds` descriptors; false on any error (the peer is gone or stuck).
bool send_message(int fd, const void* data, std::size_t bytes, const int* fds = nullptr,
                  std::size_t nfds = 0);
// Receives one message of exactly `bytes` bytes carrying exactly `want_fds` descriptors into `fds`
// (close-on-exec). Returns 1 on success, 0 when the peer closed the connection, -1 on any error or a
// malformed message (wrong length, truncated, wrong number of fds); received fds are closed unless
// the call succeeds.
int recv_message(int fd, void* data, std::size_t bytes, int* fds = nullptr, std::size_t want_fds = 0);

void close_all(const int* fds, std::size_t n);

}  // namespace allocshim::ipc::wire
