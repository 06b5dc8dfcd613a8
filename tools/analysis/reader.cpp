// The trace reader (see reader.h and docs/trace-format.md).
#include "analysis/reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <unordered_set>

namespace allocshim::analysis {

// The reader decodes the file format the shim writes (shim/trace/format.h).
using namespace trace;

const char* event_kind_name(EventKind kind) {
  switch (kind) {
    case EventKind::alloc: return "alloc";
    case EventKind::free: return "free";
    case EventKind::alloc_fail: return "alloc_fail";
    case EventKind::migrate: return "migrate";
    case EventKind::oom: return "oom";
    case EventKind::reload: return "reload";
  }
  return "?";
}

std::vector<std::uint64_t> Trace::frames(std::uint32_t stack) const {
  std::vector<std::uint64_t> out;
  // Ids grow from the root, so a walk towards it is strictly decreasing: a damaged trie cannot
  // loop (parse_trace checks parent < id).
  while (stack != 0) {
    auto it = nodes.find(stack);
    if (it == nodes.end()) break;
    out.push_back(it->second.frame);
    stack = it->second.parent;
  }
  return out;
}

std::string Trace::backend_name(int index) const {
  auto it = backends.find(index);
  if (it != backends.end()) return it->second.name;
  return index < 0 ? std::string("-") : "backend#" + std::to_string(index);
}

namespace {

// Decodes the records of one chunk's raw payload: definitions into the Trace, events into `events`
// (the Trace's own by default). Re-reading a chunk for its events only (TraceFile) skips the
// definitions, already read, and numbers reload sources from the chunk's first.
class ChunkParser {
 public:
  ChunkParser(Trace& t, std::string& error) : t_(t), error_(error), events_(&t.events) {}
  void events_only(std::vector<Event>* events, std::vector<std::uint32_t>* runs,
                   std::uint64_t first_reload) {
    events_ = events;
    runs_ = runs;
    definitions_ = false;
    reloads_ = first_reload;
  }
  void collect_into(std::vector<Event>* events) { events_ = events; }

  bool parse(const unsigned char* p, std::size_t n) {
    Decoder d(p, n);
    in_segment_ = false;
    while (!d.done()) {
      const std::size_t at = d.offset_from(p);
      const std::uint8_t tag = d.byte();
      if (tag == 0 || tag > kMaxTag) return fail("unknown record tag " + std::to_string(tag), at);
      if (!record(static_cast<Tag>(tag), d)) return fail(error_, at);
      if (d.failed) return fail("record runs past the end of its chunk", at);
    }
    return true;
  }

 private:
  bool fail(const std::string& what, std::size_t at) {
    error_ = what + " (at byte " + std::to_string(at) + " of the chunk)";
    return false;
  }

  bool begin_event(Decoder& d, Event& e, EventKind kind) {
    if (!in_segment_) {
      error_ = "event record outside a thread segment";
      return false;
    }
    time_ += d.u();
    e.time_ns = time_;
    e.tid = tid_;
    e.kind = kind;
    return true;
  }
  std::uint64_t address(Decoder& d) {
    addr_ += static_cast<std::uint64_t>(unzigzag(d.u()));
    return addr_;
  }
  static std::int16_t device(Decoder& d) { return static_cast<std::int16_t>(d.u()); }

  bool record(Tag tag, Decoder& d) {
    Event e;
    switch (tag) {
      case Tag::thread:
        tid_ = static_cast<std::uint32_t>(d.u());
        time_ = d.u();
        addr_ = 0;
        in_segment_ = true;
        if (runs_) runs_->push_back(static_cast<std::uint32_t>(events_->size()));
        return true;
      case Tag::alloc: {
        if (!begin_event(d, e, EventKind::alloc)) return false;
        e.device = device(d);
        e.size = d.u();
        e.addr = address(d);
        e.backend = static_cast<std::int32_t>(d.u());
        const std::uint64_t api_flags = d.u();
        e.api = static_cast<std::uint8_t>(api_flags & 7);
        e.flags = static_cast<std::uint32_t>(api_flags >> 3);
        e.dur_ns = d.u();
        e.stack = static_cast<std::uint32_t>(d.u());
        break;
      }
      case Tag::free:
        if (!begin_event(d, e, EventKind::free)) return false;
        e.device = device(d);
        e.size = d.u();
        e.addr = address(d);
        e.backend = static_cast<std::int32_t>(d.u());
        e.dur_ns = d.u();
        e.flags = static_cast<std::uint32_t>(d.u());
        break;
      case Tag::alloc_fail:
        if (!begin_event(d, e, EventKind::alloc_fail)) return false;
        e.device = device(d);
        e.size = d.u();
        e.backend = static_cast<std::int32_t>(d.u());
        e.api = static_cast<std::uint8_t>(d.u());
        e.result = static_cast<std::int32_t>(d.u());
        e.dur_ns = d.u();
        e.stack = static_cast<std::uint32_t>(d.u());
        break;
      case Tag::migrate:
        if (!begin_event(d, e, EventKind::migrate)) return false;
        e.device = device(d);
        e.size = d.u();
        e.addr = address(d);
        e.backend = static_cast<std::int32_t>(d.u());
        e.to_backend = static_cast<std::int32_t>(d.u());
        e.dur_ns = d.u();
        break;
      case Tag::oom:
        if (!begin_event(d, e, EventKind::oom)) return false;
        e.device = device(d);
        e.size = d.u();
        e.budget = d.u();
        e.reserved = d.u();
        e.stack = static_cast<std::uint32_t>(d.u());
        break;
      case Tag::reload:
        if (!begin_event(d, e, EventKind::reload)) return false;
        e.result = static_cast<std::int32_t>(d.u());
        if (definitions_) {
          e.addr = t_.reload_sources.size();
          t_.reload_sources.push_back(d.str());
        } else {
          e.addr = reloads_++;
          d.str();
        }
        break;
      case Tag::stack_node: {
        const auto id = static_cast<std::uint32_t>(d.u());
        StackNode node;
        node.parent = static_cast<std::uint32_t>(d.u());
        node.frame = d.u();
        if (!d.failed && (id == 0 || node.parent >= id)) {
          error_ = "malformed stack node " + std::to_string(id);
          return false;
        }
        if (definitions_) t_.nodes[id] = node;
        return true;
      }
      case Tag::py_func: {
        const auto id = static_cast<std::uint32_t>(d.u());
        PyFunction f;
        f.first_line = static_cast<std::uint32_t>(d.u());
        f.name = d.str();
        f.file = d.str();
        if (definitions_) t_.functions[id] = std::move(f);
        return true;
      }
      case Tag::module: {
        ModuleRecord m;
        m.id = static_cast<std::uint32_t>(d.u());
        m.bias = d.u();
        m.start = d.u();
        m.end = d.u();
        m.path = d.str();
        m.build_id = d.str();
        if (definitions_) t_.modules.push_back(std::move(m));
        return true;
      }
      case Tag::backend: {
        const int index = static_cast<int>(d.u());
        BackendRecord b;
        b.kind = static_cast<std::uint8_t>(d.u());
        b.name = d.str();
        if (definitions_) t_.backends[index] = std::move(b);
        return true;
      }
      case Tag::process: {
        ProcessRecord scratch;
        ProcessRecord& p = definitions_ ? t_.process : scratch;
        p.pid = static_cast<std::uint32_t>(d.u());
        p.ppid = static_cast<std::uint32_t>(d.u());
        p.stacks = static_cast<StackMode>(d.u() & 3);
        p.sample = static_cast<std::uint32_t>(d.u());
        if (p.sample == 0) p.sample = 1;
        p.exe = d.str();
        const std::string cmdline = d.str();
        p.argv.clear();
        for (std::size_t s = 0; s < cmdline.size();) {
          std::size_t z = cmdline.find('\0', s);
          if (z == std::string::npos) z = cmdline.size();
          p.argv.push_back(cmdline.substr(s, z - s));
          s = z + 1;
        }
        return true;
      }
      case Tag::lost: {
        const std::uint64_t n = d.u();
        if (definitions_) t_.lost += n;
        return true;
      }
      case Tag::end: {
        d.u();
        const std::uint64_t lost = d.u();
        if (definitions_) {
          t_.lost = std::max(t_.lost, lost);
          t_.complete = true;
        }
        return true;
      }
    }
    if (!d.failed) events_->push_back(e);
    return true;
  }

  Trace& t_;
  std::string& error_;
  std::vector<Event>* events_;
  std::vector<std::uint32_t>* runs_ = nullptr;
  bool definitions_ = true;
  std::uint64_t reloads_ = 0;
  bool in_segment_ = false;
  std::uint32_t tid_ = 0;
  std::uint64_t time_ = 0, addr_ = 0;
};

// Where a trace's bytes come from: a buffer holding all of it, or a file read a chunk at a time
// (TraceFile: the file is not held in memory).
class Source {
 public:
  Source(const unsigned char* data, std::size_t n) : data_(data), size_(n) {}
  Source(int fd, std::size_t n) : fd_(fd), size_(n) {}
  std::size_t size() const { return size_; }
  // Points `p` at `n` bytes at `pos` (within size()); false with `error` set on a read error.
  bool read(std::size_t pos, std::size_t n, const unsigned char*& p, std::string& error) {
    if (data_) {
      p = data_ + pos;
      return true;
    }
    buf_.resize(n);
    std::size_t done = 0;
    while (done < n) {
      const ssize_t r = pread(fd_, buf_.data() + done, n - done, static_cast<off_t>(pos + done));
      if (r <= 0) {
        error = std::string("read failed: ") + (r < 0 ? std::strerror(errno) : "file shrank");
        return false;
      }
      done += static_cast<std::size_t>(r);
    }
    p = buf_.data();
    return true;
  }

 private:
  const unsigned char* data_ = nullptr;
  int fd_ = -1;
  std::size_t size_;
  std::vector<unsigned char> buf_;
};

// Reads the file header, then frames and decompresses each chunk in turn and hands its raw payload
// to `parse(position, header, raw)`. A file cut short ends the walk with a warning; a damaged chunk
// is an error.
template <typename Parse>
bool walk_chunks(Source& src, Trace& out, std::string& error, const Progress& progress,
                 Parse&& parse) {
  const unsigned char* p = nullptr;
  const std::size_t head = std::min(src.size(), kFileHeaderBytes);
  if (!src.read(0, head, p, error) || !decode_file_header(p, head, out.header, error)) return false;
  std::size_t pos = kFileHeaderBytes;
  const std::size_t n = src.size();
  // Reused across files: creating a context costs more than reading a small trace.
  thread_local ChunkDecompressor dec;
  std::vector<unsigned char> raw;
  std::size_t chunks = 0;
  while (pos < n) {
    if (n - pos < kChunkHeaderBytes) {
      out.warnings.push_back("trace ends inside a chunk header at byte " + std::to_string(pos) +
                             ": read up to the last complete chunk");
      break;
    }
    ChunkHeader ch;
    std::string why;
    if (!src.read(pos, kChunkHeaderBytes, p, error)) return false;
    if (!decode_chunk_header(p, ch, why)) {
      error = "corrupted trace: chunk " + std::to_string(chunks) + " at byte " +
              std::to_string(pos) + ": " + why;
      return false;
    }
    if (ch.compressed > n - pos - kChunkHeaderBytes) {
      // A cut file ends inside the frame; a whole frame shorter than the size field says means the
      // field is damaged, and what follows it would be misread as a cut.
      const std::size_t avail = n - pos - kChunkHeaderBytes;
      if (!src.read(pos + kChunkHeaderBytes, avail, p, error)) return false;
      if (const std::size_t frame = complete_frame_size(p, avail); frame != 0) {
        error = "corrupted trace: chunk " + std::to_string(chunks) + " at byte " +
                std::to_string(pos) + ": its size field says " + std::to_string(ch.compressed) +
                " bytes, its frame ends after " + std::to_string(frame);
        return false;
      }
      out.warnings.push_back("trace ends inside chunk " + std::to_string(chunks) + " at byte " +
                             std::to_string(pos) + " (" + std::to_string(n - pos) + " of " +
                             std::to_string(kChunkHeaderBytes + ch.compressed) +
                             " bytes present): read up to the last complete chunk");
      break;
    }
    if (!src.read(pos + kChunkHeaderBytes, ch.compressed, p, error)) return false;
    if (!dec.decompress(p, ch.compressed, ch.raw, raw, why) || !parse(pos, ch, raw)) {
      error = "corrupted trace: chunk " + std::to_string(chunks) + " at byte " +
              std::to_string(pos) + ": " + (why.empty() ? error : why);
      return false;
    }
    pos += kChunkHeaderBytes + ch.compressed;
    ++chunks;
    if (progress) progress(pos, n);
  }
  if (!out.complete)
    out.warnings.push_back("no end record: the program exited abruptly or is still running");
  if (out.lost)
    out.warnings.push_back(std::to_string(out.lost) +
                           " events were dropped because the trace writer fell behind");
  return true;
}

// Every stack an event refers to must be defined; in a file cut short the definition may have been
// in the missing part (a warning, not an error).
bool check_stack(Trace& t, std::uint32_t stack, bool& warned, std::string& error) {
  if (stack == 0 || warned || t.nodes.count(stack)) return true;
  if (t.complete) {
    error = "corrupted trace: event refers to undefined stack " + std::to_string(stack);
    return false;
  }
  t.warnings.push_back("some events refer to stacks defined in the missing part");
  warned = true;
  return true;
}

}  // namespace

bool parse_trace(const unsigned char* data, std::size_t n, Trace& out, std::string& error,
                 const Progress& progress) {
  Source src(data, n);
  ChunkParser parser(out, error);
  if (!walk_chunks(src, out, error, progress,
                   [&](std::size_t, const ChunkHeader&, const std::vector<unsigned char>& raw) {
                     return parser.parse(raw.data(), raw.size());
                   }))
    return false;
  bool warned = false;
  for (const Event& e : out.events)
    if (!check_stack(out, e.stack, warned, error)) return false;
  // Threads write their own segments; merge them into one timeline, keeping each thread's order.
  std::stable_sort(out.events.begin(), out.events.end(),
                   [](const Event& a, const Event& b) { return a.time_ns < b.time_ns; });
  return true;
}

bool read_trace(const std::string& path, Trace& out, std::string& error, const Progress& progress) {
  // Non-blocking open: a FIFO without a writer reads as empty instead of being waited on.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    error = path + ": cannot open";
    return false;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::vector<unsigned char> bytes;
  unsigned char buf[1 << 16];
  ssize_t r;
  while ((r = read(fd, buf, sizeof buf)) != 0) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    bytes.insert(bytes.end(), buf, buf + r);
  }
  if (r < 0) error = path + ": read failed: " + std::strerror(errno);
  close(fd);
  if (r < 0) return false;
  out.path = path;
  if (!parse_trace(bytes.data(), bytes.size(), out, error, progress)) {
    error = path + ": " + error;
    return false;
  }
  return true;
}

TraceFile::~TraceFile() {
  if (fd_ >= 0) close(fd_);
}

namespace {

// A pipe or FIFO read to its end into an unnamed temporary file (TMPDIR, gone when closed), so that
// the second pass can read chunks again. Returns the file, or -1 with `error` set.
int spool(int in, std::size_t& size, std::string& error) {
  const char* env = std::getenv("TMPDIR");
  const std::string dir = env && *env ? env : "/tmp";
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::string name = dir + "/allocshim-trace-XXXXXX";
    fd = mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0) unlink(name.c_str());
  }
  if (fd < 0) {
    error = std::string("cannot create a temporary file in ") + dir +
            " to read a pipe into: " + std::strerror(errno);
    return -1;
  }
  std::vector<unsigned char> buf(1 << 20);
  size = 0;
  for (;;) {
    const ssize_t r = read(in, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      error = std::string("read failed: ") + std::strerror(errno);
      close(fd);
      return -1;
    }
    if (r == 0) break;
    for (ssize_t done = 0; done < r;) {
      const ssize_t w = write(fd, buf.data() + done, static_cast<std::size_t>(r - done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        error = std::string("cannot copy a pipe into a temporary file in ") + dir + ": " +
                std::strerror(errno);
        close(fd);
        return -1;
      }
      done += w;
    }
    size += static_cast<std::size_t>(r);
  }
  return fd;
}

}  // namespace

bool TraceFile::open(const std::string& path, Trace& out, std::string& error,
                     const Progress& progress) {
  // Non-blocking, so that a FIFO without a writer is not waited on (it then reads as empty).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    error = path + ": cannot open" +
            (fd < 0 ? std::string(": ") + std::strerror(errno) : std::string());
    if (fd >= 0) close(fd);
    return false;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  path_ = path;
  if (S_ISREG(st.st_mode)) {
    fd_ = fd;
    size_ = static_cast<std::size_t>(st.st_size);
  } else {
    // A pipe (`report <(zstdcat t.trace.zst)`) or FIFO is a stream: read once, kept on disk.
    fd_ = spool(fd, size_, error);
    close(fd);
    if (fd_ < 0) {
      error = path + ": " + error;
      return false;
    }
    if (size_ == 0) {
      error = path + ": no data (a pipe or FIFO whose writer wrote nothing, or that had no writer)";
      return false;
    }
  }
  out.path = path;
  trace_ = &out;
  Source src(fd_, size_);
  ChunkParser parser(out, error);
  std::vector<Event> scratch;
  parser.collect_into(&scratch);
  std::uint64_t seq = 0;
  std::unordered_set<std::uint32_t> stacks;  // referenced, checked once every definition is read
  const bool ok = walk_chunks(
      src, out, error, progress,
      [&](std::size_t pos, const ChunkHeader& ch, const std::vector<unsigned char>& raw) {
        scratch.clear();
        Chunk c;
        c.offset = pos;
        c.compressed = ch.compressed;
        c.raw = ch.raw;
        c.first_seq = seq;
        c.first_reload = out.reload_sources.size();
        if (!parser.parse(raw.data(), raw.size())) return false;
        if (scratch.empty()) return true;
        c.events = static_cast<std::uint32_t>(scratch.size());
        seq += scratch.size();
        c.min_time = UINT64_MAX;
        for (const Event& e : scratch) {
          c.min_time = std::min(c.min_time, e.time_ns);
          c.max_time = std::max(c.max_time, e.time_ns);
          if (e.stack) stacks.insert(e.stack);
        }
        chunks_.push_back(c);
        return true;
      });
  bool warned = false;
  for (std::uint32_t id : stacks)
    if (ok && !check_stack(out, id, warned, error)) {
      error = path + ": " + error;
      return false;
    }
  if (!ok) error = path + ": " + error;
  return ok;
}

bool TraceFile::events(std::size_t i, std::vector<Event>& out, std::vector<std::uint32_t>& runs,
                       std::string& error) {
  const Chunk& c = chunks_[i];
  Source src(fd_, size_);
  const unsigned char* p = nullptr;
  std::vector<unsigned char> raw;
  std::string why;
  out.clear();
  out.reserve(c.events);
  runs.clear();
  ChunkParser parser(*trace_, error);
  parser.events_only(&out, &runs, c.first_reload);
  if (!src.read(c.offset + kChunkHeaderBytes, c.compressed, p, error) ||
      !decompressor_.decompress(p, c.compressed, c.raw, raw, why) ||
      !parser.parse(raw.data(), raw.size())) {
    error = trace_->path + ": the chunk at byte " + std::to_string(c.offset) +
            " changed since it was read" + (why.empty() ? "" : ": " + why);
    return false;
  }
  return true;
}

}  // namespace allocshim::analysis
