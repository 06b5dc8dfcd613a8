#!/usr/bin/env python3
"""PyTorch sizing itself from the device budget (docs/oversubscription.md).

    torch_budget.py BUDGET        e.g. 8GiB; run under the shim with budget.device=BUDGET

torch.cuda.mem_get_info() (cudaMemGetInfo) must report the budget as the device's total and what is
left of it as free. Then, as JAX does with its preallocation, the script takes 75% of what is
reported free in one tensor (which must fit under the budget: free must drop by that much), and
then asks for 2 GiB more than is left, which the spill target serves: both tensors are written and
checked on the GPU. Exit status: 0 pass, 1 failure, 77 torch or a GPU missing.
"""
import re
import sys

from gpu_python import require_torch

torch = require_torch()

MiB = 1 << 20
GiB = 1 << 30


def parse(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(GiB|MiB|)", text)
    if not m:
        raise SystemExit(f"usage: {sys.argv[0]} BUDGET (e.g. 8GiB)")
    return int(float(m.group(1)) * {"GiB": GiB, "MiB": MiB, "": 1}[m.group(2)])


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


budget = parse(sys.argv[1] if len(sys.argv) > 1 else "")
free, total = torch.cuda.mem_get_info()
print(f"mem_get_info: free {free / GiB:.2f} GiB, total {total / GiB:.2f} GiB")
if total != budget:
    fail(f"total {total} is not the budget {budget} (is the shim loaded with budget.device?)")
if not 0 < free <= total:
    fail(f"free {free} outside (0, {total}]")

# JAX-style preallocation: a share of what is reported free, in one piece.
big_bytes = int(free * 0.75) // MiB * MiB
big = torch.empty(big_bytes, dtype=torch.uint8, device="cuda")
big.fill_(7)
free_after, _ = torch.cuda.mem_get_info()
print(f"after {big_bytes / GiB:.2f} GiB: free {free_after / GiB:.2f} GiB")
if free_after > free - big_bytes + 64 * MiB:
    fail(f"free went from {free} to {free_after} after a tensor of {big_bytes} bytes")

# Past the budget: served by the spill target, still usable.
extra_bytes = free_after + 2 * GiB
extra = torch.empty(extra_bytes // 4, dtype=torch.int32, device="cuda")
STEP = 64 * MiB  # elements per slice: the reference values are made a slice at a time
for start in range(0, extra.numel(), STEP):
    n = min(STEP, extra.numel() - start)
    torch.arange(start, start + n, dtype=torch.int32, device="cuda", out=extra[start:start + n])
torch.cuda.synchronize()
ok_big = bool((big == 7).all().item())
ok_extra = True
for start in range(0, extra.numel(), STEP):
    n = min(STEP, extra.numel() - start)
    ref = torch.arange(start, start + n, dtype=torch.int32, device="cuda")
    ok_extra = ok_extra and bool((extra[start:start + n] == ref).all().item())
if not (ok_big and ok_extra):
    fail(f"tensor contents wrong (preallocated ok: {ok_big}, past the budget ok: {ok_extra})")
free_end, _ = torch.cuda.mem_get_info()
print(f"summary: total {total / GiB:.2f} GiB = budget; {big_bytes / GiB:.2f} GiB preallocated, "
      f"{extra_bytes / GiB:.2f} GiB more past the budget; free at the end {free_end / GiB:.2f} GiB")
