// The shim's own IPC handle: 64 bytes, the size of CUipcMemHandle, so it travels wherever a program
// already sends the driver's handle (a pipe, a file, an MPI message, a Python pickle).
//
// A shim handle names an export in another process running under allocshim: which process (pid and
// a random per-process nonce, so a handle from a dead process whose pid was reused is stale, not
// misdirected), which export there (an id the exporter never reuses), what the importer should
// find when it asks (the block's offset inside the exported memory and its size, cross-checked
// against the exporter's answer), and the export's secret: 64 random bits the broker checks, so that
// a process that can reach the broker's socket (the pid and nonce are in its name, which
// /proc/net/unix shows) but was never given the handle cannot guess its way to the memory. Eight
// magic bytes tell it apart from the driver's handles, which pass through untouched; a 64-bit
// checksum over the rest makes an accidental match with a native handle's bytes practically
// impossible and catches truncated or altered handles.
//
// Layout (little-endian, as both ends run on one host):
//   [0, 8)   magic                      [16, 24) nonce
//   [8, 10)  version                    [24, 32) export id
//   [10]     kind (Kind)                [32, 40) offset of the block in the exported memory
//   [11]     reserved, 0                [40, 48) block size
//   [12, 16) exporter pid               [48, 56) secret
//                                       [56, 64) checksum of bytes [0, 56)
#pragma once

#include <cstdint>

#include "base/types.h"

namespace allocshim::ipc {

inline constexpr std::uint16_t kHandleVersion = 2;

// What the exporter shares: physical VMM allocations (one fd each) or a memory pool (its fd plus the
// driver's pointer export data).
enum class Kind : std::uint8_t { vmm = 1, pool = 2 };

struct HandleFields {
  std::uint32_t pid = 0;
  std::uint64_t nonce = 0;
  std::uint64_t export_id = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::uint64_t secret = 0;
  Kind kind = Kind::vmm;
};

enum class Decoded {
  foreign,  // no magic: a driver handle (or garbage for the driver to judge): pass through
  ours,     // a well-formed shim handle
  corrupt,  // the magic, but a wrong version, checksum or field: refuse (CUDA_ERROR_INVALID_VALUE)
};

void encode(const HandleFields& fields, IpcHandle* out);
Decoded decode(const IpcHandle& handle, HandleFields* out);
// Whether the handle starts with the shim's magic (a cheap test for the open path).
bool has_magic(const IpcHandle& handle);

}  // namespace allocshim::ipc
