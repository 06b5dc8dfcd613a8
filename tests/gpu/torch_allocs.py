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

from gpu_python import counted_workload, report, require_torch

# Read when the allocator initializes: must be set before torch touches CUDA.
os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
torch = require_torch()
device = torch.device("cuda", 0)


def step(n):
    """Three tensors on the GPU (one cudaMalloc each), freed before the next step."""
    a = torch.arange(n, device=device, dtype=torch.float32)
    b = a * 0.5
    c = torch.sin(b)
    c.add_(a)  # in place: no allocation
    got = float(c.cpu().double().sum())  # device-to-host into pageable memory: no device allocation
    ref_t = torch.arange(n, dtype=torch.float32)
    return got, float((torch.sin(ref_t * 0.5) + ref_t).double().sum())


total, worst, allocations, frees = counted_workload(step)
torch.cuda.synchronize()
report("torch_allocs", f"torch {torch.__version__}, device {torch.cuda.get_device_name(0)}", total, worst,
       allocations, frees, "the CPU")
