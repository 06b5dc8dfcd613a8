#!/bin/bash
# The installed package on a GPU machine, under the launchers of docs/deploy.md: the tool and shim
# from a package tree (dpkg -x, any folder: the layout is relocatable), `allocshim doctor`, one
# PyTorch process, then torchrun with two ranks writing one trace and one stats file each (%p), read
# back as one report. Exit 77 without a GPU or PyTorch. Prints a table last.
# Usage: gpu_launchers.sh PACKAGE_ROOT OUT_DIR
set -uo pipefail
root=$1 out=$2
tool=$root/usr/bin/allocshim
mkdir -p "$out"
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 77)' || exit 77
rows=()
row() { rows+=("$(printf '| %-34s | %-4s | %s |' "$1" "$2" "$3")"); }

"$tool" --version > "$out/version.txt" 2>&1
row "allocshim --version" "$([ $? -eq 0 ] && echo PASS || echo FAIL)" "$(cat "$out/version.txt")"
"$tool" doctor > "$out/doctor.txt" 2>&1
rc=$?
row "allocshim doctor" "$([ $rc -eq 0 ] && echo PASS || echo FAIL)" "exit $rc, $(grep -ci 'pass\|ok' "$out/doctor.txt") ok/pass lines"

cat > "$out/ddp.py" <<'PY'
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.zeros(1, device="cuda")
for step in range(50):
    a = torch.randn(1024, 1024, device="cuda")
    x += (a @ a).sum() * 0
    t = torch.ones(1) * rank
    dist.all_reduce(t)
torch.cuda.synchronize()
print(f"rank {rank} done, all_reduce {t.item()}")
dist.destroy_process_group()
PY
"$tool" run --stats "$out/single.json" -- python3 -c \
  "import torch; x=[torch.empty(1<<20, device='cuda') for _ in range(100)]; torch.cuda.synchronize(); print('ok')" \
  > "$out/single.txt" 2>&1
rc=$?
n=$(python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(sum(d['allocs'] for b in s['backends'] for d in b['devices']))" "$out/single.json" 2>/dev/null)
row "allocshim run -- python (torch)" "$([ $rc -eq 0 ] && [ "${n:-0}" -gt 0 ] && echo PASS || echo FAIL)" "exit $rc, $n allocations served"

"$tool" run --quiet --trace "$out/ddp.%p.trace" --stats "$out/ddp.%p.json" -- \
  python3 -m torch.distributed.run --standalone --nproc_per_node=2 "$out/ddp.py" > "$out/ddp.txt" 2>&1
rc=$?
traces=$(ls "$out"/ddp.*.trace 2>/dev/null | wc -l)
stats=$(ls "$out"/ddp.*.json 2>/dev/null | wc -l)
row "torchrun 2 ranks under allocshim" "$([ $rc -eq 0 ] && [ "$traces" -eq 2 ] && [ "$stats" -eq 2 ] && echo PASS || echo FAIL)" "exit $rc, $traces traces, $stats stats files"
"$tool" report --top 3 "$out"/ddp.*.trace > "$out/report.txt" 2>&1
rc=$?
row "one report over both ranks" "$([ $rc -eq 0 ] && grep -q "2 traces" "$out/report.txt" && echo PASS || echo FAIL)" "$(grep -m1 'allocshim report' "$out/report.txt")"
if command -v mpirun > /dev/null; then
  mpirun --allow-run-as-root -np 2 "$tool" run --quiet --stats "$out/mpi.%p.json" -- python3 -c \
    "import torch; torch.empty(1<<20, device='cuda'); print('ok')" > "$out/mpi.txt" 2>&1
  rc=$?
  row "mpirun -np 2 allocshim run" "$([ $rc -eq 0 ] && [ "$(ls "$out"/mpi.*.json | wc -l)" -eq 2 ] && echo PASS || echo FAIL)" "exit $rc"
else
  row "mpirun" "SKIP" "no mpirun on this machine"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
echo "GPU: $(cat "$out/gpu.txt")"
printf '| %-34s | %-4s | %s |\n|---|---|---|\n' check result detail
printf '%s\n' "${rows[@]}"
