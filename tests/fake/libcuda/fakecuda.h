/* Introspection of the fake libcuda.so.1 (tests/fake/libcuda), for preload test programs.
 *
 * The fake exports the real driver ABI on the simulated device of tests/fake/fake_driver.h. These
 * extra entry points let a program check what actually reached the "driver" underneath whatever
 * interposer sits in between. Entry points are named by their exact exported symbol
 * ("cuMemAlloc_v2", "cuMemAllocAsync_ptsz"); an unknown name reads as 0 / NULL.
 *
 * Environment read when the fake starts: FAKECUDA_DEVICES (default 1), FAKECUDA_CAPACITY_MB
 * (per device, default 1024), FAKECUDA_DRIVER_VERSION (default 13000). */
#ifndef ALLOCSHIM_FAKECUDA_H
#define ALLOCSHIM_FAKECUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Calls of the exported entry point `symbol` (as many as reached the fake, failures included). */
unsigned long long fakecuda_calls(const char* symbol);
/* The stream argument of the last call of `symbol`, exactly as received (NULL before any call). */
void* fakecuda_last_stream(const char* symbol);
/* Zeroes every call counter and last stream. */
void fakecuda_reset(void);
/* Live allocations of the simulated device (cuMemAlloc*, managed, pinned host, pool blocks). */
size_t fakecuda_live_allocations(void);
/* Device bytes in use on `device` (what cuMemGetInfo subtracts from the capacity). */
size_t fakecuda_used(int device);
/* Makes the next `count` calls of the fake operation `op` (a FakeOp name such as "mem_alloc" or
 * "mem_create", see fake_driver.h) fail with CUresult `result`. Returns 0, or -1 for an unknown op. */
int fakecuda_fail_next(const char* op, int result, int count);
/* Resets `device`'s primary context without an exported entry point, as a private route inside a
 * runtime would: everything it owned is destroyed, and it gets a new cuCtxGetId when retained. */
int fakecuda_reset_primary_context(int device);
/* What cuGetExportTable hands out, so a test can check the call passed through untouched. */
const void* fakecuda_export_table(void);

#ifdef __cplusplus
}
#endif

#endif
