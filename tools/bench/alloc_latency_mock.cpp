// alloc_latency built for the host against mock/cuda_runtime.h (no GPU, no CUDA runtime): the same
// source, so its parsing, loops, statistics and output are tested in CI (test_bench.py).
// The numbers it prints time malloc, not a GPU allocator, and mean nothing.
#include "alloc_latency.cu"
