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

from gpu_python import check_losses, deterministic, print_training, require_torch, train  # noqa: E402

torch = require_torch()
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

deterministic(torch)

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


def batch(step):
    """A fresh host-to-device copy each step, as a data loader would do."""
    b = step % DATASET
    return images[b * BATCH:(b + 1) * BATCH].to(device), labels[b * BATCH:(b + 1) * BATCH].to(device)


losses, total_seconds, train_seconds = train(torch, F, model, optimizer, batch, args.steps, args.warmup)

print_training(f"torch {torch.__version__}, device {torch.cuda.get_device_name(0)}, caching allocator "
               f"{'off' if os.environ.get('PYTORCH_NO_CUDA_MEMORY_CACHING') == '1' else 'on'}",
               model, losses, total_seconds, train_seconds, 6)
digest = hashlib.sha256(b"".join(struct.pack("<d", l) for l in losses)).hexdigest()[:16]
print(f"loss_digest: {digest}", file=sys.stderr)
check_losses("torch_train", losses)
