// PyTorch's memory snapshot (the pickle torch.cuda.memory._snapshot() returns), so that
// https://pytorch.org/memory_viz and torch/cuda/_memory_viz.py open an allocshim trace.
//
// The format, as those readers use it (torch/cuda/_memory_viz.py, torch/utils/viz/MemoryViz.js):
// a dict with "segments" (what is allocated at the end: device, address, total_size, stream, blocks
// of size/state/requested_size/frames) and "device_traces" (one list of actions per device, each a
// dict of action, addr, size, stream, time_us and frames of filename/line/name, innermost first).
// Each allocation is its own segment here, as for a program calling cudaMalloc directly: every
// allocation gives segment_alloc, alloc, and at its free free_requested, free_completed and
// segment_free. One "device" per (process, device) pair, numbered in the order they appear.
//
// Written as pickle protocol 4 by hand with the opcodes MemoryViz.js's own unpickler reads (no
// FRAME; lists appended in batches, as its APPENDS spreads them into a call).
#include <algorithm>
#include <map>
#include <string_view>
#include <unordered_map>

#include "analysis/report.h"

namespace allocshim::analysis {
namespace {

class Pickler {
 public:
  explicit Pickler(std::string& out) : out_(out) { out_ += "\x80\x04"; }  // PROTO 4
  void stop() { out_ += '.'; }
  void integer(std::int64_t v) {
    if (v >= 0 && v < 256) {
      out_ += 'K';
      out_ += static_cast<char>(v);
    } else if (v >= 0 && v < 65536) {
      out_ += 'M';
      le(static_cast<std::uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      le(static_cast<std::uint64_t>(v), 4);
    } else {  // LONG1: little-endian two's complement, as few bytes as keep the sign
      int n = 1;
      while (n < 8 && (v >> (8 * n - 1)) != 0 && (v >> (8 * n - 1)) != -1) ++n;
      out_ += '\x8a';
      out_ += static_cast<char>(n);
      le(static_cast<std::uint64_t>(v), n);
    }
  }
  void boolean(bool b) { out_ += b ? '\x88' : '\x89'; }
  // Strings repeat (keys, actions, file names): each is written once and fetched from the memo.
  void str(std::string_view raw) {
    auto it = strings_.find(std::string(raw));
    if (it != strings_.end()) return get(it->second);
    const std::string s = valid_utf8(raw);
    if (s.size() < 256) {
      out_ += '\x8c';
      out_ += static_cast<char>(s.size());
    } else {
      out_ += 'X';
      le(s.size(), 4);
    }
    out_ += s;
    strings_.emplace(std::string(raw), memoize());
  }
  std::uint32_t memoize() {
    out_ += '\x94';
    return memo_++;
  }
  void get(std::uint32_t index) {
    if (index < 256) {
      out_ += 'h';
      out_ += static_cast<char>(index);
    } else {
      out_ += 'j';
      le(index, 4);
    }
  }
  void tuple2() { out_ += '\x86'; }
  // A dict: begin_dict, then key/value pairs, then end_dict.
  void begin_dict() { out_ += "}("; }
  void end_dict() { out_ += 'u'; }
  // A list: begin_list, then items each followed by item(), then end_list.
  void begin_list() {
    out_ += "](";
    batch_.push_back(0);
  }
  void item() {
    if (++batch_.back() == 1000) {
      out_ += "e(";
      batch_.back() = 0;
    }
  }
  void end_list() {
    out_ += 'e';
    batch_.pop_back();
  }

 private:
  void le(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  std::string& out_;
  std::uint32_t memo_ = 0;
  std::unordered_map<std::string, std::uint32_t> strings_;
  std::vector<int> batch_;
};

struct Action {
  std::uint64_t t_ns;
  int order;  // at equal times: frees before allocations (an address reused at once)
  const char* action;
  const Allocation* a;
};

}  // namespace

void write_memory_snapshot(const Analysis& a, const ReportOptions&, std::ostream& out) {
  // (process, device) -> the snapshot's device index.
  std::map<std::pair<std::uint32_t, int>, int> slot_of;
  for (const Series& s : a.series) slot_of.emplace(std::make_pair(s.process, s.device), 0);
  for (const Event* e : a.notable) slot_of.emplace(std::make_pair(e->process, int{e->device}), 0);
  int slots = 0;
  for (auto& [k, v] : slot_of) v = slots++;
  const auto slot = [&](const Allocation& al) {
    const Series& s = a.series[al.series];
    return slot_of.at({s.process, s.device});
  };

  std::vector<std::vector<Action>> traces(static_cast<std::size_t>(slots));
  for (const Allocation& al : a.allocations) {
    auto& list = traces[static_cast<std::size_t>(slot(al))];
    list.push_back({al.alloc_ns, 1, "segment_alloc", &al});
    list.push_back({al.alloc_ns, 2, "alloc", &al});
    if (al.free_ns == Allocation::kLive) continue;
    list.push_back({al.free_ns, 0, "free_requested", &al});
    list.push_back({al.free_ns, 0, "free_completed", &al});
    list.push_back({al.free_ns, 0, "segment_free", &al});
  }

  std::string buf;
  Pickler p(buf);
  // Each site's frames are written once and fetched from the memo afterwards.
  std::unordered_map<std::int64_t, std::uint32_t> frames_memo;
  const auto frames = [&](std::int64_t site) {
    if (auto it = frames_memo.find(site); it != frames_memo.end()) return p.get(it->second);
    p.begin_list();
    if (site >= 0) {
      for (const Frame& f : a.sites[static_cast<std::size_t>(site)].frames) {
        p.begin_dict();
        p.str("filename");
        p.str(!f.file.empty() ? f.file : f.module);
        p.str("line");
        p.integer(f.line);
        p.str("name");
        p.str(f.function);
        p.end_dict();
        p.item();
      }
    }
    p.end_list();
    frames_memo.emplace(site, p.memoize());
  };
  const auto entry = [&](const char* action, std::uint64_t addr, std::uint64_t size,
                         std::uint64_t t_ns, std::int64_t site) {
    p.begin_dict();
    p.str("action");
    p.str(action);
    p.str("addr");
    p.integer(static_cast<std::int64_t>(addr));
    p.str("size");
    p.integer(static_cast<std::int64_t>(size));
    p.str("stream");
    p.integer(0);
    p.str("time_us");
    p.integer(static_cast<std::int64_t>(t_ns / 1000));
    p.str("frames");
    frames(site);
    p.end_dict();
    p.item();
  };

  p.begin_dict();
  p.str("segments");
  p.begin_list();
  std::vector<const Allocation*> live;
  for (const Allocation& al : a.allocations)
    if (al.free_ns == Allocation::kLive) live.push_back(&al);
  std::sort(live.begin(), live.end(), [&](const Allocation* x, const Allocation* y) {
    return slot(*x) != slot(*y) ? slot(*x) < slot(*y) : x->addr < y->addr;
  });
  for (const Allocation* al : live) {
    p.begin_dict();
    p.str("device");
    p.integer(slot(*al));
    p.str("address");
    p.integer(static_cast<std::int64_t>(al->addr));
    for (const char* k : {"total_size", "allocated_size", "active_size", "requested_size"}) {
      p.str(k);
      p.integer(static_cast<std::int64_t>(al->size));
    }
    p.str("stream");
    p.integer(0);
    p.str("segment_type");
    p.str("large");
    p.str("segment_pool_id");
    p.integer(0);
    p.integer(0);
    p.tuple2();
    p.str("is_expandable");
    p.boolean(false);
    p.str("frames");
    frames(al->site);
    p.str("blocks");
    p.begin_list();
    p.begin_dict();
    p.str("address");
    p.integer(static_cast<std::int64_t>(al->addr));
    p.str("size");
    p.integer(static_cast<std::int64_t>(al->size));
    p.str("requested_size");
    p.integer(static_cast<std::int64_t>(al->size));
    p.str("state");
    p.str("active_allocated");
    p.str("frames");
    frames(al->site);
    p.end_dict();
    p.item();
    p.end_list();
    p.end_dict();
    p.item();
  }
  p.end_list();

  p.str("device_traces");
  p.begin_list();
  for (int d = 0; d < slots; ++d) {
    auto& list = traces[static_cast<std::size_t>(d)];
    std::stable_sort(list.begin(), list.end(), [](const Action& x, const Action& y) {
      return x.t_ns != y.t_ns ? x.t_ns < y.t_ns : x.order < y.order;
    });
    p.begin_list();
    std::size_t next_oom = 0;
    std::vector<const Event*> ooms;
    for (const Event* e : a.notable)
      if (e->kind == EventKind::oom && slot_of.at({e->process, int{e->device}}) == d)
        ooms.push_back(e);
    const auto oom_until = [&](std::uint64_t t_ns) {
      for (; next_oom < ooms.size() && ooms[next_oom]->time_ns - a.start_ns <= t_ns; ++next_oom) {
        const Event& e = *ooms[next_oom];
        // memory_viz prints an out-of-memory with the bytes the device had free: here what was left
        // under the budget.
        p.begin_dict();
        p.str("action");
        p.str("oom");
        p.str("addr");
        p.integer(0);
        p.str("size");
        p.integer(static_cast<std::int64_t>(e.size));
        p.str("device_free");
        p.integer(static_cast<std::int64_t>(e.budget > e.reserved ? e.budget - e.reserved : 0));
        p.str("stream");
        p.integer(0);
        p.str("time_us");
        p.integer(static_cast<std::int64_t>((e.time_ns - a.start_ns) / 1000));
        p.str("frames");
        frames(-1);
        p.end_dict();
        p.item();
      }
    };
    for (const Action& x : list) {
      oom_until(x.t_ns);
      entry(x.action, x.a->addr, x.a->size, x.t_ns, x.a->site);
    }
    oom_until(UINT64_MAX);
    p.end_list();
    p.item();
  }
  p.end_list();
  p.end_dict();
  p.stop();
  out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
}

}  // namespace allocshim::analysis
