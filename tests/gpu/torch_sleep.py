#!/usr/bin/env python3
"""Sleep and wake of a PyTorch model (docs/operators.md, "Sleep and wake"), measured against the
pinned-copy bound in the same process.

    torch_sleep.py ALLOCSHIM GIB ctl    two cycles of `allocshim ctl PID sleep` and `wake`
    torch_sleep.py ALLOCSHIM GIB idle   the process idles past idle_sleep_ms, then computes again

Run under the shim with a budget, spill = "host" and migrate = "auto" (and, for idle, an
idle_sleep_ms below a second). The model is a stack of 8192x8192 fp32 linear layers of GIB GiB in
all. First the bound: every parameter copied to one pinned host buffer and back (cudaMemcpyAsync,
one stream), as a plain pinned copy does. `ctl`: each cycle puts the process to sleep from a child
process (this one waits in it, as a server blocked on its socket would), checks that the memory
left the device, wakes it, and checks the output is bit for bit what it was. The first cycle pins
the host memory it moves into; the second finds it in the host reserve when host_reserve covers
the model. `idle`: after idling, the process dozes on its own (status says so, the memory is on
the host); its next forward passes bring the memory back (at most 30) and give the same output.

Prints one "sleep_wake: {json}" line with the rates. Exit status: 0 pass, 1 failure, 77 no torch
or GPU.
"""
import json
import os
import subprocess
import sys
import time

from gpu_python import require_torch

torch = require_torch()
GiB = 1 << 30


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def ctl(tool, action):
    p = subprocess.run([tool, "ctl", str(os.getpid()), action, "--json"], capture_output=True,
                       text=True, timeout=600)
    print(f"ctl {action}: {p.stdout.strip()} {p.stderr.strip()}")
    r = json.loads(p.stdout) if p.stdout.strip() else {"ok": False, "error": p.stderr}
    if p.returncode != 0 or not r.get("ok"):
        fail(f"ctl {action}: {r.get('error')}")
    return r


if len(sys.argv) != 4 or sys.argv[3] not in ("ctl", "idle"):
    fail("usage: torch_sleep.py ALLOCSHIM GIB ctl|idle")
tool, gib, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
width = 8192
layers = max(1, int(gib * GiB / (width * width * 4)))
model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
model = model.cuda()
for p in model.parameters():
    p.data.mul_(1.0 / 64)  # keeps activations finite through the stack
x = torch.randn(64, width, device="cuda")
model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
with torch.no_grad():
    before = model(x).clone()
torch.cuda.synchronize()
print(f"model: {layers} layers, {model_bytes / GiB:.2f} GiB")

# The bound: the same bytes copied to pinned host memory and back on one stream.
pinned = torch.empty(model_bytes, dtype=torch.uint8, pin_memory=True)
views, at = [], 0
for p in model.parameters():
    n = p.numel() * p.element_size()
    views.append((p, pinned[at:at + n].view(p.dtype).view(p.shape)))
    at += n
rates = {"to_host": 0.0, "to_device": 0.0}
for _ in range(2):  # the second run is the one kept: the first touches the pages
    t0 = time.perf_counter()
    for p, h in views:
        h.copy_(p.data, non_blocking=True)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    for p, h in views:
        p.data.copy_(h, non_blocking=True)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    rates = {"to_host": model_bytes / (t1 - t0) / 1e9, "to_device": model_bytes / (t2 - t1) / 1e9}
del views, pinned
print(f"pinned copy bound: {rates['to_host']:.1f} GB/s to the host, {rates['to_device']:.1f} GB/s back")

result = {"model_bytes": model_bytes, "bound_to_host_gbs": round(rates["to_host"], 2),
          "bound_to_device_gbs": round(rates["to_device"], 2), "mode": mode, "cycles": []}
if mode == "ctl":
    for cycle in range(2):
        slept = ctl(tool, "sleep")
        if slept["state"] != "asleep" or slept["moved"] < 0.95 * model_bytes:
            fail(f"sleep moved {slept['moved']} of the model's {model_bytes} bytes")
        if slept["device"] > 1 * GiB:
            fail(f"{slept['device']} bytes stayed on the device while asleep")
        woke = ctl(tool, "wake")
        if woke["state"] != "awake" or woke["moved"] < slept["moved"]:
            fail(f"wake moved {woke['moved']} of the {slept['moved']} bytes slept")
        with torch.no_grad():
            after = model(x)
        torch.cuda.synchronize()
        if not torch.equal(before, after):
            fail(f"cycle {cycle}: the output changed across sleep and wake")
        c = {"sleep_gbs": round(slept["moved"] / slept["ns"], 2),
             "wake_gbs": round(woke["moved"] / woke["ns"], 2)}
        c["sleep_of_bound"] = round(c["sleep_gbs"] / rates["to_host"], 3)
        c["wake_of_bound"] = round(c["wake_gbs"] / rates["to_device"], 3)
        result["cycles"].append(c)
else:
    time.sleep(3)  # no launch, no synchronization: the shim's thread puts the process to sleep
    s = ctl(tool, "status")
    if s["state"] != "dozing" or s["host"] < 0.95 * model_bytes:
        fail(f"after idling: {s}")
    t0 = time.perf_counter()
    passes = 0
    while passes < 30:
        with torch.no_grad():
            after = model(x)
        torch.cuda.synchronize()
        passes += 1
        if not torch.equal(before, after):
            fail("the output changed across a doze")
        s = ctl(tool, "status")
        if s["host"] <= 0.05 * model_bytes:
            break
    result["cycles"].append({"passes_to_return": passes, "back_in_s": round(time.perf_counter() - t0, 3),
                             "state": s["state"], "host_after": s["host"]})
    if s["state"] != "awake" or s["host"] > 0.05 * model_bytes:
        fail(f"{passes} passes after the doze: {s}")
print("sleep_wake: " + json.dumps(result))
print("PASS")
