// The trace reader (see reader.h and docs/trace-format.md).
#include "trace/reader.h"

#include <algorithm>
#include <fstream>
#include <iterator>

namespace allocshim::trace {

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

// Decodes the records of one chunk's raw payload.
class ChunkParser {
 public:
  ChunkParser(Trace& t, std::string& error) : t_(t), error_(error) {}

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
        e.addr = t_.reload_sources.size();
        t_.reload_sources.push_back(d.str());
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
        t_.nodes[id] = node;
        return true;
      }
      case Tag::py_func: {
        const auto id = static_cast<std::uint32_t>(d.u());
        PyFunction f;
        f.first_line = static_cast<std::uint32_t>(d.u());
        f.name = d.str();
        f.file = d.str();
        t_.functions[id] = std::move(f);
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
        t_.modules.push_back(std::move(m));
        return true;
      }
      case Tag::backend: {
        const int index = static_cast<int>(d.u());
        BackendRecord b;
        b.kind = static_cast<std::uint8_t>(d.u());
        b.name = d.str();
        t_.backends[index] = std::move(b);
        return true;
      }
      case Tag::process: {
        ProcessRecord& p = t_.process;
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
      case Tag::lost:
        t_.lost += d.u();
        return true;
      case Tag::end:
        d.u();
        t_.lost = std::max(t_.lost, d.u());
        t_.complete = true;
        return true;
    }
    if (!d.failed) t_.events.push_back(e);
    return true;
  }

  Trace& t_;
  std::string& error_;
  bool in_segment_ = false;
  std::uint32_t tid_ = 0;
  std::uint64_t time_ = 0, addr_ = 0;
};

}  // namespace

bool parse_trace(const unsigned char* data, std::size_t n, Trace& out, std::string& error,
                 const Progress& progress) {
  if (!decode_file_header(data, n, out.header, error)) return false;
  std::size_t pos = kFileHeaderBytes;
  ChunkDecompressor dec;
  ChunkParser parser(out, error);
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
    if (!decode_chunk_header(data + pos, ch, why)) {
      error = "corrupted trace: chunk " + std::to_string(chunks) + " at byte " +
              std::to_string(pos) + ": " + why;
      return false;
    }
    if (ch.compressed > n - pos - kChunkHeaderBytes) {
      out.warnings.push_back("trace ends inside chunk " + std::to_string(chunks) + " at byte " +
                             std::to_string(pos) + " (" + std::to_string(n - pos) + " of " +
                             std::to_string(kChunkHeaderBytes + ch.compressed) +
                             " bytes present): read up to the last complete chunk");
      break;
    }
    if (!dec.decompress(data + pos + kChunkHeaderBytes, ch.compressed, ch.raw, raw, why) ||
        !parser.parse(raw.data(), raw.size())) {
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
  for (const Event& e : out.events) {
    if (e.stack != 0 && !out.nodes.count(e.stack)) {
      if (out.complete) {
        error = "corrupted trace: event refers to undefined stack " + std::to_string(e.stack);
        return false;
      }
      // Cut short: the definition may have been in the part that is missing.
      out.warnings.push_back("some events refer to stacks defined in the missing part");
      break;
    }
  }
  // Threads write their own segments; merge them into one timeline, keeping each thread's order.
  std::stable_sort(out.events.begin(), out.events.end(),
                   [](const Event& a, const Event& b) { return a.time_ns < b.time_ns; });
  return true;
}

bool read_trace(const std::string& path, Trace& out, std::string& error, const Progress& progress) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = path + ": cannot open";
    return false;
  }
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  out.path = path;
  if (!parse_trace(bytes.data(), bytes.size(), out, error, progress)) {
    error = path + ": " + error;
    return false;
  }
  return true;
}

}  // namespace allocshim::trace
