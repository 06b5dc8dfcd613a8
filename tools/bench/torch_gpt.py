#!/usr/bin/env python3
"""A GPT-style training loop with PyTorch's caching allocator (issue 23's training rows).

    torch_gpt.py [--steps N] [--warmup N] [--layers L] [--dim D] [--batch B] [--seq S] [--probe FILE]

gpt_model.py's decoder (causal self-attention and an MLP per block), Adam, synthetic tokens from a
fixed seed, fp32 with TF32 off. Prints every step's loss (6 significant digits: runs compare exactly) and, on
stderr, "step_ms: M" (the median step after the warm-up), "step_times_ms: ..." (every step) and "peak_reserved: BYTES" (what the
caching allocator held at most, which the run script sizes budgets from) and "phase_ms: forward F
backward B optimizer O" (medians, CUDA events). --probe FILE also writes, as JSON, where the
tensors and the caching allocator's segments lie after the first step past the warm-up (device or
host, per 2 MiB chunk, as the driver's pointer query says), the allocator's events of that step with
their Python lines, and the per-kernel CUDA time of the two steps after it (torch.profiler); the
losses stay the same. Exit status: 0 pass,
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
# After the check: gpt_model.py imports torch.
from gpt_model import GPT  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--warmup", type=int, default=4)
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--dim", type=int, default=1024)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--seq", type=int, default=1024)
ap.add_argument("--vocab", type=int, default=32768)
ap.add_argument("--probe", help="write where tensors lie and per-kernel times to this JSON file")
args = ap.parse_args()
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)


model = GPT(args.vocab, args.dim, args.layers).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
gen = torch.Generator(device="cuda").manual_seed(1)
times, phases = [], []
probe, prof = {}, None


def placement(ptr, nbytes, chunk=2 << 20):
    """The driver's memory type (1 host, 2 device) of each 2 MiB chunk of [ptr, ptr + nbytes)."""
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    out, v = [], ctypes.c_uint(0)
    for a in range(ptr - ptr % chunk, ptr + nbytes, chunk):
        r = cuda.cuPointerGetAttribute(ctypes.byref(v), 2, ctypes.c_uint64(max(a, ptr)))
        out.append(v.value if r == 0 else -r)
    return out


def where_things_are():
    names = {id(p): n for n, p in model.named_parameters()}
    tensors = []
    for p in model.parameters():
        n = names[id(p)]
        tensors.append(("param", n, p.data_ptr(), p.numel() * p.element_size()))
        if p.grad is not None:
            tensors.append(("grad", n, p.grad.data_ptr(), p.grad.numel() * p.grad.element_size()))
        for k, t in opt.state.get(p, {}).items():
            if torch.is_tensor(t) and t.is_cuda:
                tensors.append((k, n, t.data_ptr(), t.numel() * t.element_size()))
    snap = torch.cuda.memory._snapshot()
    segs = []
    for s in snap["segments"]:
        blocks = [(b["address"], b["size"], b["state"]) for b in s["blocks"]]
        segs.append({"address": s["address"], "size": s["total_size"], "pool": s.get("segment_type"),
                     "chunks": placement(s["address"], s["total_size"]), "blocks": blocks})
    events = []
    for e in snap.get("device_traces", [[]])[0]:
        fs = [f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in e.get("frames", [])]
        # The first two frames, then two of this script's or the model's (gpt_model.py).
        frames = fs[:2] + [f for f in fs if f.startswith(("torch_gpt", "gpt_model"))][:2]
        events.append((e["action"], e["addr"], e["size"], frames))
    return {"tensors": tensors, "segments": segs, "events": events}


for step in range(args.steps):
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device="cuda", generator=gen)
    torch.cuda.synchronize()
    if args.probe and step == args.warmup:
        torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
    if args.probe and step == args.warmup + 1:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
        prof.__enter__()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    t0 = time.perf_counter()
    ev[0].record()
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
    ev[1].record()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    ev[2].record()
    opt.step()
    ev[3].record()
    value = loss.item()  # synchronizes
    times.append((time.perf_counter() - t0) * 1000)
    phases.append([ev[i].elapsed_time(ev[i + 1]) for i in range(3)])
    if args.probe and step == args.warmup:
        probe.update(where_things_are())
        torch.cuda.memory._record_memory_history(enabled=None)
    if args.probe and step == args.warmup + 2:
        prof.__exit__(None, None, None)
        kernels = []
        for k in prof.key_averages():
            t = getattr(k, "device_time_total", None)
            if t is None:
                t = getattr(k, "cuda_time_total", 0)
            if t:
                kernels.append((k.key, k.count, t))
        probe["kernels"] = sorted(kernels, key=lambda x: -x[2])
        probe["phase_ms"] = phases[-2:]
        import json
        with open(args.probe, "w") as f:
            json.dump(probe, f)
    if value != value:
        print("FAIL: non-finite loss")
        sys.exit(1)
    print(f"step {step} loss {value:.6g}")
print(f"step_ms: {statistics.median(times[args.warmup:]):.1f}", file=sys.stderr)
print("step_times_ms: " + " ".join(f"{t:.1f}" for t in times), file=sys.stderr)
med = [statistics.median(p[i] for p in phases[args.warmup:]) for i in range(3)]
print(f"phase_ms: forward {med[0]:.1f} backward {med[1]:.1f} optimizer {med[2]:.1f}", file=sys.stderr)
print(f"peak_reserved: {torch.cuda.max_memory_reserved()}", file=sys.stderr)
