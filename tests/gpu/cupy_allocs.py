#!/usr/bin/env python3
"""CuPy with its memory pool off (cupy.cuda.set_allocator(None)): every array is one cudaMalloc.

CuPy reaches the driver without going through the cudaMalloc symbol (docs/compatibility.md), which is why the
shim hooks the driver API; this script checks that every one of its allocations is seen. Only
elementwise ops (one output allocation each) are used: reductions may use CUB with a temporary
workspace the script could not count. Prints the result, checks it against NumPy, and prints
"allocations: N" / "frees: N" for tests/gpu/check_stats.py; the output is deterministic.
Exit status: 0 pass, 1 failure, 77 CuPy or a GPU missing.
"""
import sys

try:
    import cupy
    import numpy
except Exception as e:
    print(f"SKIPPED: cupy not importable: {e}")
    sys.exit(77)
try:
    if cupy.cuda.runtime.getDeviceCount() == 0:
        raise RuntimeError("no device")
except Exception as e:
    print(f"SKIPPED: no GPU/driver: {e}")
    sys.exit(77)

cupy.cuda.set_allocator(None)
cupy.cuda.set_pinned_memory_allocator(None)

SIZES = [1000, 4096, 65536, 250000, 1 << 20]
ITERATIONS = 20
allocations = 0
frees = 0


def new(x):
    """Counts an array the caller just created on the GPU (one cudaMalloc each)."""
    global allocations
    allocations += 1
    return x


worst = 0.0
total = 0.0
for i in range(ITERATIONS):
    n = SIZES[i % len(SIZES)]
    a = new(cupy.arange(n, dtype=cupy.float32))
    b = new(a * numpy.float32(0.5))
    c = new(cupy.sin(b))
    c += a  # in place: no allocation
    got = float(cupy.asnumpy(c).astype(numpy.float64).sum())  # pageable copy: no device allocation
    ref_a = numpy.arange(n, dtype=numpy.float32)
    ref = float((numpy.sin(ref_a * numpy.float32(0.5)) + ref_a).astype(numpy.float64).sum())
    worst = max(worst, abs(got - ref) / max(1.0, abs(ref)))
    total += got
    del a, b, c
    frees += 3
cupy.cuda.Device().synchronize()

print(f"cupy {cupy.__version__}, device {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
print(f"result: {total:.17g}")
print(f"allocations: {allocations}")
print(f"frees: {frees}")
if worst > 1e-5:
    print(f"FAIL: cupy_allocs: GPU result differs from NumPy by {worst:.3g} (relative)")
    sys.exit(1)
print("PASS: cupy_allocs")
