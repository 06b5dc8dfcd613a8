#!/usr/bin/env python3
"""NVML under a device budget (docs/operators.md): what a job's NVML says matches cuMemGetInfo.

    nvml_budget.py BUDGET        e.g. 8GiB; run under the shim with budget.device=BUDGET

In one process, NVML through ctypes (as pynvml reaches it: dlopen and dlsym of libnvidia-ml.so.1)
must report the budget as the total, v1 and v2, and the same free as torch.cuda.mem_get_info()
(cudaMemGetInfo); then nvidia-smi, run from it (so under the shim too), must show the budget as
the GPU's total. Exit status: 0 pass, 1 failure, 77 torch, NVML or a GPU missing.
"""
import ctypes
import subprocess
import sys

from gpu_python import require_torch

torch = require_torch()
MiB = 1 << 20
GiB = 1 << 30


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


budget = int(float(sys.argv[1].rstrip("GiB")) * GiB) if len(sys.argv) > 1 else fail("usage: nvml_budget.py 8GiB")
try:
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
except OSError as e:
    print(f"SKIPPED: no NVML: {e}")
    sys.exit(77)
x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")  # some use of the budget
torch.cuda.synchronize()
dev = ctypes.c_void_p()
if nvml.nvmlInit_v2() != 0 or nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) != 0:
    fail("nvmlInit_v2 or nvmlDeviceGetHandleByIndex_v2")
m = Memory()
if nvml.nvmlDeviceGetMemoryInfo(dev, ctypes.byref(m)) != 0:
    fail("nvmlDeviceGetMemoryInfo")
m2 = MemoryV2(version=ctypes.sizeof(MemoryV2) | (2 << 24))
if nvml.nvmlDeviceGetMemoryInfo_v2(dev, ctypes.byref(m2)) != 0:
    fail("nvmlDeviceGetMemoryInfo_v2")
free, total = torch.cuda.mem_get_info()
print(f"cuMemGetInfo: total {total / MiB:.0f} MiB, free {free / MiB:.0f} MiB")
print(f"NVML v1: total {m.total / MiB:.0f} MiB, free {m.free / MiB:.0f} MiB, used {m.used / MiB:.0f} MiB")
print(f"NVML v2: total {m2.total / MiB:.0f} MiB, reserved {m2.reserved / MiB:.0f} MiB, "
      f"used {m2.used / MiB:.0f} MiB, free {m2.free / MiB:.0f} MiB")
if total != budget or m.total != budget or m2.total != budget:
    fail(f"totals {total}, {m.total}, {m2.total}: not all the budget {budget}")
# Other processes on the GPU may change its free memory between the calls: within 64 MiB.
if abs(m.free - free) > 64 * MiB or abs(m2.free - free) > 64 * MiB:
    fail(f"NVML free {m.free} / {m2.free} against cuMemGetInfo's {free}")
if m.used != m.total - m.free or m2.reserved + m2.used + m2.free != m2.total or m2.used < 256 * MiB:
    fail("the parts do not add up to the total, or the process's 256 MiB is not used")
smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits",
                      "-i", "0"], capture_output=True, text=True)
if smi.returncode != 0:
    print(f"nvidia-smi not run ({smi.returncode}): {smi.stderr.strip()}")
else:
    smi_total = int(smi.stdout.split(",")[0])
    print(f"nvidia-smi: total {smi_total} MiB, used {smi.stdout.split(',')[1].strip()} MiB")
    if smi_total != budget // MiB:
        fail(f"nvidia-smi shows {smi_total} MiB, not the budget's {budget // MiB}")
del x
print("PASS")
