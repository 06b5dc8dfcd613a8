#!/usr/bin/env python3
"""A GPT-style training loop with PyTorch's caching allocator (issue 23's training rows).

    torch_gpt.py [--steps N] [--warmup N] [--layers L] [--dim D] [--batch B] [--seq S]

Decoder blocks (causal self-attention and an MLP), Adam, synthetic tokens from a fixed seed, fp32
with TF32 off. Prints every step's loss (6 significant digits: runs compare exactly) and, on
stderr, "step_ms: M" (the median step after the warm-up) and "peak_reserved: BYTES" (what the
caching allocator held at most, which the run script sizes budgets from). Exit status: 0 pass,
1 failure (a non-finite loss), 77 torch or a GPU missing.
"""
import argparse
import os
import statistics
import sys
import time

# gpu_python.py is the GPU suite's, beside its programs.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "gpu"))
from gpu_python import require_torch  # noqa: E402

torch = require_torch()

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--warmup", type=int, default=4)
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--dim", type=int, default=1024)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--seq", type=int, default=1024)
ap.add_argument("--vocab", type=int, default=32768)
args = ap.parse_args()
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
        self.heads = d // 64

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(args.vocab, args.dim)
        self.blocks = torch.nn.ModuleList(Block(args.dim) for _ in range(args.layers))
        self.ln, self.head = torch.nn.LayerNorm(args.dim), torch.nn.Linear(args.dim, args.vocab, bias=False)

    def forward(self, t):
        x = self.emb(t)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


model = GPT().cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
gen = torch.Generator(device="cuda").manual_seed(1)
times = []
for step in range(args.steps):
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device="cuda", generator=gen)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    value = loss.item()  # synchronizes
    times.append((time.perf_counter() - t0) * 1000)
    if value != value:
        print("FAIL: non-finite loss")
        sys.exit(1)
    print(f"step {step} loss {value:.6g}")
print(f"step_ms: {statistics.median(times[args.warmup:]):.1f}", file=sys.stderr)
print(f"peak_reserved: {torch.cuda.max_memory_reserved()}", file=sys.stderr)
