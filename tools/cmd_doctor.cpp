// allocshim doctor: what this machine offers each backend, and proof that the shim sees allocations.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "command.h"
#include "base/driver.h"
#include "driver/real_driver.h"

namespace allocshim::tool {
namespace {

constexpr int kSelfTestAllocations = 16;

void* plain_dlsym(void* handle, const char* name) { return dlsym(handle, name); }

const Driver* driver_or_report(bool verbose) {
  std::string error;
  const Driver* d = load_real_driver(&plain_dlsym, true, error);
  if (!d) {
    if (verbose) std::printf("driver: not available (%s)\n", error.c_str());
    return nullptr;
  }
  if (const Result r = d->init(0); r != res::ok) {
    if (verbose)
      std::printf("driver: libcuda loaded but cuInit failed with error %d%s\n", r,
                  r == res::no_device ? " (no CUDA device)" : "");
    return nullptr;
  }
  return d;
}

std::string runtime_version() {
  for (const char* name : {"libcudart.so", "libcudart.so.13", "libcudart.so.12"}) {
    void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) continue;
    using Fn = int (*)(int*);
    auto fn = reinterpret_cast<Fn>(dlsym(h, "cudaRuntimeGetVersion"));
    int v = 0;
    if (fn && fn(&v) == 0)
      return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10) + " (" + name + ")";
  }
  return "no shared libcudart found (programs that link it statically carry their own)";
}

const char* yes_no(const Driver& d, DevAttr a, int dev) {
  int v = 0;
  return d.device_get_attribute(&v, a, dev) == res::ok && v ? "yes" : "no";
}

// Allocates through the driver table in a child that runs under the shim, and checks that the
// shim's statistics count exactly those allocations.
int self_test_child() {
  const Driver* d = driver_or_report(false);
  if (!d) return 3;
  Context ctx = nullptr;
  if (d->primary_ctx_retain(&ctx, 0) != res::ok || d->ctx_set_current(ctx) != res::ok) return 4;
  for (int i = 0; i < kSelfTestAllocations; ++i) {
    DevPtr p = 0;
    if (d->mem_alloc(&p, 1 << 20) != res::ok) return 5;
    if (d->mem_free(p) != res::ok) return 6;
  }
  return 0;
}

bool self_test() {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string path = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/allocshim-doctor-XXXXXX";
  const int fd = mkstemp(path.data());
  if (fd < 0) return false;
  close(fd);
  const std::string exe = executable_dir() + "/allocshim";
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("ALLOCSHIM_STATS", path.c_str(), 1);
    setenv("ALLOCSHIM_QUIET", "1", 1);
    std::string preload = library_path();
    if (const char* old = std::getenv("LD_PRELOAD"); old && *old) preload += std::string(":") + old;
    setenv("LD_PRELOAD", preload.c_str(), 1);
    execl(exe.c_str(), exe.c_str(), "doctor", "--self-test-child", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  unlink(path.c_str());
  const std::string json = ss.str();
  const bool ok_exit = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  const std::string want = "\"alloc\":" + std::to_string(kSelfTestAllocations);
  const bool counted = json.find(want) != std::string::npos;
  std::printf("self-test: %d allocations in a child under the shim: %s\n", kSelfTestAllocations,
              ok_exit && counted ? "seen (ok)"
              : !ok_exit         ? "child failed"
                                 : "NOT seen by the shim");
  return ok_exit && counted;
}

int doctor() {
  const Driver* d = driver_or_report(true);
  if (!d) {
    std::printf(
        "allocshim needs an NVIDIA driver and a GPU; on this machine it can only check policies "
        "and read traces.\n");
    return kExitFailed;
  }
  int version = 0, count = 0;
  d->driver_get_version(&version);
  d->device_get_count(&count);
  std::printf("driver: CUDA %d.%d\nruntime: %s\ndevices: %d\n", version / 1000,
              (version % 1000) / 10, runtime_version().c_str(), count);
  for (int dev = 0; dev < count; ++dev) {
    char name[256] = "?";
    std::size_t total = 0;
    d->device_get_name(name, sizeof name, dev);
    d->device_total_mem(&total, dev);
    int numa = -1;
    d->device_get_attribute(&numa, DevAttr::host_numa_id, dev);
    std::printf("device %d: %s, %.1f GiB\n", dev, name, static_cast<double>(total) / (1ull << 30));
    std::printf("  vmm (VMM API): %s\n", yes_no(*d, DevAttr::vmm_supported, dev));
    std::printf("  async_pool (memory pools): %s\n", yes_no(*d, DevAttr::pools_supported, dev));
    std::printf("  ipc export (POSIX FD handles): %s\n",
                yes_no(*d, DevAttr::posix_fd_supported, dev));
    std::printf("  host spill (HOST_NUMA VMM): %s, host NUMA id %d\n",
                yes_no(*d, DevAttr::host_numa_vmm, dev), numa);
    std::printf("  host pools (HOST_NUMA pools): %s\n", yes_no(*d, DevAttr::host_numa_pools, dev));
    std::printf("  managed (concurrent managed access): %s\n",
                yes_no(*d, DevAttr::concurrent_managed_access, dev));
  }
  if (count == 0) return kExitFailed;
  return self_test() ? 0 : kExitFailed;
}

void add(CLI::App& root, int& exit_code) {
  auto child = std::make_shared<bool>(false);
  CLI::App* sub = root.add_subcommand(
      "doctor", "Report the driver, GPUs and backend capabilities; self-test the shim");
  sub->add_flag("--self-test-child", *child, "(internal) the allocating half of the self-test")
      ->group("");
  sub->callback([child, &exit_code] { exit_code = *child ? self_test_child() : doctor(); });
}

}  // namespace
}  // namespace allocshim::tool

ALLOCSHIM_COMMAND(allocshim::tool::add);
