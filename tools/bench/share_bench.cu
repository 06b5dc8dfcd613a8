// Two processes sharing one device budget ([budget] share, docs/oversubscription.md): each holds a
// hot set (6 GiB by default, in pieces) for the whole run and alternates an active phase (kernels
// add 1 to every word of its set, `passes` times) with an idle phase (waiting for its turn,
// synchronizing every few milliseconds: the safe points where it can give room back). Turns pass
// through pipes, so exactly one process is active at a time. At the end each verifies every word
// of its set with a kernel.
//
//   share_bench --mode shared       both processes at once, turns alternating
//   share_bench --mode sequential   the same work, one process after the other (nothing shared)
//   share_bench --mode handoff      process 0 holds its set idle, process 1 then allocates its own
//                                   (a request for room answered by demotion, see handoff())
//   share_bench --mode link         no second process, no budget: how fast pinned host memory and
//                                   the device copy each way (the bound on what a turn can move)
//
// --timeline PREFIX: each process writes PREFIX.ID, one line per pass: round, pass, and the pass's
// end on the steady clock (CLOCK_MONOTONIC, the clock of the shim's traces) in seconds, so a
// turn change's passes can be lined up with the moves a trace recorded.
//
// --start sets who allocates when, which decides how the budget is split when the turns begin:
//   any       (default) every process at once, as it comes: which of the splits below a run gets
//             is the start order's doing
//   together  piece by piece in lockstep, so that the budget runs out while every process
//             allocates and each spills part of its set ("both at once" in the results)
//   apart     one after the other, each once the one before has filled its set
// A process waiting for the others makes no CUDA call (no safe point where the shim could give
// room): it is as busy starting up as they are.
//
// --passes sets a turn's compute: each pass sweeps the whole set, so with a set larger than half
// the budget a turn that passes the room on must move (2 x hot - budget) bytes each way first;
// share_bench.sh picks the passes of its long turns from that and the measured link.
//
// Run under the shim with one shared budget, e.g. (tests/gpu/results/README.md lists the runs):
//   allocshim run --conf budget.device=8GiB,budget.spill=host,budget.share=user -- share_bench --mode shared
// The parent never touches CUDA (its children could not use CUDA after a fork otherwise); it
// prints one line per process and phase, then a summary line (total seconds; for shared and
// sequential also the turns' seconds: the time of the turns without the processes' start, first
// fill and final check, see main; exit status).
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "oversub_common.h"

namespace {

using gpu_test::pattern;
using oversub::grid_blocks;
using oversub::kGiB;
using oversub::parse_size;

struct Options {
  std::string mode = "shared";
  std::size_t hot = 6 * kGiB;
  int pieces = 3, rounds = 3, passes = 10, procs = 2;
  std::string timeline;  // empty: none
  std::string start = "any";
};

__global__ void add_one(std::uint32_t* p, std::size_t n) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] += 1;
}

__global__ void count_bad(const std::uint32_t* p, std::size_t n, std::uint32_t seed,
                          std::uint32_t added, unsigned long long* bad) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  unsigned long long mine = 0;
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    mine += p[i] != pattern(i, seed) + added;
  if (mine) atomicAdd(bad, mine);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// When each process finished filling its set and when each of its active phases began and ended
// (steady clock, seconds; 0: not yet), in memory shared with the parent, which sums a run's turns
// from them: process id's record is at id * stride, {ready, start 0, end 0, start 1, end 1, ...}.
double* g_times = nullptr;
std::size_t g_stride = 0;
// How many times the processes have passed the start's gate (--start), in the same memory.
int* g_gate = nullptr;

// pass_gate counts one more pass; wait_gate waits until the gate counts `until` passes, for a
// minute at most (another process failed).
void pass_gate() { __atomic_add_fetch(g_gate, 1, __ATOMIC_SEQ_CST); }
void wait_gate(int until) {
  const double give_up = now_s() + 60;
  while (__atomic_load_n(g_gate, __ATOMIC_SEQ_CST) < until) {
    if (now_s() > give_up) {
      std::fprintf(stderr, "share_bench: the other processes never reached the start's gate\n");
      std::exit(1);
    }
    ::usleep(100);
  }
}

// A process's set: o.pieces pieces of o.hot / o.pieces bytes, and the counter its check uses.
struct Set {
  std::vector<std::uint32_t*> pieces;
  unsigned long long* bad = nullptr;
};

// Allocates the counter, then allocates and fills process `id`'s set (timed). The counter first:
// allocated at the end, with the budget full, it would wait for the other process to give room
// at a safe point while that one waits likewise (share_wait_ms each).
Set make_set(int id, const Options& o) {
  Set out;
  CHECK(cudaMalloc(&out.bad, sizeof *out.bad));
  const std::size_t piece = o.hot / static_cast<std::size_t>(o.pieces);
  std::vector<std::uint32_t*>& set = out.pieces;
  set.resize(static_cast<std::size_t>(o.pieces));
  // apart: each process passes the gate once it has filled its set (below).
  if (o.start == "apart") wait_gate(id);
  const double t_alloc = now_s();
  for (int k = 0; k < o.pieces; ++k) {
    if (o.start == "together") {
      CHECK(cudaDeviceSynchronize());  // the piece before filled: the gate lines up allocations
      pass_gate();
      wait_gate(o.procs * (k + 1));
    }
    CHECK(cudaMalloc(&set[static_cast<std::size_t>(k)], piece));
    oversub::fill(set[static_cast<std::size_t>(k)], piece,
                  static_cast<std::uint32_t>(id * 100 + k));
  }
  CHECK(cudaDeviceSynchronize());
  std::printf("proc %d: allocated and filled %.1f GiB in %d pieces in %.3f s\n", id,
              double(o.hot) / kGiB, o.pieces, now_s() - t_alloc);
  std::fflush(stdout);
  if (o.start == "apart") pass_gate();
  return out;
}

// Checks every word of the set (filled, then `added` added to each) and frees it: 0 if all were right.
int check_and_free(int id, const Options& o, const Set& s, std::uint32_t added) {
  const std::size_t piece = o.hot / static_cast<std::size_t>(o.pieces);
  const std::vector<std::uint32_t*>& set = s.pieces;
  unsigned long long* bad = s.bad;
  CHECK(cudaMemset(bad, 0, sizeof *bad));
  for (int k = 0; k < o.pieces; ++k)
    count_bad<<<grid_blocks(), 512>>>(set[static_cast<std::size_t>(k)], piece / 4,
                                      static_cast<std::uint32_t>(id * 100 + k), added, bad);
  unsigned long long host_bad = 0;
  CHECK(cudaMemcpy(&host_bad, bad, sizeof host_bad, cudaMemcpyDeviceToHost));
  std::printf("proc %d: verified %.1f GiB, %llu bad words\n", id, double(o.hot) / kGiB, host_bad);
  std::fflush(stdout);
  for (std::uint32_t* p : set) CHECK(cudaFree(p));
  CHECK(cudaFree(bad));
  return host_bad == 0 ? 0 : 1;
}

// One process's whole run. `turn_in`: a byte arrives when it may be active (-1: always);
// `turn_out`: it writes one when its active phase is over (-1: nobody waits). Returns bad words.
int worker(int id, const Options& o, int turn_in, int turn_out) {
  oversub::require_gpu();
  CHECK(cudaSetDevice(0));
  const std::size_t piece = o.hot / static_cast<std::size_t>(o.pieces);
  const Set mine = make_set(id, o);
  const std::vector<std::uint32_t*>& set = mine.pieces;
  double* times = g_times ? g_times + static_cast<std::size_t>(id) * g_stride : nullptr;
  if (times) times[0] = now_s();
  // Written after the run, from memory: writing per pass would slow the passes it measures.
  std::vector<double> pass_end;
  if (!o.timeline.empty()) pass_end.reserve(static_cast<std::size_t>(o.rounds) * o.passes);
  for (int r = 0; r < o.rounds; ++r) {
    // Idle: wait for the turn, reaching a safe point every 5 ms.
    const double t_idle = now_s();
    if (turn_in >= 0) {
      for (;;) {
        pollfd p{turn_in, POLLIN, 0};
        if (::poll(&p, 1, 5) == 1) {
          char c;
          if (::read(turn_in, &c, 1) != 1) return -1;
          break;
        }
        CHECK(cudaDeviceSynchronize());
      }
    }
    const double idle = now_s() - t_idle;
    // Active: `passes` read-modify-write sweeps over the whole set, synchronized after each (a
    // program waiting for its results; also where the shim may move memory).
    const double t0 = now_s();
    for (int pass = 0; pass < o.passes; ++pass) {
      for (std::uint32_t* p : set) add_one<<<grid_blocks(), 512>>>(p, piece / 4);
      CHECK(cudaDeviceSynchronize());
      if (!o.timeline.empty()) pass_end.push_back(now_s());
    }
    const double t1 = now_s();
    const double active = t1 - t0;
    if (times) {
      times[1 + 2 * r] = t0;
      times[2 + 2 * r] = t1;
    }
    std::printf("proc %d round %d: idle %.2f s, active %.3f s, %.1f GB/s (read+write)\n", id, r,
                idle, active, 2.0 * double(o.hot) * o.passes / active / 1e9);
    std::fflush(stdout);
    // The next process may have finished its last round and gone (EPIPE: nobody waits).
    if (turn_out >= 0 && ::write(turn_out, "t", 1) != 1 && errno != EPIPE) return -1;
  }
  if (!o.timeline.empty()) {
    const std::string path = o.timeline + "." + std::to_string(id);
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      for (std::size_t i = 0; i < pass_end.size(); ++i)
        std::fprintf(f, "%zu %zu %.6f\n", i / o.passes, i % o.passes, pass_end[i]);
      std::fclose(f);
    } else {
      std::fprintf(stderr, "share_bench: cannot write %s: %s\n", path.c_str(),
                   std::strerror(errno));
    }
  }
  return check_and_free(id, o, mine, static_cast<std::uint32_t>(o.rounds * o.passes));
}

// --mode handoff: process 0 allocates and fills its set, then idles (a safe point every 5 ms)
// holding it, cold; then process 1 allocates a set of its own, timed, and sweeps it `passes` times.
// Under migrate = "auto" process 1's allocation asks process 0 for room and process 0 demotes its
// cold set at its next safe points; both verify their sets at the end.
int handoff(int id, const Options& o, int in, int out) {
  oversub::require_gpu();
  CHECK(cudaSetDevice(0));
  char c = 0;
  if (id == 1 && ::read(in, &c, 1) != 1) return -1;  // process 0 holds its set
  const std::size_t piece = o.hot / static_cast<std::size_t>(o.pieces);
  const Set mine = make_set(id, o);
  const std::vector<std::uint32_t*>& set = mine.pieces;
  int passes = 0;
  if (id == 0) {
    if (::write(out, "r", 1) != 1) return -1;
    for (;;) {  // idle until process 1 is done
      pollfd p{in, POLLIN, 0};
      if (::poll(&p, 1, 5) == 1) break;
      CHECK(cudaDeviceSynchronize());
    }
  } else {
    const double t0 = now_s();
    for (; passes < o.passes; ++passes) {
      for (std::uint32_t* p : set) add_one<<<grid_blocks(), 512>>>(p, piece / 4);
      CHECK(cudaDeviceSynchronize());
    }
    const double active = now_s() - t0;
    std::printf("proc 1: %d sweeps in %.3f s, %.1f GB/s (read+write)\n", passes, active,
                2.0 * double(o.hot) * passes / active / 1e9);
    std::fflush(stdout);
    if (::write(out, "d", 1) != 1) return -1;
  }
  return check_and_free(id, o, mine, static_cast<std::uint32_t>(passes));
}

// --mode link: copies of 1 GiB between pinned host memory and the device, host->device, then
// device->host, then both at once on two streams; prints the best of 5 of each in GB/s.
int link_speed() {
  oversub::require_gpu();
  CHECK(cudaSetDevice(0));
  constexpr std::size_t kBytes = kGiB;
  void *host_in = nullptr, *host_out = nullptr, *dev_in = nullptr, *dev_out = nullptr;
  CHECK(cudaMallocHost(&host_in, kBytes));
  CHECK(cudaMallocHost(&host_out, kBytes));
  CHECK(cudaMalloc(&dev_in, kBytes));
  CHECK(cudaMalloc(&dev_out, kBytes));
  std::memset(host_in, 1, kBytes);
  std::memset(host_out, 2, kBytes);
  cudaStream_t s[2];
  for (cudaStream_t& x : s) CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  // Seconds for the copies `which` selects (1: to the device, 2: to the host, 3: both at once).
  const auto timed = [&](int which) {
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      CHECK(cudaDeviceSynchronize());
      const double t0 = now_s();
      if (which & 1) CHECK(cudaMemcpyAsync(dev_in, host_in, kBytes, cudaMemcpyHostToDevice, s[0]));
      if (which & 2)
        CHECK(cudaMemcpyAsync(host_out, dev_out, kBytes, cudaMemcpyDeviceToHost, s[1]));
      CHECK(cudaDeviceSynchronize());
      best = std::min(best, now_s() - t0);
    }
    return double(kBytes) / best / 1e9;
  };
  const double in = timed(1), out = timed(2), both = timed(3);
  std::printf(
      "link: host->device %.1f GB/s, device->host %.1f GB/s, both at once %.1f GB/s each way\n", in,
      out, both);
  for (cudaStream_t x : s) CHECK(cudaStreamDestroy(x));
  CHECK(cudaFree(dev_in));
  CHECK(cudaFree(dev_out));
  CHECK(cudaFreeHost(host_in));
  CHECK(cudaFreeHost(host_out));
  return 0;
}

pid_t start(int id, const Options& o, int turn_in, int turn_out,
            const std::vector<int>& close_fds) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (int fd : close_fds)
      if (fd != turn_in && fd != turn_out) ::close(fd);
    std::signal(SIGPIPE, SIG_IGN);  // a write to a process that is gone is EPIPE, handled
    std::fflush(stdout);
    // exit: the shim writes its stats and leaves the region.
    std::exit(o.mode == "handoff" ? handoff(id, o, turn_in, turn_out)
                                  : worker(id, o, turn_in, turn_out));
  }
  return pid;
}

int wait_all(const std::vector<pid_t>& pids) {
  int worst = 0;
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc == 77 && worst == 0)
      worst = 77;
    else if (rc != 0 && rc != 77)
      worst = rc;
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 == argc) {
      std::fprintf(stderr, "share_bench: %s needs a value\n", argv[i]);
      return 2;
    }
    if (k == "--mode")
      o.mode = argv[i + 1];
    else if (k == "--hot")
      o.hot = parse_size(argv[i + 1]);
    else if (k == "--pieces")
      o.pieces = std::atoi(argv[i + 1]);
    else if (k == "--rounds")
      o.rounds = std::atoi(argv[i + 1]);
    else if (k == "--passes")
      o.passes = std::atoi(argv[i + 1]);
    else if (k == "--timeline")
      o.timeline = argv[i + 1];
    else if (k == "--start")
      o.start = argv[i + 1];
    else {
      std::fprintf(stderr, "share_bench: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if ((o.mode != "shared" && o.mode != "sequential" && o.mode != "handoff" && o.mode != "link") ||
      o.pieces < 1 || o.rounds < 1 || o.passes < 1 ||
      (o.start != "any" && o.start != "together" && o.start != "apart")) {
    std::fprintf(stderr, "share_bench: bad options\n");
    return 2;
  }
  std::fflush(stdout);
  if (o.mode == "link") return link_speed();  // one process, no fork after its CUDA use
  g_stride = 1 + 2 * static_cast<std::size_t>(o.rounds);
  const std::size_t times_bytes =
      sizeof(double) * g_stride * static_cast<std::size_t>(o.procs) + sizeof(double);
  void* times =
      ::mmap(nullptr, times_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (times == MAP_FAILED) {
    std::perror("share_bench: mmap");
    return 1;
  }
  g_times = static_cast<double*>(times);  // zeroed by mmap
  g_gate = reinterpret_cast<int*>(g_times + g_stride * static_cast<std::size_t>(o.procs));
  const double t0 = now_s();
  int rc = 0;
  if (o.mode == "sequential") {
    for (int id = 0; id < o.procs && rc == 0; ++id) rc = wait_all({start(id, o, -1, -1, {})});
  } else {
    // A ring of pipes: process i waits on ring[i] and hands the turn on through ring[i + 1].
    std::vector<int> fds;
    std::vector<std::array<int, 2>> ring(static_cast<std::size_t>(o.procs));
    for (auto& p : ring) {
      if (::pipe(p.data()) != 0) return 1;
      fds.push_back(p[0]);
      fds.push_back(p[1]);
    }
    std::vector<pid_t> pids;
    for (int id = 0; id < o.procs; ++id)
      pids.push_back(start(id, o, ring[static_cast<std::size_t>(id)][0],
                           ring[static_cast<std::size_t>((id + 1) % o.procs)][1], fds));
    if (o.mode == "shared" && ::write(ring[0][1], "t", 1) != 1) return 1;  // process 0 goes first
    for (int fd : fds) ::close(fd);
    rc = wait_all(pids);
  }
  const double total = now_s() - t0;
  // The turns. One after the other: each process's first start to its last end, summed. Shared:
  // once every process has filled its set, every second until the last turn ends; before that,
  // only the active phases (the other process was still starting, as it is outside the
  // sequential turns).
  double turns = 0, ready = 0, last = 0;
  for (int id = 0; id < o.procs; ++id) {
    const double* t = g_times + static_cast<std::size_t>(id) * g_stride;
    ready = std::max(ready, t[0]);
    if (t[1] > 0) turns += t[2 * o.rounds] - t[1];
    last = std::max(last, t[2 * o.rounds]);
  }
  if (o.mode == "shared" && last > 0) {
    turns = last - ready;
    for (int id = 0; id < o.procs; ++id)
      for (int r = 0; r < o.rounds; ++r) {
        const double* t = g_times + static_cast<std::size_t>(id) * g_stride + 1 + 2 * r;
        if (t[0] > 0) turns += std::max(0.0, std::min(t[1], ready) - t[0]);
      }
  }
  std::string turns_text;
  if (o.mode != "handoff") {
    char buf[48];
    std::snprintf(buf, sizeof buf, ", turns %.2f s", turns);
    turns_text = buf;
  }
  std::printf(
      "share_bench %s: %d processes x %.1f GiB, %d rounds x %d passes: %.2f s total%s, exit %d\n",
      o.mode.c_str(), o.procs, double(o.hot) / kGiB, o.rounds, o.passes, total, turns_text.c_str(),
      rc);
  ::munmap(times, times_bytes);
  return rc;
}
