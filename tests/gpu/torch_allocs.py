#!/usr/bin/env python3
"""PyTorch with its caching allocator off: every tensor is one cudaMalloc and one cudaFree.

Makes a known number of device allocations (only elementwise ops on contiguous tensors, which
allocate exactly their output; no cuBLAS, no GPU reductions, whose workspaces and staging buffers
would be allocations the script cannot count), prints the result, checks it against the CPU, and
prints "allocations: N" / "frees: N" for tests/gpu/check_stats.py. The output is deterministic, so
a run under the shim must print exactly what a native run prints.
Exit status: 0 pass, 1 failure, 77 torch or a GPU missing.
"""
import os
import sys

# Read when the allocator initializes: must be set before torch touches CUDA.
os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"

try:
    import torch
except Exception as e:  # ImportError, or a broken install raising something else
    print(f"SKIPPED: torch not importable: {e}")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIPPED: no GPU/driver: torch.cuda.is_available() is False")
    sys.exit(77)

SIZES = [1000, 4096, 65536, 250000, 1 << 20]
ITERATIONS = 20
allocations = 0
frees = 0


def new(t):
    """Counts a tensor the caller just created on the GPU (one cudaMalloc each)."""
    global allocations
    allocations += 1
    return t


device = torch.device("cuda", 0)
worst = 0.0
total = 0.0
for i in range(ITERATIONS):
    n = SIZES[i % len(SIZES)]
    a = new(torch.arange(n, device=device, dtype=torch.float32))
    b = new(a * 0.5)
    c = new(torch.sin(b))
    c.add_(a)  # in place: no allocation
    got = float(c.cpu().double().sum())  # device-to-host into pageable memory: no device allocation
    ref_t = torch.arange(n, dtype=torch.float32)
    ref = float((torch.sin(ref_t * 0.5) + ref_t).double().sum())
    worst = max(worst, abs(got - ref) / max(1.0, abs(ref)))
    total += got
    del a, b, c
    frees += 3
torch.cuda.synchronize()

print(f"torch {torch.__version__}, device {torch.cuda.get_device_name(0)}")
print(f"result: {total:.17g}")
print(f"allocations: {allocations}")
print(f"frees: {frees}")
if worst > 1e-5:
    print(f"FAIL: torch_allocs: GPU result differs from the CPU by {worst:.3g} (relative)")
    sys.exit(1)
print("PASS: torch_allocs")
