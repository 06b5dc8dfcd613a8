// See fuzz_wire.h.
#include "fuzz_wire.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "ipc/handle.h"
#include "ipc/wire.h"

namespace allocshim::ipc::fuzz {
namespace {

// The lowest free descriptor number: the kernel hands out the lowest, so a descriptor leaked by a
// call shows up as a different answer after it.
int lowest_free_fd() {
  const int fd = dup(0);
  if (fd >= 0) close(fd);
  return fd;
}

std::string check_handle(const std::uint8_t* data, std::size_t size) {
  IpcHandle h{};
  if (size) std::memcpy(h.bytes, data, size < kIpcHandleBytes ? size : kIpcHandleBytes);
  HandleFields f;
  const Decoded d = decode(h, &f);
  if (d == Decoded::foreign && has_magic(h)) return "a handle with the magic decoded as foreign";
  if (d != Decoded::foreign && !has_magic(h))
    return "a handle without the magic decoded as the shim's";
  if (d == Decoded::ours) {
    // Only what encode() writes is accepted: the fields encode back to the very same bytes.
    IpcHandle again{};
    encode(f, &again);
    if (std::memcmp(again.bytes, h.bytes, kIpcHandleBytes) != 0)
      return "an accepted handle is not canonical";
  }
  // Fields taken from the input round-trip whenever they are ones an exporter issues.
  HandleFields g;
  std::uint64_t w[5] = {};
  if (size) std::memcpy(w, data, size < sizeof w ? size : sizeof w);
  g.pid = static_cast<std::uint32_t>(w[0]);
  g.nonce = w[1];
  g.export_id = w[2];
  g.offset = w[3];
  g.size = w[4];
  g.kind = (w[0] >> 32) & 1 ? Kind::pool : Kind::vmm;
  IpcHandle e{};
  encode(g, &e);
  HandleFields back;
  const bool issuable = g.pid != 0 && g.export_id != 0 && g.size != 0 && g.offset <= ~g.size;
  const Decoded r = decode(e, &back);
  if (issuable != (r == Decoded::ours)) return "an encoded handle does not decode as it should";
  if (r == Decoded::ours &&
      (back.pid != g.pid || back.nonce != g.nonce || back.export_id != g.export_id ||
       back.offset != g.offset || back.size != g.size || back.kind != g.kind))
    return "a handle's fields changed on the way";
  return {};
}

// One message of the input's bytes with `nfds` descriptors sent raw (sendmsg, as a rogue peer
// would), received with recv_message as a message of `bytes` bytes and `want` descriptors.
std::string check_message(int tx, int rx, const std::uint8_t* data, std::size_t size,
                          std::size_t nfds, std::size_t bytes, std::size_t want) {
  const int before = lowest_free_fd();
  int fds[wire::kFdsPerMessage + 8];
  for (std::size_t i = 0; i < nfds; ++i) fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
  iovec iov{const_cast<std::uint8_t*>(data), size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof fds)];
  if (nfds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  const bool sent = sendmsg(tx, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(size);
  for (std::size_t i = 0; i < nfds; ++i) close(fds[i]);
  if (!sent) return lowest_free_fd() == before ? "" : "descriptors leaked by a failed send";
  alignas(8) unsigned char out[sizeof(wire::Pieces)];
  int got[wire::kFdsPerMessage];
  const int r = wire::recv_message(rx, out, bytes, got, want);
  const bool should = size == bytes && nfds == want && size > 0;
  if (r == 1) {
    if (!should) return "a message of the wrong length or descriptor count was accepted";
    for (std::size_t i = 0; i < want; ++i) close(got[i]);
    if (std::memcmp(out, data, bytes) != 0) return "a message's bytes changed on the way";
  } else if (should) {
    return "a well-formed message was refused";
  }
  if (lowest_free_fd() != before) return "a received descriptor was leaked";
  return {};
}

}  // namespace

std::string check_input(const std::uint8_t* data, std::size_t size) {
  if (std::string f = check_handle(data, size); !f.empty()) return f;
  if (size < 2) return {};
  // A connection of the broker's kind, made once (the fuzzer calls this millions of times).
  static int pair[2] = {-1, -1};
  if (pair[0] < 0 && socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) return {};
  static const std::size_t kSizes[] = {sizeof(wire::Request), sizeof(wire::Reply),
                                       sizeof(wire::Pieces), sizeof(wire::PoolData)};
  const std::size_t bytes = kSizes[data[0] & 3];
  const std::size_t nfds = (data[0] >> 2) % (wire::kFdsPerMessage + 8);
  const std::size_t want =
      data[1] % 2 ? nfds % (wire::kFdsPerMessage + 1) : data[1] % (wire::kFdsPerMessage + 1);
  // The message is the input after the two control bytes, padded to the expected size when the
  // control byte asks for it, so that well-formed messages are common.
  std::string msg(reinterpret_cast<const char*>(data + 2), size - 2);
  if (data[1] & 0x80) msg.resize(bytes);
  return check_message(pair[0], pair[1], reinterpret_cast<const std::uint8_t*>(msg.data()),
                       msg.size(), nfds, bytes, want);
}

}  // namespace allocshim::ipc::fuzz
