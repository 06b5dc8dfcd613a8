// Drives the preload test programs (programs/*.c): each runs under LD_PRELOAD of the shim against
// the fake libcuda, and is checked three ways: its own checks (exit status), what it reports
// (key=value lines: its call counts and what the fake libcuda saw), and the shim's stats file
// (ALLOCSHIM_STATS). Programs are also run without the shim, so a failure points at the shim only
// when the program passes on its own.
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kTimeoutSeconds = 60;

struct Outcome {
  int status = -1;  // exit status, or 128 + signal
  std::string out, err;
  std::map<std::string, unsigned long long> report;  // the program's key=value lines
  unsigned long long at(const std::string& key) const {
    auto it = report.find(key);
    return it == report.end() ? ~0ull : it->second;
  }
};

// The shim under test: the one built with these tests, unless ALLOCSHIM_TEST_SHIM names another
// (e.g. an installed build).
std::string shim() {
  const char* other = std::getenv("ALLOCSHIM_TEST_SHIM");
  return other != nullptr && *other != '\0' ? other : ALLOCSHIM_SHIM;
}

std::string program(const std::string& name) {
  return std::string(ALLOCSHIM_PROGRAM_DIR) + "/" + name;
}

// Runs `argv` with the environment of this process minus anything allocshim or the loader would
// read, plus `env`. Output is collected; a run past kTimeoutSeconds is killed (and fails).
Outcome run(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    if (kv.rfind("LD_PRELOAD=", 0) == 0 || kv.rfind("LD_LIBRARY_PATH=", 0) == 0 ||
        kv.rfind("ALLOCSHIM_", 0) == 0 || kv.rfind("FAKECUDA_", 0) == 0)
      continue;
    envs.push_back(kv);
  }
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);

  int out[2], err[2];
  Outcome r;
  if (pipe(out) != 0 || pipe(err) != 0) return r;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    close(out[0]);
    close(err[0]);
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kTimeoutSeconds);
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      kill(pid, SIGKILL);
      r.err += "\n[preload_test: killed after " + std::to_string(kTimeoutSeconds) + " s]";
      break;
    }
    if (poll(fds, 2, static_cast<int>(left.count())) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? r.out : r.err).append(buf, static_cast<std::size_t>(n));
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  waitpid(pid, &status, 0);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) r.report[line.substr(0, eq)] = std::stoull(line.substr(eq + 1));
  }
  return r;
}

// What a run's stats file says, summed over backends and devices.
struct Stats {
  json raw;
  unsigned long long allocs = 0, frees = 0, failures = 0, live = 0;
  unsigned long long api(const char* name) const { return raw["api"].value(name, 0ull); }
  unsigned long long unknown_frees() const { return raw.value("unknown_frees", 0ull); }
};

Stats read_stats(const std::string& path) {
  Stats s;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "no stats file " << path;
  if (!in.good()) return s;
  s.raw = json::parse(in, nullptr, false);
  EXPECT_FALSE(s.raw.is_discarded()) << "stats file is not JSON: " << path;
  if (s.raw.is_discarded()) return s;
  for (const auto& b : s.raw["backends"])
    for (const auto& d : b["devices"]) {
      s.allocs += d.value("allocs", 0ull);
      s.frees += d.value("frees", 0ull);
      s.failures += d.value("failures", 0ull);
      s.live += d.value("live", 0ull);
    }
  return s;
}

class Preload : public ::testing::Test {
 protected:
  void SetUp() override {
    // mkdtemp: a parameterized test's name holds a '/', which would make a nested directory.
    std::string dir = (fs::temp_directory_path() / "allocshim_preload_XXXXXX").string();
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  std::string stats_path() const { return (dir_ / "stats.json").string(); }

  // prog_linked's own counts against the shim's: every device allocation and free by API, none
  // live or failed at exit, and the program's one free of a pointer nobody allocated forwarded.
  static void expect_linked_counts(const Stats& s, const Outcome& r) {
    for (const char* api : {"alloc", "pitch", "managed", "async"})
      EXPECT_EQ(s.api(api), r.at(api)) << api;
    const unsigned long long device_allocs =
        r.at("alloc") + r.at("pitch") + r.at("managed") + r.at("async");
    EXPECT_EQ(s.allocs, device_allocs);
    EXPECT_EQ(s.frees, device_allocs);
    EXPECT_EQ(s.live, 0u);
    EXPECT_EQ(s.failures, 0u);
    EXPECT_EQ(s.unknown_frees(), 1u);
  }

  // Runs `argv` against the fake libcuda; `preload` is the LD_PRELOAD list ("" for none).
  Outcome run_with(const std::vector<std::string>& argv, const std::string& preload,
                   std::vector<std::string> env = {}) {
    env.push_back(std::string("LD_LIBRARY_PATH=") + ALLOCSHIM_FAKE_LIBCUDA_DIR);
    env.push_back("ALLOCSHIM_QUIET=1");
    if (!preload.empty()) env.push_back("LD_PRELOAD=" + preload);
    Outcome r = run(argv, env);
    EXPECT_EQ(r.status, 0) << argv[0] << (preload.empty() ? " without" : " with") << " preload\n"
                           << "stdout:\n"
                           << r.out << "stderr:\n"
                           << r.err;
    return r;
  }
  // `preload` defaults to the shim alone.
  // The route tests compare what the program did with what reached the driver call by call, so they
  // pin the passthrough backend; the default policy's pooling backend runs in PreloadBackend below.
  Outcome run_shim(const std::vector<std::string>& argv, const std::string& preload = shim()) {
    return run_with(argv, preload, {"ALLOCSHIM_STATS=" + stats_path(), "ALLOCSHIM_BACKEND=native"});
  }

  fs::path dir_;
};

// The exit summary and the stats file say which overrides were in force: under
// `allocshim run --backend vmm` the policy is not the default alone.
TEST_F(Preload, TheExitSummaryNamesTheOverridesInForce) {
  const Outcome r =
      run({program("prog_linked")}, {std::string("LD_LIBRARY_PATH=") + ALLOCSHIM_FAKE_LIBCUDA_DIR,
                                     "LD_PRELOAD=" + shim(), "ALLOCSHIM_STATS=" + stats_path(),
                                     "ALLOCSHIM_BACKEND=vmm", "ALLOCSHIM_CONF=free_sync=barrier"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find(", policy <default>, overridden by ALLOCSHIM_BACKEND=vmm, "
                       "ALLOCSHIM_CONF=free_sync=barrier\n"),
            std::string::npos)
      << r.err;
  const Stats s = read_stats(stats_path());
  EXPECT_EQ(s.raw.value("overrides", ""),
            "ALLOCSHIM_BACKEND=vmm, ALLOCSHIM_CONF=free_sync=barrier");
}

// A policy file routes two sizes of the same program to different backends: prog_linked allocates
// 256 B << (i % 12) for i < 100, so 32 of its cuMemAlloc calls are >= 64 KiB.
TEST_F(Preload, PolicyRuleRoutesTwoSizesToDifferentBackends) {
  const std::string policy = (dir_ / "two-sizes.toml").string();
  {
    std::ofstream f(policy);
    f << "version = 1\n[defaults]\nbackend = \"native\"\n[backends.pooled]\nkind = \"vmm\"\n"
         "[[rules]]\nsize = \">= 64KiB\"\napi = \"alloc\"\nbackend = \"pooled\"\nfree_sync = \"device\"\n";
  }
  const Outcome r = run_with({program("prog_linked")}, shim(),
                             {"ALLOCSHIM_STATS=" + stats_path(), "ALLOCSHIM_POLICY=" + policy});
  ASSERT_EQ(r.status, 0);
  const Stats s = read_stats(stats_path());
  unsigned long long pooled = 0, native_alloc = 0;
  for (const auto& b : s.raw["backends"]) {
    unsigned long long allocs = 0;
    for (const auto& d : b["devices"]) allocs += d["allocs"].get<unsigned long long>();
    if (b["name"] == "pooled") pooled += allocs;
    if (b["kind"] == "native") native_alloc += allocs;
  }
  EXPECT_EQ(pooled, 32u) << "the allocations >= 64 KiB went to the rule's vmm backend";
  EXPECT_EQ(r.at("fake_cuMemAlloc_v2"), r.at("alloc") - 32)
      << "only the smaller ones reached cuMemAlloc";
  EXPECT_GT(native_alloc, 0u);
  EXPECT_EQ(s.frees, s.allocs);
}

// (a) Exported symbols: a program linked against libcuda.
TEST_F(Preload, LinkedProgramIsCountedAndReachesTheDriver) {
  const Outcome bare = run_with({program("prog_linked")}, "");
  ASSERT_EQ(bare.status, 0);
  const Outcome r = run_shim({program("prog_linked")});
  ASSERT_EQ(r.status, 0);
  const Stats s = read_stats(stats_path());
  expect_linked_counts(s, r);
  EXPECT_EQ(s.api("host"), r.at("host"));
  // Pinned to native: every allocation reached the driver once, as without the shim.
  for (const char* key : {"fake_cuMemAlloc_v2", "fake_cuMemAllocPitch_v2", "fake_cuMemAllocManaged",
                          "fake_cuMemHostAlloc", "fake_cuMemAllocAsync"})
    EXPECT_EQ(r.at(key), bare.at(key)) << key;
  EXPECT_EQ(r.at("fake_cuMemAlloc_v2"), r.at("alloc"));
  // cuMemFree_v2 reached the fake for the allocations, the pitch and managed ones, and the bogus one.
  EXPECT_EQ(r.at("fake_cuMemFree_v2"), bare.at("fake_cuMemFree_v2"));
}

// (b) dlopen + cuGetProcAddress_v2, as the static CUDA runtime does.
TEST_F(Preload, ResolverRouteIsCounted) {
  ASSERT_EQ(run_with({program("prog_resolver")}, "").status, 0);
  const Outcome r = run_shim({program("prog_resolver")});
  ASSERT_EQ(r.status, 0);
  const Stats s = read_stats(stats_path());
  EXPECT_EQ(s.api("alloc"), 100u);
  EXPECT_EQ(s.allocs, 100u);
  EXPECT_EQ(s.frees, 100u);
  EXPECT_EQ(r.at("fake_cuMemAlloc_v2"), 100u);
  EXPECT_EQ(r.at("fake_cuMemFree_v2"), 100u);
  EXPECT_EQ(r.at("fake_cuMemAlloc"), 1u);  // the v1 call went straight to the driver
}

// Live migration end to end (docs/oversubscription.md, "Migration"): the synchronization hooks are
// safe points, and the program's own cuMemCreate past the budget goes to the host.
TEST_F(Preload, MigrationThroughTheHooks) {
  const Outcome r =
      run_with({program("prog_migrate")}, shim(),
               {"ALLOCSHIM_STATS=" + stats_path(),
                "ALLOCSHIM_CONF=budget.device=64MiB,budget.spill=host,budget.migrate=auto"});
  ASSERT_EQ(r.status, 0);
  const Stats s = read_stats(stats_path());
  ASSERT_TRUE(s.raw.contains("budget")) << s.raw.dump();
  const json& b = s.raw["budget"][0];
  constexpr unsigned long long kMiB = 1 << 20;
  EXPECT_EQ(b["demoted_bytes"], 48 * kMiB) << b.dump();
  EXPECT_EQ(b["promoted_bytes"], 48 * kMiB) << "at cuStreamSynchronize, not before";
  EXPECT_EQ(b["spilled_allocs"], 1u) << "the program's cuMemCreate, made on the host";
  EXPECT_EQ(b["spilled_bytes"], 32 * kMiB);
  EXPECT_EQ(b["move_failures"], 0u);
  EXPECT_EQ(b["shim_syncs"], 2u) << "one to make room, one at cuStreamSynchronize";
  EXPECT_LE(b["peak_backed"].get<unsigned long long>(), 64 * kMiB);
}

// [compute] shares end to end (docs/operators.md, "Compute share and priority"): two processes
// launching kernels of known length through the hooks split the time by their shares, the slices
// are in their stats files, and the region is gone after the last one exits.
TEST_F(Preload, ComputeSharesSplitTheTimeBetweenProcesses) {
  const std::string start = std::to_string(static_cast<double>(::time(nullptr)) + 2.0);
  const std::string share_dir = "ALLOCSHIM_SHARE_DIR=" + dir_.string();
  Outcome a, b;
  auto one = [&](Outcome& out, const char* share, const std::string& stats) {
    out = run_with(
        {program("prog_compute"), start, "1.5"}, shim(),
        {share_dir, "ALLOCSHIM_STATS=" + stats,
         std::string("ALLOCSHIM_CONF=compute.scope=user,compute.period_ms=20,compute.share=") +
             share});
  };
  const std::string stats_a = (dir_ / "a.json").string(), stats_b = (dir_ / "b.json").string();
  std::thread ta(one, std::ref(a), "30%", stats_a), tb(one, std::ref(b), "100%", stats_b);
  ta.join();
  tb.join();
  ASSERT_EQ(a.status, 0);
  ASSERT_EQ(b.status, 0);
  const double ka = static_cast<double>(a.at("kernels")), kb = static_cast<double>(b.at("kernels"));
  EXPECT_NEAR(ka / (ka + kb), 0.30, 0.10) << ka << " and " << kb << " kernels";
  for (const std::string& path : {stats_a, stats_b}) {
    const json c = read_stats(path).raw["compute"];
    EXPECT_TRUE(c["active"].get<bool>()) << c.dump();
    EXPECT_GT(c["slices"].get<unsigned long long>(), 5u) << c.dump();
    fs::remove(path);
  }
  for (const auto& e : fs::directory_iterator(dir_)) ADD_FAILURE() << e.path() << " is left behind";
}

// Pinning ahead end to end (docs/design/oversubscription.md, "Pinning ahead"): the pinner thread
// started by an allocation near the budget is joined at exit and what it pinned is given back
// before the stats are written; a forked child's exit does not wait for the parent's pinner (it
// does not exist there) and the child, whose core is its own, pinned nothing ahead.
TEST_F(Preload, PinAheadIsJoinedAtExitAndForgottenInAForkedChild) {
  const std::string pattern = (dir_ / "stats.%p.json").string();
  const Outcome r =
      run_with({program("prog_pin_ahead"), "fork"}, shim(),
               {"ALLOCSHIM_STATS=" + pattern,
                "ALLOCSHIM_CONF=budget.device=64MiB,budget.spill=host,budget.migrate=auto,"
                "backends.host.pin_ahead=true"});
  ASSERT_EQ(r.status, 0) << "a hang at exit is killed by the program's alarm";
  const std::string parent_file =
      (dir_ / ("stats." + std::to_string(r.at("pid")) + ".json")).string();
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    ++files;
    const Stats s = read_stats(entry.path().string());
    if (entry.path() == parent_file) {
      ASSERT_TRUE(s.raw.contains("budget")) << s.raw.dump();
      const json& b = s.raw["budget"][0];
      EXPECT_EQ(b["ahead_bytes"], 0u) << "given back at exit: " << b.dump();
      EXPECT_EQ(b["ahead_pinned"], b["ahead_used"].get<unsigned long long>() +
                                       b["ahead_returned"].get<unsigned long long>())
          << b.dump();
    } else {
      EXPECT_FALSE(s.raw.contains("budget") && s.raw["budget"][0]["ahead_pinned"] != 0u)
          << s.raw.dump();
    }
  }
  EXPECT_EQ(files, 2) << "the parent's stats and the child's";
}

// Kernels launched from another thread never meet a piece while it moves: the fake kernel reads
// every page of its buffer inside cuLaunchKernel while the main thread's allocations demote and
// promote that buffer 40 times each (without the launch gate it meets an unmapped page or bytes not
// copied yet).
TEST_F(Preload, LaunchesFromAnotherThreadWaitForMoves) {
  // No host reserve: each demotion copies into fresh host memory, so a check during the copy
  // would see bytes not copied yet.
  const Outcome r =
      run_with({program("prog_launch_race")}, shim(),
               {"ALLOCSHIM_STATS=" + stats_path(),
                "ALLOCSHIM_CONF=budget.device=64MiB,budget.spill=host,budget.migrate=auto,"
                "backends.host.host_reserve=0"});
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(r.at("bad"), 0u);
  EXPECT_GT(r.at("checks"), 0u);
  const Stats s = read_stats(stats_path());
  const json& b = s.raw["budget"][0];
  // Each round demotes `a` for the allocation, or, where a launch holds it at that moment (more
  // often on a loaded machine), spills the allocation instead; every demotion is undone.
  const auto demotions = b["demotions"].get<unsigned long long>();
  EXPECT_GE(demotions + b["spilled_allocs"].get<unsigned long long>(), 40u) << b.dump();
  EXPECT_GE(demotions, 20u) << b.dump();
  EXPECT_GE(b["promotions"].get<unsigned long long>() + 1, demotions)
      << "each comes back at the next free";
  const json& m = s.raw["migration"];
  EXPECT_EQ(m["launches_scanned"].get<unsigned long long>(), r.at("checks")) << m.dump();
  EXPECT_EQ(m["unknown_layouts"].get<unsigned long long>(), r.at("checks"))
      << "the program leaves it unknown";
  EXPECT_GE(m["gate_closes"].get<unsigned long long>(), 2 * demotions);
}

// (c) The per-thread default stream flag selects the _ptsz wrappers.
TEST_F(Preload, PerThreadStreamVariantsKeepTheirMeaning) {
  ASSERT_EQ(run_with({program("prog_ptsz")}, "").status, 0);
  const Outcome r = run_shim({program("prog_ptsz")});
  ASSERT_EQ(r.status, 0);
  const Stats s = read_stats(stats_path());
  EXPECT_EQ(s.api("async"), r.at("async"));
  EXPECT_EQ(s.allocs, r.at("async"));
  EXPECT_EQ(s.frees, r.at("async"));
}

// (d) Another interposer that reaches the next definition with dlsym(RTLD_NEXT): once loaded after
// the shim, once before it.
TEST_F(Preload, InterposerLoadedAfterTheShimFindsTheDriver) {
  const std::string preload = shim() + ":" + ALLOCSHIM_WRAP_LIB;
  const Outcome r = run_shim({program("prog_interpose")}, preload);
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(r.at("wrap_recursion"), 0u) << "RTLD_NEXT from the interposer found the interposer";
  EXPECT_EQ(r.at("wrap_query"), r.at("queries"));
  EXPECT_GE(r.at("fake_cuCtxGetDevice"), r.at("queries"));
  EXPECT_EQ(r.at("wrap_alloc"), 0u);  // the shim comes first: its cuMemAlloc_v2 wins
  EXPECT_EQ(r.at("fake_cuMemAlloc_v2"), r.at("alloc"));
  const Stats s = read_stats(stats_path());
  EXPECT_EQ(s.allocs, r.at("alloc"));
  EXPECT_EQ(s.frees, r.at("alloc"));
}

TEST_F(Preload, InterposerLoadedBeforeTheShimReachesTheShim) {
  const std::string preload = std::string(ALLOCSHIM_WRAP_LIB) + ":" + shim();
  const Outcome r = run_shim({program("prog_interpose")}, preload);
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(r.at("wrap_recursion"), 0u);
  EXPECT_EQ(r.at("wrap_alloc"), r.at("alloc"));
  EXPECT_EQ(r.at("wrap_free"), r.at("alloc"));
  EXPECT_EQ(r.at("wrap_query"), r.at("queries"));
  EXPECT_EQ(r.at("fake_cuMemAlloc_v2"), r.at("alloc"));
  // RTLD_NEXT from the interposer is the shim: it saw every allocation.
  const Stats s = read_stats(stats_path());
  EXPECT_EQ(s.allocs, r.at("alloc")) << "the interposer's RTLD_NEXT skipped the shim";
  EXPECT_EQ(s.frees, r.at("alloc"));
}

// (e) fork while another thread allocates: children allocate on their own and exit cleanly.
TEST_F(Preload, ForkWhileAllocatingKeepsParentAndChildrenWorking) {
  const std::string pattern = (dir_ / "stats.%p.json").string();
  ASSERT_EQ(run_with({program("prog_fork")}, "").status, 0);
  const Outcome r = run_with({program("prog_fork")}, shim(), {"ALLOCSHIM_STATS=" + pattern});
  ASSERT_EQ(r.status, 0);
  const std::string parent_file =
      (dir_ / ("stats." + std::to_string(r.at("pid")) + ".json")).string();
  const Stats parent = read_stats(parent_file);
  EXPECT_EQ(parent.allocs, r.at("alloc"));
  EXPECT_EQ(parent.frees, r.at("alloc"));
  EXPECT_EQ(parent.live, 0u);
  int children = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    if (entry.path() == parent_file) continue;
    ++children;
    const Stats c = read_stats(entry.path().string());
    EXPECT_EQ(c.allocs, r.at("child_alloc")) << entry.path();
    EXPECT_EQ(c.frees, r.at("child_alloc")) << entry.path();
    EXPECT_EQ(c.unknown_frees(), 0u) << entry.path();
  }
  EXPECT_EQ(static_cast<unsigned long long>(children), r.at("forks"));
}

// Children of a program whose other threads allocate, forked thousands of times, only exit: none
// may wait on a lock another parent thread held at the fork (the thread-exit hooks of the parent's
// core are the child's no more). Without the shim every child exits too.
TEST_F(Preload, EveryForkedChildOfAThreadedProgramExits) {
  ASSERT_EQ(run_with({program("prog_fork_exit"), "200"}, "").status, 0);
  const Outcome r = run_with({program("prog_fork_exit"), "2000"}, shim(), {});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.at("forks"), 2000u);
  EXPECT_EQ(r.at("hung"), 0u) << "children hung in exit";
  EXPECT_EQ(r.at("failed"), 0u);
}

// NVML's memory queries under a budget, through the linked symbol and through dlsym, say what
// cuMemGetInfo says: the budget as the total, what is left of it as free (the fake NVML alone
// reports its whole 1 GiB device).
TEST_F(Preload, NvmlReportsTheBudgetAsCuMemGetInfoDoes) {
  const Outcome native = run_with({program("prog_nvml")}, "");
  ASSERT_EQ(native.status, 0);
  EXPECT_EQ(native.at("linked_total"), 1024ull << 20);
  EXPECT_EQ(native.at("dlsym_total"), 1024ull << 20);
  const Outcome r =
      run_with({program("prog_nvml")}, shim(), {"ALLOCSHIM_CONF=budget.device=256MiB"});
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(r.at("cuda_total"), 256ull << 20);
  for (const char* way : {"linked", "dlsym", "v2"}) {
    SCOPED_TRACE(way);
    EXPECT_EQ(r.at(std::string(way) + "_total"), r.at("cuda_total"));
    EXPECT_EQ(r.at(std::string(way) + "_free"), r.at("cuda_free"));
  }
  EXPECT_EQ(r.at("linked_used"), r.at("cuda_total") - r.at("cuda_free"));
  EXPECT_EQ(r.at("v2_sum"), r.at("v2_total"));
  EXPECT_EQ(r.at("v2_used"), r.at("cuda_total") - r.at("cuda_free"))
      << "the budget's use, all of it";
}

// A budget shared by every process of the user ([budget] share): the parent and its forked
// children each join the region on their own through the real hooks and leave it at exit; the last
// one out removes the file.
TEST_F(Preload, SharedBudgetRegionIsJoinedByEachProcessAndRemovedByTheLast) {
  const fs::path share = dir_ / "share";
  fs::create_directories(share);
  const std::string pattern = (dir_ / "stats.%p.json").string();
  const Outcome r = run_with({program("prog_fork")}, shim(),
                             {"ALLOCSHIM_STATS=" + pattern, "ALLOCSHIM_SHARE_DIR=" + share.string(),
                              "ALLOCSHIM_CONF=budget.device=512MiB,budget.share=user"});
  ASSERT_EQ(r.status, 0);
  EXPECT_TRUE(fs::is_empty(share)) << "the region file was left behind";
  int joined = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    if (entry.path() == share) continue;
    std::ifstream in(entry.path());
    const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    joined += json.find("\"node\":{\"share\":\"user\",\"joined\":true") != std::string::npos;
  }
  EXPECT_EQ(static_cast<unsigned long long>(joined), r.at("forks") + 1) << "parent and every child";
}

// The stats and trace files are named by the environment, often in /tmp, and the program may run
// as root: a symlink another user planted there, or a file they made writable for everyone, never
// receives the data (os/private_file.h).
TEST_F(Preload, OutputFilesAreNeverWrittenThroughAPlantedName) {
  const fs::path victim = dir_ / "victim";
  { std::ofstream(victim) << "precious"; }
  fs::permissions(victim, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                              fs::perms::others_read);
  fs::create_symlink(victim, stats_path());
  fs::create_symlink(victim, dir_ / "t.trace");
  Outcome r = run_with(
      {program("prog_linked")}, shim(),
      {"ALLOCSHIM_STATS=" + stats_path(), "ALLOCSHIM_TRACE=" + (dir_ / "t.trace").string()});
  ASSERT_EQ(r.status, 0);
  std::ifstream in(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "precious");
  EXPECT_EQ(fs::status(victim).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                fs::perms::others_read)
      << "the victim's mode was changed";
  EXPECT_NE(r.err.find("stats.json: is a symbolic link"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("t.trace: is a symbolic link"), std::string::npos) << r.err;

  if (geteuid() != 0) GTEST_SKIP() << "needs root to make files owned by another user";
  for (const char* name : {"bait.json", "bait.trace"}) {
    const fs::path bait = dir_ / name;
    std::ofstream{bait};
    ASSERT_EQ(chown(bait.c_str(), 65534, 65534), 0);
    fs::permissions(bait, fs::perms::all & ~(fs::perms::owner_exec | fs::perms::group_exec |
                                             fs::perms::others_exec));
  }
  r = run_with({program("prog_linked")}, shim(),
               {"ALLOCSHIM_STATS=" + (dir_ / "bait.json").string(),
                "ALLOCSHIM_TRACE=" + (dir_ / "bait.trace").string()});
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(fs::file_size(dir_ / "bait.json"), 0u)
      << "root's statistics went into another user's file";
  EXPECT_EQ(fs::file_size(dir_ / "bait.trace"), 0u) << "root's trace went into another user's file";
  EXPECT_NE(r.err.find("belongs to uid 65534"), std::string::npos) << r.err;
}

// A setuid program the shim reaches (/etc/ld.so.preload reaches them all) runs with privileges its
// caller lacks: the caller's ALLOCSHIM_* variables must not choose what the shim does or writes.
TEST_F(Preload, ASetuidProgramIgnoresTheShimsEnvironment) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a setuid copy owned by another user";
  fs::permissions(dir_, fs::perms::all);  // the program's euid could write here if it tried
  const fs::path copy = dir_ / "prog_secure";
  fs::copy_file(program("prog_secure"), copy);
  // A failed test keeps its directory for a look: never with a setuid program in it.
  struct Remove {
    fs::path path;
    ~Remove() { fs::remove(path); }
  } remove_copy{copy};
  const fs::path stats = dir_ / "s.json", trace = dir_ / "t.trace";
  const std::vector<std::string> env = {"ALLOCSHIM_STATS=" + stats.string(),
                                        "ALLOCSHIM_TRACE=" + trace.string()};
  // Not setuid: the variables are followed (and the shim is really there).
  Outcome r = run_with({copy.string()}, "", env);
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(r.at("secure"), 0u);
  EXPECT_TRUE(fs::exists(stats));
  EXPECT_TRUE(fs::exists(trace));
  fs::remove(stats);
  fs::remove(trace);
  ASSERT_EQ(chown(copy.c_str(), 65534, 65534), 0);
  ASSERT_EQ(chmod(copy.c_str(), 04755), 0);
  r = run_with({copy.string()}, "", env);
  ASSERT_EQ(r.status, 0);
  if (r.at("secure") != 1) GTEST_SKIP() << "the file system ignores the setuid bit";
  EXPECT_FALSE(fs::exists(stats)) << "the caller chose where a setuid program writes";
  EXPECT_FALSE(fs::exists(trace));
}

// (f) Failures, other libraries' names and cuGetExportTable pass through untouched.
TEST_F(Preload, ForeignNamesAndFailuresPassThrough) {
  ASSERT_EQ(run_with({program("prog_names"), ALLOCSHIM_CUDNN_LIB}, "").status, 0);
  const Outcome r = run_shim({program("prog_names"), ALLOCSHIM_CUDNN_LIB});
  ASSERT_EQ(r.status, 0);
  const Stats s = read_stats(stats_path());
  EXPECT_EQ(s.allocs, r.at("alloc"));
  EXPECT_EQ(s.frees, r.at("alloc"));
}

// Native IPC handles pass through the shim to the driver (a forked importer: the fake's native
// handles need the exporter's mappings, which a fork inherits).
TEST_F(Preload, NativeIpcHandlesPassThrough) {
  ASSERT_EQ(run_with({program("prog_ipc"), "fork"}, "").status, 0);
  const Outcome r = run_shim({program("prog_ipc"), "fork"});
  ASSERT_EQ(r.status, 0);
  const Stats s = read_stats(stats_path());
  EXPECT_EQ(s.allocs, r.at("alloc"));
  EXPECT_EQ(s.frees, r.at("alloc"));
}

// The same programs with every allocation served by one backend (ALLOCSHIM_BACKEND). Every kind
// is built here and the fake driver supports each, so a shim that falls back to native instead
// fails the test: that fallback is what the test would otherwise hide.
class PreloadBackend : public Preload, public ::testing::WithParamInterface<const char*> {
 protected:
  // Whether the shim used the backend `kind` for the run whose statistics are `s`; a fallback to
  // native fails the test, saying what the shim printed.
  bool used_backend(const Stats& s, const Outcome& r) {
    const std::string kind = GetParam();
    for (const auto& b : s.raw["backends"])
      if (b.value("kind", "") == kind) return true;
    ADD_FAILURE() << "the shim did not use backend " << kind << " (it fell back): " << r.err;
    return false;
  }
  // Runs `prog` with the backend. False when the run failed or the shim did not use the backend
  // (the test has failed already).
  bool run_backend(const char* prog, Outcome* r, Stats* s, const std::string& arg = "") {
    std::vector<std::string> argv{program(prog)};
    if (!arg.empty()) argv.push_back(arg);
    *r = run_with(
        argv, shim(),
        {"ALLOCSHIM_STATS=" + stats_path(), "ALLOCSHIM_BACKEND=" + std::string(GetParam())});
    if (r->status != 0) return false;
    *s = read_stats(stats_path());
    return used_backend(*s, *r);
  }
  // Not native: the driver's cuMemAlloc is not called once per allocation.
  bool pooling() const { return std::string(GetParam()) != "native"; }
  bool sub_allocating() const {
    return std::string(GetParam()) == "async_pool" || std::string(GetParam()) == "vmm";
  }
};

TEST_P(PreloadBackend, LinkedProgramCountsMatch) {
  Outcome r;
  Stats s;
  if (!run_backend("prog_linked", &r, &s)) return;
  expect_linked_counts(s, r);
  // A pooling backend serves cuMemAlloc from memory it holds: the driver's cuMemAlloc is not
  // called once per allocation (here: not at all).
  if (pooling()) {
    EXPECT_EQ(r.at("fake_cuMemAlloc_v2"), 0u);
  }
}

TEST_P(PreloadBackend, ThirtyTwoThreadsCountEveryCall) {
  Outcome r;
  Stats s;
  if (!run_backend("prog_threads", &r, &s)) return;
  EXPECT_EQ(s.api("alloc"), r.at("alloc"));
  EXPECT_EQ(s.allocs, r.at("alloc"));
  EXPECT_EQ(s.frees, r.at("alloc"));
  EXPECT_EQ(s.live, 0u);
  EXPECT_EQ(s.failures, 0u);
  EXPECT_EQ(s.unknown_frees(), 0u);
  if (pooling()) {
    EXPECT_LT(r.at("fake_cuMemAlloc_v2"), r.at("alloc"));
  } else {
    EXPECT_EQ(r.at("fake_cuMemAlloc_v2"), r.at("alloc"));
  }
}

// Memory of a sub-allocating backend gets the shim's own IPC handles; an importer started afresh
// (exec) opens them through its own shim and the exporter's broker, at the right offsets.
TEST_P(PreloadBackend, IpcHandlesOpenInAnotherProcess) {
  if (!pooling()) GTEST_SKIP() << "native handles are the driver's (NativeIpcHandlesPassThrough)";
  if (!sub_allocating())
    GTEST_SKIP() << "covers the sub-allocating backends; host and managed memory: docs/ipc.md";
  for (const char* mode : {"fork", "exec"}) {
    SCOPED_TRACE(mode);
    const std::string kind = GetParam();
    std::vector<std::string> env = {"ALLOCSHIM_STATS=" + stats_path(), "ALLOCSHIM_BACKEND=" + kind};
    // An async pool is exportable only when created so (vmm chunks always are, where supported).
    if (kind == "async_pool") env.push_back("ALLOCSHIM_CONF=backends.async_pool.ipc=true");
    const Outcome r = run_with({program("prog_ipc"), mode}, shim(), env);
    if (r.status != 0) return;
    const Stats s = read_stats(stats_path());
    if (!used_backend(s, r)) return;
    EXPECT_EQ(s.allocs, r.at("alloc"));
    EXPECT_EQ(s.frees, r.at("alloc"));
  }
}

// cudaDeviceReset's route (the first cuDevicePrimaryCtxReset variant, resolved at version 7000):
// the blocks left to each reset are dropped and counted freed, the backend starts afresh on the
// recreated context (async_pool: a pool of the destroyed context would be refused by the fake).
TEST_P(PreloadBackend, ResetThroughTheRuntimesRouteDropsTheContextsBlocks) {
  Outcome r;
  Stats s;
  if (!run_backend("prog_reset", &r, &s)) return;
  EXPECT_EQ(r.at("fake_cuDevicePrimaryCtxReset"), 4u);
  EXPECT_EQ(s.allocs, r.at("alloc"));
  EXPECT_EQ(s.frees, r.at("alloc")) << "12 freed by the program, 16 with the contexts";
  EXPECT_EQ(s.live, 0u);
  EXPECT_EQ(s.failures, 0u);
  EXPECT_EQ(s.unknown_frees(), 0u);
}

// The same through no entry point the shim hooks: found at the next cuDevicePrimaryCtxRetain by the
// context's new id (cuCtxGetId), before the backend touches the destroyed pool.
TEST_P(PreloadBackend, ResetByAnUnhookedRouteIsFoundAtTheNextRetain) {
  Outcome r;
  Stats s;
  if (!run_backend("prog_reset", &r, &s, "private")) return;
  EXPECT_EQ(r.at("fake_cuDevicePrimaryCtxReset"), 0u);
  EXPECT_EQ(s.allocs, r.at("alloc"));
  // The last round's blocks are still live at exit: no retain came after its reset.
  EXPECT_EQ(s.frees, r.at("alloc") - 4)
      << "12 freed by the program, 12 with the first three contexts";
  EXPECT_EQ(s.failures, 0u);
  EXPECT_EQ(s.unknown_frees(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, PreloadBackend,
                         ::testing::Values("native", "async_pool", "vmm", "host", "managed"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
