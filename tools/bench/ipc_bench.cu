// ipc_bench: the latency of sharing a block between processes — cudaIpcGetMemHandle in the
// exporter, cudaIpcOpenMemHandle and cudaIpcCloseMemHandle in an importer — for fresh blocks of a
// few sizes. Run it natively (the driver's IPC of cudaMalloc memory) and under the shim with each
// backend; bench.py's ipc section does all four and writes the table (docs/ipc.md has the results).
//
//   ipc_bench [ITERATIONS]    (default 50; blocks of 1 GiB get a fifth of them)
//
// Each iteration: the exporter allocates a block (not timed), times cudaIpcGetMemHandle on it and
// once more on the same block (a handle asked for again), sends the handle to the importer, which
// times the open and the close and a second open + close of the same handle (the mapping made
// again, the connection to the exporter kept); then the exporter frees the block (not timed).
// The importer is one long-lived process, so only the very first open pays for connecting.
// Prints a table of medians and 90th percentiles in microseconds and a "json:" line.
// Exit status: 0, 1 on error, 77 without a GPU.
#include "ipc_common.h"

#include <algorithm>
#include <sstream>

using namespace ipc_gpu;

namespace {

struct Sample {
  std::vector<double> get, get_again, open, close, reopen;
};

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * (v.size() - 1) + 0.5)];
}

int child_bench() {
  CHECK(cudaFree(nullptr));  // the context first, so the first open times IPC, not CUDA's start
  for (;;) {
    std::string line;
    for (char c = from_parent(); c != '\n'; c = from_parent()) line += c;
    if (line == "quit") return 0;
    const auto h = from_hex<cudaIpcMemHandle_t>(line.c_str());
    void* p = nullptr;
    double t0 = now_us();
    CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
    const double open = now_us() - t0;
    t0 = now_us();
    CHECK(cudaIpcCloseMemHandle(p));
    const double close = now_us() - t0;
    t0 = now_us();
    CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
    CHECK(cudaIpcCloseMemHandle(p));
    const double reopen = now_us() - t0;
    char out[128];
    std::snprintf(out, sizeof out, "%.3f %.3f %.3f", open, close, reopen);
    to_parent(std::string(out));
  }
}

Sample measure(Child& importer, std::size_t bytes, int iterations) {
  Sample s;
  for (int i = 0; i < iterations; ++i) {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, bytes));
    cudaIpcMemHandle_t h;
    double t0 = now_us();
    CHECK(cudaIpcGetMemHandle(&h, p));
    s.get.push_back(now_us() - t0);
    cudaIpcMemHandle_t again;
    t0 = now_us();
    CHECK(cudaIpcGetMemHandle(&again, p));
    s.get_again.push_back(now_us() - t0);
    const std::string line = to_hex(h) + "\n";
    EXPECT(write(importer.to, line.data(), line.size()) == static_cast<ssize_t>(line.size()),
           "write");
    std::istringstream in(importer.recv_line());
    double open = 0, close = 0, reopen = 0;
    in >> open >> close >> reopen;
    s.open.push_back(open);
    s.close.push_back(close);
    s.reopen.push_back(reopen);
    CHECK(cudaFree(p));
  }
  return s;
}

std::string size_name(std::size_t b) {
  if (b >= (1u << 30)) return std::to_string(b >> 30) + " GiB";
  if (b >= (1u << 20)) return std::to_string(b >> 20) + " MiB";
  return std::to_string(b >> 10) + " KiB";
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc == 2 && std::string(argv[1]) == "child-bench") return child_bench();
  require_gpu();
  const int iterations = argc > 1 ? std::max(1, std::atoi(argv[1])) : 50;
  CHECK(cudaFree(nullptr));
  Child importer = spawn({"child-bench"});
  const std::size_t sizes[] = {4u << 10, 1u << 20, 64u << 20, 1u << 30};
  std::printf("%-8s %6s | %-17s %-17s %-17s %-17s %-17s | %-10s\n", "size", "iters",
              "get (p50/p90)", "get again", "open", "close", "open+close again",
              "get+open+close p50");
  std::string json = "{\"unit\":\"us\",\"sizes\":[";
  int allocations = 0;
  for (std::size_t bytes : sizes) {
    const int n = bytes >= (1u << 30) ? std::max(1, iterations / 5) : iterations;
    measure(importer, bytes, 2);  // warm up: connection, pools, regions
    const Sample s = measure(importer, bytes, n);
    allocations += n + 2;
    auto cell = [](const std::vector<double>& v) {
      char b[32];
      std::snprintf(b, sizeof b, "%7.1f / %7.1f", quantile(v, 0.5), quantile(v, 0.9));
      return std::string(b);
    };
    const double total = quantile(s.get, 0.5) + quantile(s.open, 0.5) + quantile(s.close, 0.5);
    std::printf("%-8s %6d | %-17s %-17s %-17s %-17s %-17s | %10.1f\n", size_name(bytes).c_str(), n,
                cell(s.get).c_str(), cell(s.get_again).c_str(), cell(s.open).c_str(),
                cell(s.close).c_str(), cell(s.reopen).c_str(), total);
    char entry[512];
    std::snprintf(entry, sizeof entry,
                  "%s{\"bytes\":%zu,\"iterations\":%d,\"get_p50\":%.2f,\"get_p90\":%.2f,"
                  "\"get_again_p50\":%.2f,\"open_p50\":%.2f,\"open_p90\":%.2f,\"close_p50\":%.2f,"
                  "\"close_p90\":%.2f,\"reopen_p50\":%.2f,\"total_p50\":%.2f}",
                  bytes == sizes[0] ? "" : ",", bytes, n, quantile(s.get, 0.5),
                  quantile(s.get, 0.9), quantile(s.get_again, 0.5), quantile(s.open, 0.5),
                  quantile(s.open, 0.9), quantile(s.close, 0.5), quantile(s.close, 0.9),
                  quantile(s.reopen, 0.5), total);
    json += entry;
  }
  json += "]}";
  const std::string quit = "quit\n";
  EXPECT(write(importer.to, quit.data(), quit.size()) == static_cast<ssize_t>(quit.size()),
         "write");
  EXPECT(importer.wait() == 0, "the importer failed");
  std::printf("json: %s\n", json.c_str());
  std::printf("allocations: %d\nfrees: %d\n", allocations, allocations);
  return 0;
}
