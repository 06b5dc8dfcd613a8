// The allocshim trace format, shared by the writer in the shim and the reader in the tool: one
// definition of the record layouts, the varint encoding and the chunk framing (docs/trace-format.md
// is the prose version of this file).
//
// A trace is a fixed 32-byte file header followed by chunks. Each chunk is a 12-byte header (magic,
// compressed size, raw size) and one complete zstd frame with a content checksum. Chunks are
// independent, so a file cut anywhere (an abrupt exit) is readable up to its last complete chunk,
// and a damaged chunk is detected (bad magic, sizes out of range, zstd error or checksum mismatch)
// instead of being decoded into garbage.
//
// A chunk's raw payload is a sequence of records: a tag byte, then LEB128 varints (strings are a
// varint length and bytes). Records come in segments, each started by a THREAD record: event
// records after it belong to that thread and encode their time as a delta from the previous record
// of the segment, and their address as a zigzag delta from the previous address. Definitions
// (stack nodes, modules, Python functions, backends) carry no time and may appear after the first
// event that refers to them: readers resolve references once the whole file is read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace allocshim::trace {

inline constexpr char kFileMagic[8] = {'A', 'L', 'L', 'O', 'C', 'T', 'R', 'C'};
inline constexpr std::uint16_t kFormatVersion = 1;
inline constexpr std::size_t kFileHeaderBytes = 32;
inline constexpr std::uint32_t kChunkMagic = 0x4b4e4843;  // "CHNK" little-endian
inline constexpr std::size_t kChunkHeaderBytes = 12;
// Upper bound on a chunk's raw payload. The writer's chunks hold about 1 MiB (it splits larger
// definition buffers between records); the reader refuses more, so that a small file of highly
// compressible chunks cannot expand into gigabytes of events.
inline constexpr std::uint32_t kMaxChunkRaw = 8u << 20;

struct FileHeader {
  std::uint16_t version = kFormatVersion;
  std::uint32_t pid = 0;
  std::uint64_t start_mono_ns = 0;  // CLOCK_MONOTONIC at trace start: all times are on this clock
  std::uint64_t start_real_ns = 0;  // CLOCK_REALTIME at the same moment, for display
};

enum class Tag : std::uint8_t {
  thread = 1,      // tid, time_ns (absolute): starts a segment
  alloc = 2,       // dt, device, size, daddr, backend, api | flags << 3, dur_ns, stack
  free = 3,        // dt, device, size, daddr, backend, dur_ns, flags
  alloc_fail = 4,  // dt, device, size, backend, api, result, dur_ns, stack
  migrate = 5,     // dt, device, size, daddr, from_backend, to_backend, dur_ns
  oom = 6,         // dt, device, size, budget, reserved, stack
  reload = 7,      // dt, ok, source (string)
  stack_node = 8,  // id, parent, frame
  py_func = 9,     // id, first_line, name, file
  module = 10,     // id, bias, start, end, path, build_id (string of raw bytes)
  backend = 11,    // index, kind, name
  process = 12,    // pid, ppid, stacks, sample, exe, cmdline (NUL-separated)
  lost = 13,       // count of events dropped because the writer fell behind
  end = 14,        // events written, events lost: present only after a clean shutdown
};
inline constexpr std::uint8_t kMaxTag = 14;

// Flags of an alloc record (above the 3 api bits).
inline constexpr std::uint32_t kAllocSpilled = 1;    // served by the budget's spill target
inline constexpr std::uint32_t kAllocUnsampled = 2;  // sampling skipped its stack (stack id 0)
// from_backend / to_backend of a migrate record that moved a piece of the budget's spill target
// between device and host memory at the same address: placements, not backend indices.
inline constexpr int kPlacementDevice = -2;
inline constexpr int kPlacementHost = -3;
// Flags of a free record.
inline constexpr std::uint32_t kFreeAsync = 1;  // cuMemFreeAsync

// A frame in a stack node: a native return address, or (top bit set) a Python frame: function id in
// bits 32..62 and line number in bits 0..31. User-space addresses never have the top bit set.
inline constexpr std::uint64_t kPythonFrameBit = 1ull << 63;
inline std::uint64_t python_frame(std::uint32_t func, std::uint32_t line) {
  return kPythonFrameBit | (static_cast<std::uint64_t>(func & 0x7fffffffu) << 32) | line;
}
inline bool is_python_frame(std::uint64_t f) { return (f & kPythonFrameBit) != 0; }
inline std::uint32_t python_func(std::uint64_t f) {
  return static_cast<std::uint32_t>((f >> 32) & 0x7fffffffu);
}
inline std::uint32_t python_line(std::uint64_t f) { return static_cast<std::uint32_t>(f); }

// Which stacks a trace records (same values as policy::Trace::Stacks).
enum class StackMode : std::uint8_t { off = 0, native = 1, python = 2, both = 3 };

// ---- Encoding ------------------------------------------------------------------------------

inline constexpr std::size_t kMaxVarint = 10;

// Writes `v` as LEB128 at `p`; returns the byte after it. The caller guarantees kMaxVarint bytes.
inline unsigned char* put_varint(unsigned char* p, std::uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<unsigned char>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<unsigned char>(v);
  return p;
}
inline std::uint64_t zigzag(std::int64_t v) {
  return (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63);
}
inline std::int64_t unzigzag(std::uint64_t v) {
  return static_cast<std::int64_t>(v >> 1) ^ -static_cast<std::int64_t>(v & 1);
}

// Appends records to a growable byte vector (definitions and tests; the hot path encodes into fixed
// buffers with put_varint directly).
class Encoder {
 public:
  explicit Encoder(std::vector<unsigned char>& out) : out_(out) {}
  void tag(Tag t) { out_.push_back(static_cast<unsigned char>(t)); }
  void u(std::uint64_t v) {
    unsigned char tmp[kMaxVarint];
    out_.insert(out_.end(), tmp, put_varint(tmp, v));
  }
  void str(std::string_view s) {
    u(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }

 private:
  std::vector<unsigned char>& out_;
};

// Reads varints and strings from a byte range; any overrun sets `failed` and returns zeros, so a
// record parser can read all its fields and check once.
class Decoder {
 public:
  Decoder(const unsigned char* p, std::size_t n) : p_(p), end_(p + n) {}
  bool done() const { return p_ >= end_; }
  std::size_t offset_from(const unsigned char* base) const {
    return static_cast<std::size_t>(p_ - base);
  }
  std::uint8_t byte() {
    if (p_ >= end_) return fail(), 0;
    return *p_++;
  }
  std::uint64_t u() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= end_) return fail(), 0;
      const unsigned char b = *p_++;
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    return fail(), 0;  // more than 10 bytes: not a varint we wrote
  }
  std::string str() {
    const std::uint64_t n = u();
    if (failed || n > static_cast<std::uint64_t>(end_ - p_)) return fail(), std::string();
    std::string s(reinterpret_cast<const char*>(p_), static_cast<std::size_t>(n));
    p_ += n;
    return s;
  }
  bool failed = false;

 private:
  void fail() {
    failed = true;
    p_ = end_;
  }
  const unsigned char* p_;
  const unsigned char* end_;
};

// The length of the record starting at `p` (its tag byte included), or 0 when the `n` bytes do
// not hold a whole well-formed record.
std::size_t record_size(const unsigned char* p, std::size_t n);

// ---- Framing -------------------------------------------------------------------------------

void encode_file_header(const FileHeader& h, unsigned char out[kFileHeaderBytes]);
// False with `error` set when the bytes are not an allocshim trace header of a version we read.
bool decode_file_header(const unsigned char* in, std::size_t n, FileHeader& h, std::string& error);

struct ChunkHeader {
  std::uint32_t compressed = 0;
  std::uint32_t raw = 0;
};
void encode_chunk_header(const ChunkHeader& h, unsigned char out[kChunkHeaderBytes]);
bool decode_chunk_header(const unsigned char* in, ChunkHeader& h, std::string& error);

// zstd with a reusable context. Level 3 keeps the writer thread well ahead of any allocation rate a
// CUDA program reaches; the frame checksum lets the reader detect damaged chunks.
class ChunkCompressor {
 public:
  ChunkCompressor();
  ~ChunkCompressor();
  ChunkCompressor(const ChunkCompressor&) = delete;
  ChunkCompressor& operator=(const ChunkCompressor&) = delete;
  // Replaces `out` with chunk header + compressed frame of `raw`. False on a zstd error.
  bool compress(const unsigned char* raw, std::size_t n, std::vector<unsigned char>& out);

 private:
  void* ctx_;
};

class ChunkDecompressor {
 public:
  ChunkDecompressor();
  ~ChunkDecompressor();
  ChunkDecompressor(const ChunkDecompressor&) = delete;
  ChunkDecompressor& operator=(const ChunkDecompressor&) = delete;
  // Decompresses one frame whose raw size the chunk header announced; false with `error` set when
  // the frame is damaged or its size differs.
  bool decompress(const unsigned char* in, std::size_t n, std::size_t raw_size,
                  std::vector<unsigned char>& out, std::string& error);

 private:
  void* ctx_;
};

// The size of the complete zstd frame at the start of `n` bytes, or 0 when they hold only the
// beginning of one (a file cut short) or no frame at all.
std::size_t complete_frame_size(const unsigned char* in, std::size_t n);

// Expands "%p" to the pid and "%%" to "%" (the trace path of each process of a multi-process run).
std::string expand_path(std::string_view pattern, int pid);

}  // namespace allocshim::trace
