#!/usr/bin/env python3
"""CuPy with its memory pool off (cupy.cuda.set_allocator(None)): every array is one cudaMalloc.

CuPy reaches the driver without going through the cudaMalloc symbol (docs/compatibility.md), which
is why the shim hooks the driver API; this script checks that every one of its allocations is seen. Only
elementwise ops (one output allocation each) are used: reductions may use CUB with a temporary
workspace the script could not count. Prints the result, checks it against NumPy, and prints
"allocations: N" / "frees: N" for tests/gpu/check_stats.py; the output is deterministic.
Exit status: 0 pass, 1 failure, 77 CuPy or a GPU missing.
"""
import sys

from gpu_python import SKIP, counted_workload, report

try:
    import cupy
    import numpy
except Exception as e:
    print(f"SKIPPED: cupy not importable: {e}")
    sys.exit(SKIP)
try:
    if cupy.cuda.runtime.getDeviceCount() == 0:
        raise RuntimeError("no device")
except Exception as e:
    print(f"SKIPPED: no GPU/driver: {e}")
    sys.exit(SKIP)

cupy.cuda.set_allocator(None)
cupy.cuda.set_pinned_memory_allocator(None)


def step(n):
    """Three arrays on the GPU (one cudaMalloc each), freed before the next step."""
    a = cupy.arange(n, dtype=cupy.float32)
    b = a * numpy.float32(0.5)
    c = cupy.sin(b)
    c += a  # in place: no allocation
    got = float(cupy.asnumpy(c).astype(numpy.float64).sum())  # pageable copy: no device allocation
    ref_a = numpy.arange(n, dtype=numpy.float32)
    return got, float((numpy.sin(ref_a * numpy.float32(0.5)) + ref_a).astype(numpy.float64).sum())


total, worst, allocations, frees = counted_workload(step)
cupy.cuda.Device().synchronize()
report("cupy_allocs", f"cupy {cupy.__version__}, device {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}",
       total, worst, allocations, frees, "NumPy")
