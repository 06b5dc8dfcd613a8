// What every example program needs around the CUDA runtime, in one place: a CHECK that names the
// failing call, and the "no GPU" exit (77, the code CTest reads as skipped).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

// A failing call in any thread ends the process: flush first, since _Exit skips stdio teardown
// (std::exit from a worker thread would race with the others still using CUDA).
#define CHECK(call)                                                                      \
  do {                                                                                   \
    const cudaError_t err_ = (call);                                                     \
    if (err_ != cudaSuccess) {                                                           \
      std::printf("FAIL: %s returned %s (%s) at %s:%d\n", #call, cudaGetErrorName(err_), \
                  cudaGetErrorString(err_), __FILE__, __LINE__);                         \
      std::fflush(stdout);                                                               \
      std::_Exit(1);                                                                     \
    }                                                                                    \
  } while (0)

// Exits with 77 and says why when there is no usable GPU or driver.
inline void exit_unless_gpu() {
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no GPU/driver: %s\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "no device");
    std::exit(77);
  }
}
