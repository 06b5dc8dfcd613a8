#!/usr/bin/env python3
"""PyTorch inference from several threads, each on a stream of its own (issue 23's second row).

    torch_threads.py THREADS ITERS

Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 under a device budget smaller than what the threads hold
at once, so that one thread's allocations move memory another thread's kernels use. Each thread
runs its own small MLP; the first forward pass of each, made before the threads start, is the
reference, and every later pass must match it. Prints "result passes=N mismatches=M".
Exit status: 0 pass, 1 a mismatch or a CUDA error, 77 torch or a GPU missing.
"""
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_python import require_torch  # noqa: E402

torch = require_torch()

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 50
torch.backends.cuda.matmul.allow_tf32 = False
torch.manual_seed(0)


def make_model():
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(2048, 2048), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).cuda().eval()


models = [make_model() for _ in range(threads)]
inputs = [torch.randn(2048, 2048, device="cuda") for _ in range(threads)]
with torch.no_grad():
    refs = [m(x).cpu() for m, x in zip(models, inputs)]

errors, passes, mismatches = [], [0] * threads, [0] * threads


def run(i):
    try:
        stream = torch.cuda.Stream()
        with torch.no_grad(), torch.cuda.stream(stream):
            for _ in range(iters):
                y = models[i](inputs[i])
                # Temporaries of another size each pass, so allocations keep coming.
                scratch = torch.empty(int(3e6) + 4096 * (passes[i] % 7), device="cuda")
                scratch.fill_(1.0)
                out = y.cpu()
                if not torch.allclose(out, refs[i], rtol=1e-4, atol=1e-5):
                    mismatches[i] += 1
                passes[i] += 1
        stream.synchronize()
    except Exception as e:  # a CUDA error in one thread fails the run
        errors.append(f"thread {i}: {e}")


workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
torch.cuda.synchronize()
print(f"result passes={sum(passes)} mismatches={sum(mismatches)}")
for e in errors:
    print(f"FAIL: {e}")
if errors or sum(mismatches) or sum(passes) != threads * iters:
    sys.exit(1)
print("verify ok")
