#!/bin/bash
# On the GPU machine: a PyTorch (or else CuPy) program traced with Python frames, unmodified, under
# `allocshim run`. The report must name the Python function that allocated and its line.
# Exit 77 (skipped) without a GPU or without torch/cupy.
# Usage: tests/trace/gpu_python_frames.sh BUILD_DIR [stacks=python|both]
set -uo pipefail
build=$1 stacks=${2:-python}
tool=$build/bin/allocshim
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/prog.py" <<'PY'
import sys
def allocate_tensors(n):
    bufs = []
    for i in range(n):
        bufs.append(make_one(i))          # line 5
    return bufs
def make_one(i):
    if lib == "torch":
        return torch.empty((1 << 20) * (1 + i % 4), dtype=torch.uint8, device="cuda")  # line 9
    return cupy.empty((1 << 20) * (1 + i % 4), dtype=cupy.uint8)                        # line 10
try:
    import torch
    lib = "torch" if torch.cuda.is_available() else None
except ImportError:
    lib = None
if lib is None:
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
        lib = "cupy"
        cupy.cuda.set_allocator(None)     # every allocation reaches the driver
    except Exception:
        sys.exit(77)
for _ in range(3):
    allocate_tensors(32)
    if lib == "torch":
        torch.cuda.empty_cache()           # give the blocks back: the next round allocates again
print("lib=" + lib)
PY
ALLOCSHIM_TRACE_STACKS=$stacks "$tool" run -q --trace "$work/t.%p.trace" -- python3 "$work/prog.py" > "$work/out.txt"
rc=$?
[ $rc -eq 77 ] && { echo "SKIPPED: no GPU, or neither torch nor cupy"; exit 77; }
[ $rc -eq 0 ] || { echo "FAIL: program exited $rc"; cat "$work/out.txt"; exit 1; }
"$tool" report --format json --top 0 --sort calls "$work"/t.*.trace > "$work/r.json" || exit 1
"$tool" report --top 3 --sort calls "$work"/t.*.trace
python3 - "$work/r.json" "$stacks" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
names = set()
for site in r["hot_spots"]["calls"]:
    for f in site["frames"]:
        if f.get("python"):
            names.add((f["function"], f.get("line")))
ok = ("allocate_tensors", 5) in names and (("make_one", 9) in names or ("make_one", 10) in names)
print("python frames seen:", sorted(names)[:8])
print("PASS" if ok else "FAIL: allocate_tensors:5 / make_one:9|10 missing")
sys.exit(0 if ok else 1)
PY
