#include "ipc/handle.h"

#include <cstring>

namespace allocshim::ipc {
namespace {

// Not ASCII text and not a small integer or an address: the first bytes of a driver handle are
// neither likely to be this nor anything a program writes by accident.
constexpr unsigned char kMagic[8] = {0xa1, 0x5c, 0x5e, 0x1d, 0x1c, 0xc9, 0x5e, 0x7a};
constexpr std::size_t kChecked = 56;  // bytes covered by the checksum

// FNV-1a with a final avalanche (splitmix64's): cheap, and a single changed bit changes the sum.
std::uint64_t checksum(const unsigned char* bytes, std::size_t n) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= bytes[i];
    h *= 0x100000001b3ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

template <class T>
void put(unsigned char* at, T v) {
  std::memcpy(at, &v, sizeof v);
}

template <class T>
T get(const unsigned char* at) {
  T v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

}  // namespace

bool has_magic(const IpcHandle& handle) {
  return std::memcmp(handle.bytes, kMagic, sizeof kMagic) == 0;
}

void encode(const HandleFields& f, IpcHandle* out) {
  unsigned char* b = out->bytes;
  std::memset(b, 0, kIpcHandleBytes);
  std::memcpy(b, kMagic, sizeof kMagic);
  put<std::uint16_t>(b + 8, kHandleVersion);
  b[10] = static_cast<unsigned char>(f.kind);
  put<std::uint32_t>(b + 12, f.pid);
  put<std::uint64_t>(b + 16, f.nonce);
  put<std::uint64_t>(b + 24, f.export_id);
  put<std::uint64_t>(b + 32, f.offset);
  put<std::uint64_t>(b + 40, f.size);
  put<std::uint64_t>(b + 48, f.secret);
  put<std::uint64_t>(b + kChecked, checksum(b, kChecked));
}

Decoded decode(const IpcHandle& handle, HandleFields* out) {
  const unsigned char* b = handle.bytes;
  if (!has_magic(handle)) return Decoded::foreign;
  if (get<std::uint64_t>(b + kChecked) != checksum(b, kChecked)) return Decoded::corrupt;
  if (get<std::uint16_t>(b + 8) != kHandleVersion || b[11] != 0) return Decoded::corrupt;
  HandleFields f;
  const unsigned kind = b[10];
  if (kind != static_cast<unsigned>(Kind::vmm) && kind != static_cast<unsigned>(Kind::pool))
    return Decoded::corrupt;
  f.kind = static_cast<Kind>(kind);
  f.pid = get<std::uint32_t>(b + 12);
  f.nonce = get<std::uint64_t>(b + 16);
  f.export_id = get<std::uint64_t>(b + 24);
  f.offset = get<std::uint64_t>(b + 32);
  f.size = get<std::uint64_t>(b + 40);
  f.secret = get<std::uint64_t>(b + 48);
  // A pid of 0 or an id of 0 is never issued; a block of 0 bytes is never exported.
  if (f.pid == 0 || f.export_id == 0 || f.size == 0 || f.offset > ~f.size) return Decoded::corrupt;
  if (out) *out = f;
  return Decoded::ours;
}

}  // namespace allocshim::ipc
