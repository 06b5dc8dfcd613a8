// The broker protocol: messages between an importer and an exporter's broker, and the socket
// plumbing under them.
//
// Transport: an abstract-namespace SOCK_SEQPACKET socket (os/unix_socket.h) named from the
// exporter's uid, pid and nonce. Both ends check the other's uid with SO_PEERCRED; no ptrace
// rights are ever needed (the exporter sends the fds itself, nothing takes them with pidfd_getfd).
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

#include "base/types.h"
#include "os/unix_socket.h"

namespace allocshim::ipc::wire {

inline constexpr std::uint32_t kMagic = 0x50495341;  // "ASIP"
inline constexpr std::uint16_t kVersion = 2;
inline constexpr std::size_t kFdsPerMessage = os::kMaxMessageFds;
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
  std::int32_t status = 0;  // a CUresult
  std::uint8_t kind = 0;    // ipc::Kind
  std::uint8_t reserved[3] = {};
  std::uint32_t pieces = 0;  // vmm: physical allocations, in address order; pool: 1
  std::int32_t device = 0;   // the exporter's ordinal of the memory's device (informational)
  std::uint64_t offset = 0;  // of the block from the start of the first piece
  std::uint64_t size = 0;    // of the block
  std::uint64_t total = 0;   // vmm: bytes of all pieces (the VA the importer reserves)
};

struct Pieces {
  Header h{kMagic, kVersion, Type::pieces};
  std::uint32_t first = 0;  // index of the first piece in this message
  std::uint32_t count = 0;  // pieces (and fds) in this message, 1..kFdsPerMessage
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

// The socket plumbing (os/unix_socket.h): the broker listens, importers connect, both check the
// other's uid.
using os::accept_from;
using os::close_all;
using os::connect_to;
using os::listen_on;
using os::recv_message;
using os::send_message;

}  // namespace allocshim::ipc::wire
