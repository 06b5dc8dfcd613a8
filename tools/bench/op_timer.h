// Median time per operation of a small body, for the micro-benchmarks that take a call apart
// (hit_path.cpp, cudart_cost.cu). A batch is sized to about 2 ms (0.2 ms with `quick`) by doubling
// a trial, then 15 batches (3) are timed; the median and the minimum of batch time / (iterations x
// ops) are printed as one JSON line {"bench":BENCH,"item":NAME,"ns":..,"min_ns":..} and a table row.
// The median is what the notes quote: the host these run on moves by 2x between processes, and a
// minimum would hide that.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace allocshim::bench {

template <class F>
double time_ops(const char* bench, const std::string& name, double ops, bool quick, F&& body) {
  auto batch_ns = [&](long iters) {
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < iters; ++i) body();
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  };
  long iters = 16;
  while (batch_ns(iters) <= (quick ? 2e5 : 2e6) && iters <= (1l << 26)) iters *= 2;
  std::vector<double> per_op;
  for (int b = 0; b < (quick ? 3 : 15); ++b)
    per_op.push_back(batch_ns(iters) / (static_cast<double>(iters) * ops));
  std::sort(per_op.begin(), per_op.end());
  const double median = per_op[per_op.size() / 2], min = per_op.front();
  std::printf("{\"bench\":\"%s\",\"item\":\"%s\",\"ns\":%.2f,\"min_ns\":%.2f}\n", bench,
              name.c_str(), median, min);
  std::printf("  %-58s %10.2f ns  (min %.2f)\n", name.c_str(), median, min);
  std::fflush(stdout);
  return median;
}

}  // namespace allocshim::bench
