#!/usr/bin/env python3
"""A small PyTorch training loop: a convnet with an MLP head on synthetic, deterministic data.

    torch_train.py [--steps N] [--no-caching]

fp32 throughout (TF32 off), fixed seeds, deterministic algorithms, so two runs print the same
losses: stdout has every step's loss (rounded to 6 significant digits) and a parameter checksum,
and nothing that depends on time or addresses, so tests/gpu/check_stats.py --compare-native can
compare a run under the shim with a native one. The wall time goes to stderr:
"train_seconds: S" (steps after the first WARMUP, which include cuBLAS/cuDNN initialization) and
"total_seconds: S" (every step), and "loss_digest: HEX" (a hash of the exact losses' bits).

With PYTORCH_NO_CUDA_MEMORY_CACHING=1 in the environment (or --no-caching, which sets it before
torch is imported) every tensor is its own cudaMalloc and cudaFree: thousands per run, which is
what allocshim serves. Exit status: 0 pass, 1 failure (a non-finite loss, or no learning), 77 torch
or a GPU missing.
"""
import argparse
import hashlib
import os
import struct
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--steps", type=int, default=200)
ap.add_argument("--warmup", type=int, default=10, help="steps left out of train_seconds")
ap.add_argument("--no-caching", action="store_true",
                help="set PYTORCH_NO_CUDA_MEMORY_CACHING=1 before importing torch")
args = ap.parse_args()
if args.steps <= args.warmup:
    ap.error("--steps must exceed --warmup")

if args.no_caching:
    os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
# Deterministic cuBLAS needs a fixed workspace configuration, set before CUDA initializes.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except Exception as e:  # ImportError, or a broken install raising something else
    print(f"SKIPPED: torch not importable: {e}")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIPPED: no GPU/driver: torch.cuda.is_available() is False")
    sys.exit(77)

torch.manual_seed(1234)
torch.cuda.manual_seed_all(1234)
torch.use_deterministic_algorithms(True)
torch.backends.cudnn.benchmark = False
torch.backends.cudnn.deterministic = True
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

device = torch.device("cuda", 0)
BATCH, CLASSES, SIDE = 64, 10, 16


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc1 = nn.Linear(32 * (SIDE // 2) * (SIDE // 2), 256)
        self.fc2 = nn.Linear(256, 128)
        self.fc3 = nn.Linear(128, CLASSES)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


# Synthetic data on the CPU (its generator is the same on every machine), a learnable target:
# the class is decided by a fixed random linear map of the image.
gen = torch.Generator().manual_seed(42)
DATASET = 32
images = torch.randn(DATASET * BATCH, 3, SIDE, SIDE, generator=gen)
projection = torch.randn(3 * SIDE * SIDE, CLASSES, generator=gen)
labels = (images.flatten(1) @ projection).argmax(1)

model = Net().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

losses = []
torch.cuda.synchronize()
start = time.perf_counter()
timed_start = start
for step in range(args.steps):
    if step == args.warmup:
        torch.cuda.synchronize()
        timed_start = time.perf_counter()
    b = step % DATASET
    # A fresh host-to-device copy each step, as a data loader would do.
    x = images[b * BATCH:(b + 1) * BATCH].to(device)
    y = labels[b * BATCH:(b + 1) * BATCH].to(device)
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())  # synchronizes, as logging a loss does
torch.cuda.synchronize()
end = time.perf_counter()

checksum = sum(float(p.detach().double().abs().sum().cpu()) for p in model.parameters())
digest = hashlib.sha256(b"".join(struct.pack("<d", l) for l in losses)).hexdigest()[:16]

print(f"torch {torch.__version__}, device {torch.cuda.get_device_name(0)}, "
      f"caching allocator {'off' if os.environ.get('PYTORCH_NO_CUDA_MEMORY_CACHING') == '1' else 'on'}")
for i, l in enumerate(losses):
    print(f"step {i}: loss {l:.6g}")
print(f"parameter checksum: {checksum:.6g}")
print(f"loss_digest: {digest}", file=sys.stderr)
print(f"train_seconds: {end - timed_start:.6f}", file=sys.stderr)
print(f"total_seconds: {end - start:.6f}", file=sys.stderr)

bad = [l for l in losses if l != l or l in (float("inf"), float("-inf"))]
if bad:
    print(f"FAIL: torch_train: {len(bad)} non-finite losses")
    sys.exit(1)
if not losses[-1] < losses[0]:
    print(f"FAIL: torch_train: the loss did not fall ({losses[0]:.6g} -> {losses[-1]:.6g})")
    sys.exit(1)
print("PASS: torch_train")
