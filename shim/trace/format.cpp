// Framing and compression of the trace format (see format.h).
#include "trace/format.h"

#include <zstd.h>

#include <string>

namespace allocshim::trace {
namespace {

void put_u16(unsigned char* p, std::uint16_t v) {
  p[0] = static_cast<unsigned char>(v);
  p[1] = static_cast<unsigned char>(v >> 8);
}
void put_u32(unsigned char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
std::uint16_t get_u16(const unsigned char* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
std::uint32_t get_u32(const unsigned char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return v;
}
std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

constexpr int kCompressionLevel = 3;

// Fields of each record after its tag (format.h's Tag list): varints, then strings.
struct Shape {
  std::uint8_t varints, strings;
};
constexpr Shape kShapes[kMaxTag + 1] = {
    {0, 0}, {2, 0}, {8, 0}, {7, 0}, {8, 0}, {7, 0}, {6, 0}, {2, 1},
    {3, 0}, {2, 2}, {4, 2}, {2, 1}, {4, 2}, {1, 0}, {2, 0},
};

}  // namespace

std::size_t record_size(const unsigned char* p, std::size_t n) {
  Decoder d(p, n);
  const std::uint8_t tag = d.byte();
  if (d.failed || tag == 0 || tag > kMaxTag) return 0;
  for (int i = 0; i < kShapes[tag].varints; ++i) d.u();
  for (int i = 0; i < kShapes[tag].strings; ++i) d.str();
  return d.failed ? 0 : d.offset_from(p);
}

std::size_t complete_frame_size(const unsigned char* in, std::size_t n) {
  const std::size_t size = ZSTD_findFrameCompressedSize(in, n);
  return ZSTD_isError(size) ? 0 : size;
}

// Layout: magic[8] version u16, header size u16, pid u32, start_mono u64, start_real u64.
void encode_file_header(const FileHeader& h, unsigned char out[kFileHeaderBytes]) {
  std::memcpy(out, kFileMagic, sizeof kFileMagic);
  put_u16(out + 8, h.version);
  put_u16(out + 10, static_cast<std::uint16_t>(kFileHeaderBytes));
  put_u32(out + 12, h.pid);
  put_u64(out + 16, h.start_mono_ns);
  put_u64(out + 24, h.start_real_ns);
}

bool decode_file_header(const unsigned char* in, std::size_t n, FileHeader& h, std::string& error) {
  if (n < kFileHeaderBytes || std::memcmp(in, kFileMagic, sizeof kFileMagic) != 0) {
    error = n < sizeof kFileMagic ? "file too short to be an allocshim trace"
                                  : "not an allocshim trace (bad magic)";
    if (n >= sizeof kFileMagic && std::memcmp(in, kFileMagic, sizeof kFileMagic) == 0)
      error = "truncated file header";
    return false;
  }
  h.version = get_u16(in + 8);
  if (h.version != kFormatVersion) {
    error = "unsupported trace format version " + std::to_string(h.version) + " (this tool reads " +
            std::to_string(kFormatVersion) + ")";
    return false;
  }
  if (get_u16(in + 10) != kFileHeaderBytes) {
    error = "corrupted file header (header size " + std::to_string(get_u16(in + 10)) + ")";
    return false;
  }
  h.pid = get_u32(in + 12);
  h.start_mono_ns = get_u64(in + 16);
  h.start_real_ns = get_u64(in + 24);
  return true;
}

void encode_chunk_header(const ChunkHeader& h, unsigned char out[kChunkHeaderBytes]) {
  put_u32(out, kChunkMagic);
  put_u32(out + 4, h.compressed);
  put_u32(out + 8, h.raw);
}

bool decode_chunk_header(const unsigned char* in, ChunkHeader& h, std::string& error) {
  if (get_u32(in) != kChunkMagic) {
    error = "bad chunk magic";
    return false;
  }
  h.compressed = get_u32(in + 4);
  h.raw = get_u32(in + 8);
  if (h.raw > kMaxChunkRaw) {
    error = "chunk declares " + std::to_string(h.raw) + " bytes of records, more than the " +
            std::to_string(kMaxChunkRaw >> 20) + " MiB a chunk may hold";
    return false;
  }
  if (h.compressed == 0 || h.compressed > ZSTD_compressBound(h.raw)) {
    error = "chunk sizes out of range (compressed " + std::to_string(h.compressed) + ", raw " +
            std::to_string(h.raw) + ")";
    return false;
  }
  return true;
}

ChunkCompressor::ChunkCompressor() : ctx_(ZSTD_createCCtx()) {
  auto* cctx = static_cast<ZSTD_CCtx*>(ctx_);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, kCompressionLevel);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
}
ChunkCompressor::~ChunkCompressor() { ZSTD_freeCCtx(static_cast<ZSTD_CCtx*>(ctx_)); }

bool ChunkCompressor::compress(const unsigned char* raw, std::size_t n,
                               std::vector<unsigned char>& out) {
  if (!ctx_ || n > kMaxChunkRaw) return false;
  out.resize(kChunkHeaderBytes + ZSTD_compressBound(n));
  const std::size_t c =
      ZSTD_compress2(static_cast<ZSTD_CCtx*>(ctx_), out.data() + kChunkHeaderBytes,
                     out.size() - kChunkHeaderBytes, raw, n);
  if (ZSTD_isError(c)) return false;
  out.resize(kChunkHeaderBytes + c);
  encode_chunk_header({static_cast<std::uint32_t>(c), static_cast<std::uint32_t>(n)}, out.data());
  return true;
}

ChunkDecompressor::ChunkDecompressor() : ctx_(ZSTD_createDCtx()) {}
ChunkDecompressor::~ChunkDecompressor() { ZSTD_freeDCtx(static_cast<ZSTD_DCtx*>(ctx_)); }

bool ChunkDecompressor::decompress(const unsigned char* in, std::size_t n, std::size_t raw_size,
                                   std::vector<unsigned char>& out, std::string& error) {
  const unsigned long long content = ZSTD_getFrameContentSize(in, n);
  if (content == ZSTD_CONTENTSIZE_ERROR) {
    error = "damaged chunk (not a zstd frame)";
    return false;
  }
  if (content != ZSTD_CONTENTSIZE_UNKNOWN && content != raw_size) {
    error = "damaged chunk (size mismatch)";
    return false;
  }
  out.resize(raw_size);
  const std::size_t d =
      ZSTD_decompressDCtx(static_cast<ZSTD_DCtx*>(ctx_), out.data(), out.size(), in, n);
  if (ZSTD_isError(d)) {
    error = std::string("damaged chunk (") + ZSTD_getErrorName(d) + ")";
    return false;
  }
  if (d != raw_size) {
    error = "damaged chunk (decompressed size mismatch)";
    return false;
  }
  return true;
}

std::string expand_path(std::string_view pattern, int pid) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      if (pattern[i + 1] == 'p') {
        out += std::to_string(pid);
        ++i;
        continue;
      }
      if (pattern[i + 1] == '%') {
        out += '%';
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  return out;
}

}  // namespace allocshim::trace
