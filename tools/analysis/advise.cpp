// Drafting a policy from a trace (see advise.h).
//
// It starts from the embedded default policy, which the measurements behind it (docs/policy.md,
// "Why the default is what it is") show serving a cudaMalloc+cudaFree pair fastest of the safe pairs: `vmm` keeps
// freed blocks mapped and hands them out again, and grows and shrinks in 2 MiB chunks, so both a
// churn of small blocks and large blocks of changing sizes are served by the default itself (the
// draft cites them, it needs no rule for them). It departs from the default where the trace says:
//   - nothing churns and no large block comes and goes: caching cannot pay, while vmm maps a fresh
//     block 2 MiB at a time (slower than cudaMalloc for a large one), so native serves it;
//   - failed allocations or out-of-memory: a device budget with spill to host keeps the program
//     running (slower) instead of failing.
#include "analysis/advise.h"

#include "base/human.h"
#include "policy/policy.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace allocshim::analysis {
namespace {

std::string where(const Site& s) {
  return s.frames.empty() ? std::string("[no stack]") : s.frames[0].label();
}

std::string pct(std::uint64_t part, std::uint64_t whole) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f%%",
                whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
  return buf;
}

}  // namespace

std::string advise(const Analysis& a, const AdviseOptions& o) {
  const Totals& t = a.totals;
  std::ostringstream out;
  out << "# Drafted by `allocshim advise` from ";
  for (std::size_t i = 0; i < a.traces.size(); ++i) out << (i ? ", " : "") << a.traces[i].path;
  out << ".\n# " << t.allocs << " allocations (" << human_bytes(t.bytes) << "), peak live "
      << human_bytes(t.peak_live) << ", " << t.temporaries << " temporary, " << t.failures
      << " failed, " << t.ooms << " out of memory, " << format_ns(t.alloc_time_ns)
      << " inside allocation calls.\n# Check it with `allocshim check FILE`; compare it with others with"
         " `allocshim replay TRACE --policy FILE`.\nversion = 1\n";

  // Churn of small blocks.
  std::vector<const Site*> churn;
  std::uint64_t small_calls = 0, small_temp = 0, small_time = 0, small_max = 0;
  for (const Site& s : a.sites) {
    if (s.calls == 0 || s.max_size > o.small_limit) continue;
    small_calls += s.calls;
    small_temp += s.temporaries;
    small_time += s.time_ns;
    small_max = std::max(small_max, s.max_size);
    churn.push_back(&s);
  }
  std::sort(churn.begin(), churn.end(),
            [](const Site* x, const Site* y) { return x->calls > y->calls; });
  const bool churns = small_calls >= 100 && small_calls * 2 >= t.allocs / 4;

  // Large blocks that come and go with varying sizes.
  std::vector<const Site*> large;
  std::uint64_t large_calls = 0, large_freed = 0, large_min = UINT64_MAX, large_max = 0;
  for (const Site& s : a.sites) {
    if (s.calls == 0 || s.max_size < o.large_limit) continue;
    large_calls += s.calls;
    large_freed += s.freed;
    large_min = std::min(large_min, s.min_size);
    large_max = std::max(large_max, s.max_size);
    large.push_back(&s);
  }
  std::sort(large.begin(), large.end(),
            [](const Site* x, const Site* y) { return x->bytes > y->bytes; });
  const bool large_vary = large_calls >= 4 && large_freed > 0 && large_max > large_min;

  const policy::Policy& def = policy::default_policy();
  const policy::BackendSpec& def_backend =
      def.backends[static_cast<std::size_t>(def.default_backend)];
  out << "\n[defaults]\n";
  if (churns || large_vary) {
    out << "# The embedded default (`allocshim check --print-default`): the fastest measured for the"
           " reuse below.\nbackend = \""
        << def_backend.name << "\"\n";
  } else {
    out << "# Nothing churns and no large block comes and goes: a cache cannot pay here, and "
        << def_backend.name
        << "\n# (the embedded default) would map each fresh block 2 MiB at a time. Native it is.\n"
           "backend = \"native\"\n";
  }
  out << "free_sync = \"" << free_sync_name(def.default_free_sync) << "\"\n";
  if (churns) {
    out << "\n# Small blocks churn, served from the default's cache of freed blocks: "
        << small_calls << " allocations of at most " << human_bytes(small_max) << " ("
        << pct(small_temp, small_calls) << " freed before the thread's next allocation), "
        << format_ns(small_time) << " inside allocation calls.\n";
    for (std::size_t i = 0; i < churn.size() && i < o.evidence_sites; ++i)
      out << "#   " << churn[i]->calls << " calls, " << human_bytes(churn[i]->min_size) << ".."
          << human_bytes(churn[i]->max_size) << ", " << churn[i]->temporaries
          << " temporary: " << where(*churn[i]) << "\n";
  }
  if (large_vary) {
    out << "\n# Large blocks come and go in varying sizes, served by the default's regions growing and"
           " shrinking\n# in 2 MiB chunks: "
        << large_calls << " allocations of " << human_bytes(large_min) << ".."
        << human_bytes(large_max) << ", " << large_freed << " freed; peak live "
        << human_bytes(t.peak_live) << ".\n";
    for (std::size_t i = 0; i < large.size() && i < o.evidence_sites; ++i)
      out << "#   " << human_bytes(large[i]->bytes) << " in " << large[i]->calls << " calls, "
          << human_bytes(large[i]->held_at_peak) << " held at the peak: " << where(*large[i])
          << "\n";
  }
  if (t.failures || t.ooms) {
    out << "\n# " << t.failures << " allocations failed and " << t.ooms
        << " hit out-of-memory at a peak of " << human_bytes(t.peak_live)
        << ": a budget below the device's memory with spill to host keeps the program running.\n";
    for (const Event* e : a.notable) {
      if (e->kind != EventKind::alloc_fail && e->kind != EventKind::oom) continue;
      out << "#   first: " << human_bytes(e->size) << " on device " << e->device << " at "
          << format_ns(e->time_ns - a.start_ns) << "\n";
      break;
    }
    out << "[budget]\ndevice = \"90%\"\nspill = \"host\"\n";
  }
  return out.str();
}

}  // namespace allocshim::analysis
