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

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--hidden", type=int, default=8192)
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--batch", type=int, default=512)
ap.add_argument("--steps", type=int, default=12)
args = ap.parse_args()
if args.steps < 2:
    ap.error("--steps must be at least 2")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

# gpu_python.py is the GPU suite's, beside its programs.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "gpu"))
from gpu_python import check_losses, deterministic, print_training, require_torch, train  # noqa: E402

torch = require_torch()
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

deterministic(torch)
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


def batch(step):
    b = step % 4
    return (inputs[b * args.batch:(b + 1) * args.batch].to(device),
            labels[b * args.batch:(b + 1) * args.batch].to(device))


# The first step allocates the optimizer's state: left out of train_seconds.
losses, total_seconds, train_seconds = train(torch, F, model, optimizer, batch, args.steps, 1)

params = sum(p.numel() for p in model.parameters())
print_training(f"torch {torch.__version__}, {params} parameters, hidden {H}, layers {args.layers}, batch {args.batch}",
               model, losses, total_seconds, train_seconds, 9)
print(f"peak_allocated: {torch.cuda.max_memory_allocated()}", file=sys.stderr)
print(f"peak_reserved: {torch.cuda.max_memory_reserved()}", file=sys.stderr)
print("mem_get_info: free %d total %d" % torch.cuda.mem_get_info(), file=sys.stderr)
check_losses("torch_big", losses)
