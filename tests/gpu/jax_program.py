#!/usr/bin/env python3
"""A JAX program under XLA's platform allocator: every buffer is its own driver allocation.

    jax_program.py [--iterations N]

XLA_PYTHON_CLIENT_ALLOCATOR=platform (set here before jax is imported; XLA's BFC pool would
otherwise take most of the GPU in one allocation) makes each input, output and temporary buffer a
cuMemAlloc/cuMemFree, which is what allocshim serves. A jitted function does a few matmuls and
reductions on fresh deterministic inputs of three sizes, again and again (new buffers each time).

The data are small integers held in float32, so every matmul and reduction is exact whatever
kernel, precision (TF32/bf16 passes included) or summation order XLA picks: the printed results are
bit-for-bit reproducible, checked against NumPy (float64), and the stdout of a run under the shim
must equal a native run's (tests/gpu/check_stats.py --compare-native). Timing goes to stderr.
Exit status: 0 pass, 1 failure, 77 jax, its GPU plugin or a GPU missing.
"""
import argparse
import os
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--iterations", type=int, default=30)
args = ap.parse_args()

os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"

try:
    import numpy as np
    import jax
    import jax.numpy as jnp
except Exception as e:  # ImportError, or a broken install raising something else
    print(f"SKIPPED: jax not importable: {e}")
    sys.exit(77)
try:
    gpus = jax.devices("gpu")
    if not gpus:
        raise RuntimeError("jax.devices('gpu') is empty")
except Exception as e:  # no CUDA plugin, no driver, no device
    print(f"SKIPPED: no GPU/driver: jax has no GPU backend: {str(e).splitlines()[0] if str(e) else e!r}")
    sys.exit(77)
gpu = gpus[0]

SIZES = [256, 512, 1024]


# Every matmul input is an integer of at most 16 in magnitude (exact even in bf16 or TF32) and every
# product sums at most 1024 terms of at most 16: |result| <= 16384 < 2^24, exact in float32.
@jax.jit
def step(a, b):
    c = a @ b                          # a in [-4, 4], b in [-1, 1]: |c| <= 4096
    d = jnp.mod(c, 9.0) - 4.0          # back to [-4, 4]
    e = d @ a                          # |e| <= 16384
    h = jnp.mod(e, 17.0)               # [0, 16]
    f = h @ b.T                        # |f| <= 16384
    g = jnp.mod(f, 1000.0)             # [0, 999]: the int32 sum stays below 2^31
    return (jnp.sum(jnp.abs(d).astype(jnp.int32)),
            jnp.max(e).astype(jnp.int32),
            jnp.sum(g.astype(jnp.int32)),
            jnp.sum(d.astype(jnp.int32), axis=0))


def reference(a, b):
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    c = a @ b
    d = np.mod(c, 9.0) - 4.0
    e = d @ a
    h = np.mod(e, 17.0)
    f = h @ b.T
    g = np.mod(f, 1000.0)
    return (int(np.abs(d).sum()), int(e.max()), int(g.sum()), d.sum(axis=0).astype(np.int64))


start = time.perf_counter()
failures = 0
digest = 0
for it in range(args.iterations):
    n = SIZES[it % len(SIZES)]
    rng = np.random.RandomState(1000 + it)
    a = rng.randint(-4, 5, size=(n, n)).astype(np.float32)
    b = rng.randint(-1, 2, size=(n, n)).astype(np.float32)
    da = jax.device_put(a, gpu)
    db = jax.device_put(b, gpu)
    s_abs, e_max, g_sum, col = (np.asarray(x) for x in step(da, db))
    r_abs, r_max, r_sum, r_col = reference(a, b)
    ok = (int(s_abs) == r_abs and int(e_max) == r_max and int(g_sum) == r_sum and
          np.array_equal(col.astype(np.int64), r_col))
    col_digest = int((col.astype(np.int64) * np.arange(1, n + 1)).sum())
    print(f"iteration {it}: n {n}: sum|d| {int(s_abs)}, max e {int(e_max)}, sum g {int(g_sum)}, "
          f"columns {col_digest}{'' if ok else ' MISMATCH'}")
    if not ok:
        failures += 1
        print(f"  expected: sum|d| {r_abs}, max e {r_max}, sum g {r_sum}")
    digest = (digest * 1000003 + int(s_abs) + int(e_max) + int(g_sum) + col_digest) % (1 << 61)
    del da, db
elapsed = time.perf_counter() - start

print(f"jax {jax.__version__}, backend {gpu.platform}, allocator {os.environ['XLA_PYTHON_CLIENT_ALLOCATOR']}")
print(f"digest: {digest}")
print(f"jax_seconds: {elapsed:.6f}", file=sys.stderr)
if failures:
    print(f"FAIL: jax_program: {failures} iterations differ from NumPy")
    sys.exit(1)
print("PASS: jax_program")
