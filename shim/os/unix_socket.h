// Messages with file descriptors between processes of one user: SOCK_SEQPACKET sockets in the
// abstract namespace (nothing on disk to clean up; a name goes when its listener closes), so that
// every message arrives whole and alone with exactly its own descriptors (SCM_RIGHTS). Any local
// process can bind or connect to an abstract name, so both ends check who the other is
// (SO_PEERCRED) before anything is sent or believed.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace allocshim::os {

// The most descriptors one message carries, and the longest message.
inline constexpr std::size_t kMaxMessageFds = 64;
inline constexpr std::size_t kMaxMessageBytes = 4096;

// A random, nonzero number for the random part of a socket's name (getrandom; where the kernel
// has none, time and pid, which still tell processes apart in practice).
std::uint64_t random_name_part();

// A listening socket bound to `name` (an abstract name: name[0] is '\0'; non-blocking,
// close-on-exec); -1 with errno on failure (EADDRINUSE: another process holds the name).
int listen_on(const std::string& name);
// A connection to `name` whose peer runs as `uid` and, when `pid` > 0, is process `pid`; -1 if there
// is none (or the peer is someone else: its connection is closed at once). Sends and receives time
// out after `timeout_ms`. A listener whose backlog is full is waited for `connect_ms` at most
// (default: `timeout_ms`), never in the kernel.
int connect_to(const std::string& name, uid_t uid, int timeout_ms, pid_t pid = 0,
               int connect_ms = -1);
// Accepts one pending connection whose peer runs as `uid` (or as root, with `or_root`); -1 if none
// is pending or the peer was refused (its connection is then closed at once). *refused tells the
// two apart; *peer_pid (if given) is the peer's pid. The connection blocks, bounded by
// `timeout_ms`.
int accept_from(int listener, uid_t uid, int timeout_ms, bool* refused, pid_t* peer_pid = nullptr,
                bool or_root = false);
// Whether a message (or the peer's close) waits on `fd` now, or within `timeout_ms`.
bool readable(int fd, int timeout_ms = 0);

// Sends one message with `nfds` descriptors; false on any error (the peer is gone or stuck).
bool send_message(int fd, const void* data, std::size_t bytes, const int* fds = nullptr,
                  std::size_t nfds = 0);
// Receives one message of exactly `bytes` bytes carrying exactly `want_fds` descriptors into `fds`
// (close-on-exec). Returns 1 on success, 0 when the peer closed the connection, -1 on any error or a
// malformed message (wrong length, truncated, wrong number of fds); received fds are closed unless
// the call succeeds.
int recv_message(int fd, void* data, std::size_t bytes, int* fds = nullptr,
                 std::size_t want_fds = 0);
// recv_message for a message of up to `bytes` bytes with up to `max_fds` descriptors: returns the
// bytes received (>0; *nfds the descriptors, which are the caller's), 0 when the peer closed, -1
// on an error or a message longer than `bytes` or with more descriptors (nothing is then kept).
long recv_any(int fd, void* data, std::size_t bytes, int* fds, std::size_t max_fds,
              std::size_t* nfds);

void close_all(const int* fds, std::size_t n);

}  // namespace allocshim::os
