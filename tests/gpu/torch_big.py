#!/usr/bin/env python3
"""A PyTorch training loop that needs several GiB: a deep, wide MLP trained with Adam.

    torch_big.py [--hidden 8192] [--layers 8] [--batch 512] [--steps 12]

Parameters, gradients and Adam's two moments take 16 bytes per parameter (hidden^2 * layers of
them: 8 GiB at the defaults), plus the activations of a step. Run natively it shows the time when
everything fits; under allocshim with a device budget well below that (spill = "host") it shows
the time when most of it lives in host memory, and that the losses do not change: fp32, TF32 off,
deterministic algorithms, fixed seeds, so stdout (every step's loss, a parameter checksum) is the
same in both runs. The wall time goes to stderr: "train_seconds: S" (every step after the first,
which allocates the optimizer's state), "total_seconds: S", "peak_allocated: BYTES" and
"peak_reserved: BYTES" (PyTorch's own counts), and what cuMemGetInfo says at the end. Exit status:
0 pass, 1 failure (a non-finite loss, or no learning), 77 torch or a GPU missing.
"""
import argparse
import os
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--hidden", type=int, default=8192)
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--batch", type=int, default=512)
ap.add_argument("--steps", type=int, default=12)
args = ap.parse_args()
if args.steps < 2:
    ap.error("--steps must be at least 2")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except Exception as e:
    print(f"SKIPPED: torch not importable: {e}")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIPPED: no GPU/driver: torch.cuda.is_available() is False")
    sys.exit(77)

torch.manual_seed(1234)
torch.cuda.manual_seed_all(1234)
torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False
device = torch.device("cuda", 0)
H, CLASSES = args.hidden, 16

# The data and a learnable target (a fixed random linear map of the input) made on the CPU, so
# they are the same on every machine.
gen = torch.Generator().manual_seed(42)
inputs = torch.randn(4 * args.batch, H, generator=gen)
labels = (inputs[:, :CLASSES] @ torch.randn(CLASSES, CLASSES, generator=gen)).argmax(1)

layers = []
for _ in range(args.layers):
    layers += [nn.Linear(H, H), nn.ReLU()]
model = nn.Sequential(*layers, nn.Linear(H, CLASSES)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

losses = []
torch.cuda.synchronize()
start = time.perf_counter()
timed_start = start
for step in range(args.steps):
    if step == 1:
        torch.cuda.synchronize()
        timed_start = time.perf_counter()
    b = step % 4
    x = inputs[b * args.batch:(b + 1) * args.batch].to(device)
    y = labels[b * args.batch:(b + 1) * args.batch].to(device)
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
torch.cuda.synchronize()
end = time.perf_counter()

checksum = sum(float(p.detach().double().abs().sum().cpu()) for p in model.parameters())
params = sum(p.numel() for p in model.parameters())
print(f"torch {torch.__version__}, {params} parameters, hidden {H}, layers {args.layers}, batch {args.batch}")
for i, l in enumerate(losses):
    print(f"step {i}: loss {l:.6g}")
print(f"parameter checksum: {checksum:.9g}")
print(f"train_seconds: {end - timed_start:.6f}", file=sys.stderr)
print(f"total_seconds: {end - start:.6f}", file=sys.stderr)
print(f"peak_allocated: {torch.cuda.max_memory_allocated()}", file=sys.stderr)
print(f"peak_reserved: {torch.cuda.max_memory_reserved()}", file=sys.stderr)
print("mem_get_info: free %d total %d" % torch.cuda.mem_get_info(), file=sys.stderr)

if any(l != l or l in (float("inf"), float("-inf")) for l in losses):
    print("FAIL: torch_big: non-finite losses")
    sys.exit(1)
if not losses[-1] < losses[0]:
    print(f"FAIL: torch_big: the loss did not fall ({losses[0]:.6g} -> {losses[-1]:.6g})")
    sys.exit(1)
print("PASS: torch_big")
