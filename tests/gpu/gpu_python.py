"""What the GPU suite's Python programs share: importing the framework or skipping (exit 77, the
line check_stats.py reads), deterministic PyTorch, and the counted-allocation workload with its
result lines ("allocations: N", "frees: N", PASS/FAIL) for torch_allocs.py and cupy_allocs.py, and
the training loop of torch_train.py and torch_big.py."""
import sys
import time

SKIP = 77
SIZES = [1000, 4096, 65536, 250000, 1 << 20]
ITERATIONS = 20


def require_torch():
    """torch with a usable GPU, or the program ends SKIPPED."""
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install raising something else
        print(f"SKIPPED: torch not importable: {e}")
        sys.exit(SKIP)
    if not torch.cuda.is_available():
        print("SKIPPED: no GPU/driver: torch.cuda.is_available() is False")
        sys.exit(SKIP)
    return torch


def deterministic(torch, seed=1234):
    """Fixed seeds and deterministic kernels, so the losses are the same natively and under the shim."""
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def counted_workload(step):
    """Runs `step(n)` for each iteration's size; each step makes exactly three device allocations,
    frees them, and returns (its result, the reference computed on the CPU). Returns the sum of the
    results, the worst relative error, and the allocation and free counts."""
    total, worst, allocations = 0.0, 0.0, 0
    for i in range(ITERATIONS):
        got, ref = step(SIZES[i % len(SIZES)])
        allocations += 3
        worst = max(worst, abs(got - ref) / max(1.0, abs(ref)))
        total += got
    return total, worst, allocations, allocations


def report(name, header, total, worst, allocations, frees, against):
    """The lines check_stats.py reads; exits 1 when the GPU's result differs from the reference."""
    print(header)
    print(f"result: {total:.17g}")
    print(f"allocations: {allocations}")
    print(f"frees: {frees}")
    if worst > 1e-5:
        print(f"FAIL: {name}: GPU result differs from {against} by {worst:.3g} (relative)")
        sys.exit(1)
    print(f"PASS: {name}")


def train(torch, F, model, optimizer, batch, steps, warmup):
    """`steps` optimizer steps of cross-entropy on batch(step) = (inputs, labels) copied to the
    device. Returns the losses, the seconds of every step and of the steps after the first
    `warmup` (which include cuBLAS/cuDNN initialization and the optimizer's first allocations)."""
    losses = []
    torch.cuda.synchronize()
    start = timed_start = time.perf_counter()
    for step in range(steps):
        if step == warmup:
            torch.cuda.synchronize()
            timed_start = time.perf_counter()
        x, y = batch(step)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # synchronizes, as logging a loss does
    torch.cuda.synchronize()
    end = time.perf_counter()
    return losses, end - start, end - timed_start


def print_training(header, model, losses, total_seconds, train_seconds, digits):
    """What a run prints: on stdout only what must be the same natively and under the shim (every
    loss, a parameter checksum to `digits` significant digits), the times on stderr."""
    checksum = sum(float(p.detach().double().abs().sum().cpu()) for p in model.parameters())
    print(header)
    for i, l in enumerate(losses):
        print(f"step {i}: loss {l:.6g}")
    print(f"parameter checksum: {checksum:.{digits}g}")
    print(f"train_seconds: {train_seconds:.6f}", file=sys.stderr)
    print(f"total_seconds: {total_seconds:.6f}", file=sys.stderr)


def check_losses(name, losses):
    """PASS when every loss is finite and the last is below the first; FAIL (exit 1) otherwise."""
    bad = [l for l in losses if l != l or l in (float("inf"), float("-inf"))]
    if bad:
        print(f"FAIL: {name}: {len(bad)} non-finite losses")
        sys.exit(1)
    if not losses[-1] < losses[0]:
        print(f"FAIL: {name}: the loss did not fall ({losses[0]:.6g} -> {losses[-1]:.6g})")
        sys.exit(1)
    print(f"PASS: {name}")
