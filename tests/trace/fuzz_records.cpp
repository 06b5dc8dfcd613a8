// See fuzz_reader.h: check_records.
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "fuzz_reader.h"
#include "analysis/reader.h"

namespace allocshim::analysis::fuzz {

std::string check_records(const std::uint8_t* data, std::size_t size) {
  // A file as the writer frames it: the header, then the payload in 1 to 4 chunks (the first byte
  // says how many), each compressed with its checksum so that the reader gets past zstd.
  std::vector<unsigned char> file(trace::kFileHeaderBytes);
  trace::FileHeader h;
  h.pid = 1;
  trace::encode_file_header(h, file.data());
  const std::size_t chunks = size ? data[0] % 4 + 1 : 1;
  const std::uint8_t* p = size ? data + 1 : data;
  const std::size_t n = size ? size - 1 : 0;
  static trace::ChunkCompressor compressor;
  std::vector<unsigned char> chunk;
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t from = n * c / chunks, to = n * (c + 1) / chunks;
    if (from == to) continue;
    if (!compressor.compress(p + from, to - from, chunk))
      return "a payload the writer could frame was not compressed";
    file.insert(file.end(), chunk.begin(), chunk.end());
  }
  if (std::string f = check_input(file.data(), file.size()); !f.empty()) return f;

  // The two-pass reader (TraceFile, what report and replay use) decodes the same events and agrees
  // on whether the file is damaged.
  Trace whole;
  std::string error;
  const bool ok = parse_trace(file.data(), file.size(), whole, error);
  static const int fd = memfd_create("fuzz-trace", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, 0) != 0 ||
      pwrite(fd, file.data(), file.size(), 0) != static_cast<ssize_t>(file.size()))
    return {};
  Trace defs;
  TraceFile tf;
  const bool ok2 = tf.open("/proc/self/fd/" + std::to_string(fd), defs, error);
  if (ok != ok2) return "the two readers disagree on whether the trace is damaged";
  if (!ok) return {};
  std::size_t events = 0;
  std::vector<Event> out;
  std::vector<std::uint32_t> runs;
  for (std::size_t i = 0; i < tf.chunks().size(); ++i) {
    if (!tf.events(i, out, runs, error))
      return "a chunk read in the first pass fails in the second";
    for (std::size_t r = 0; r < runs.size(); ++r)
      if (runs[r] > out.size() || (r && runs[r] < runs[r - 1]))
        return "thread segments out of range";
    events += out.size();
  }
  if (events != whole.events.size()) return "the two readers decode different numbers of events";
  if (defs.nodes.size() != whole.nodes.size() || defs.reload_sources != whole.reload_sources)
    return "the two readers read different definitions";
  return {};
}

}  // namespace allocshim::analysis::fuzz
