// Drafting a policy from a trace (see advise.h).
//
// The evidence the rules rest on, and why each rule helps:
//   - many small blocks that live briefly (churn): cudaMalloc/cudaFree cost ~80 us each on an H100,
//     a warm stream-ordered pool ~1.3 us, so the small sizes go to an async_pool;
//   - large blocks of varying sizes that come and go: a VMM region grows and shrinks in 2 MiB
//     chunks instead of leaving holes sized for yesterday's tensors, so the large sizes go to vmm;
//   - failed allocations or out-of-memory: a device budget with spill to host keeps the program
//     running (slower) instead of failing.
#include "trace/advise.h"

#include "policy/policy.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace allocshim::trace {
namespace {

std::uint64_t round_up_pow2(std::uint64_t v) {
  std::uint64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// A size the policy loader reads: whole KiB/MiB/GiB.
std::string policy_size(std::uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return std::to_string(b >> 30) + "GiB";
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return std::to_string(b >> 20) + "MiB";
  if (b >= 1024 && b % 1024 == 0) return std::to_string(b >> 10) + "KiB";
  return std::to_string(b);
}

std::string where(const Site& s) {
  return s.frames.empty() ? std::string("[no stack]") : s.frames[0].label();
}

std::string pct(std::uint64_t part, std::uint64_t whole) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f%%", whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
  return buf;
}

}  // namespace

std::string advise(const Analysis& a, const AdviseOptions& o) {
  const Totals& t = a.totals;
  std::ostringstream out;
  out << "# Drafted by `allocshim advise` from ";
  for (std::size_t i = 0; i < a.traces.size(); ++i) out << (i ? ", " : "") << a.traces[i].path;
  out << ".\n# " << t.allocs << " allocations (" << format_bytes(t.bytes) << "), peak live "
      << format_bytes(t.peak_live) << ", " << t.temporaries << " temporary, " << t.failures
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
  std::sort(churn.begin(), churn.end(), [](const Site* x, const Site* y) { return x->calls > y->calls; });
  const bool want_pool = small_calls >= 100 && small_calls * 2 >= t.allocs / 4;
  // Only kinds this build implements: the loader rejects the others.
  const bool use_pool = want_pool && policy::kind_implemented(BackendKind::async_pool);

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
  std::sort(large.begin(), large.end(), [](const Site* x, const Site* y) { return x->bytes > y->bytes; });
  const bool want_vmm = large_calls >= 4 && large_freed > 0 && large_max > large_min;
  const bool use_vmm = want_vmm && policy::kind_implemented(BackendKind::vmm);

  out << "\n[defaults]\n";
  out << "# Everything no rule matches keeps cudaMalloc's own behaviour.\nbackend = \"native\"\n"
         "free_sync = \"device\"\n";
  if (use_pool) {
    out << "\n[backends.pool]\n# A stream-ordered pool that keeps freed blocks for reuse.\n"
           "kind = \"async_pool\"\nrelease_threshold = \"max\"\n";
  }
  if (use_vmm) {
    out << "\n[backends.big]\n# A growable VMM region: large blocks of changing sizes without "
           "fragmentation.\nkind = \"vmm\"\nchunk = \"2MiB\"\n";
  }
  if (want_pool && !use_pool)
    out << "\n# " << small_calls << " allocations of small blocks churn: an async_pool backend would"
           " serve them, but this build does not implement it yet.\n";
  if (want_vmm && !use_vmm)
    out << "\n# " << large_calls << " large allocations of varying sizes: a vmm backend would serve"
           " them, but this build does not implement it yet.\n";
  if (use_pool) {
    const std::uint64_t limit = std::min<std::uint64_t>(round_up_pow2(std::max<std::uint64_t>(small_max, 1)), o.small_limit);
    out << "\n# Small blocks churn: " << small_calls << " allocations of at most "
        << format_bytes(small_max) << " (" << pct(small_temp, small_calls)
        << " freed before the thread's next allocation), " << format_ns(small_time)
        << " inside allocation calls.\n";
    for (std::size_t i = 0; i < churn.size() && i < o.evidence_sites; ++i)
      out << "#   " << churn[i]->calls << " calls, " << format_bytes(churn[i]->min_size) << ".."
          << format_bytes(churn[i]->max_size) << ", " << churn[i]->temporaries << " temporary: "
          << where(*churn[i]) << "\n";
    out << "[[rules]]\nsize = \"<= " << policy_size(limit) << "\"\nbackend = \"pool\"\n";
  }
  if (use_vmm) {
    out << "\n# Large blocks come and go in varying sizes: " << large_calls << " allocations of "
        << format_bytes(large_min) << ".." << format_bytes(large_max) << ", " << large_freed
        << " freed; peak live " << format_bytes(t.peak_live) << ".\n";
    for (std::size_t i = 0; i < large.size() && i < o.evidence_sites; ++i)
      out << "#   " << format_bytes(large[i]->bytes) << " in " << large[i]->calls << " calls, "
          << format_bytes(large[i]->held_at_peak) << " held at the peak: " << where(*large[i]) << "\n";
    out << "[[rules]]\nsize = \">= " << policy_size(o.large_limit) << "\"\nbackend = \"big\"\n";
  }
  if (t.failures || t.ooms) {
    out << "\n# " << t.failures << " allocations failed and " << t.ooms
        << " hit out-of-memory at a peak of " << format_bytes(t.peak_live)
        << ": a budget below the device's memory with spill to host keeps the program running.\n";
    for (const Event* e : a.notable) {
      if (e->kind != EventKind::alloc_fail && e->kind != EventKind::oom) continue;
      out << "#   first: " << format_bytes(e->size) << " on device " << e->device << " at "
          << format_ns(e->time_ns - a.start_ns) << "\n";
      break;
    }
    out << "[budget]\ndevice = \"90%\"\nspill = \"host\"\n";
  }
  if (!want_pool && !want_vmm && !t.failures && !t.ooms)
    out << "\n# No churn of small blocks, no large blocks of varying sizes and no failures: the"
           " native backend is the right one.\n";
  return out.str();
}

}  // namespace allocshim::trace
