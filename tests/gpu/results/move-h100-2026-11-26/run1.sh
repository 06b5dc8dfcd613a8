#!/bin/sh
# Run 1: the baseline before any change (main at d045686, carried as .device-carry/base) and what
# a move costs step by step, natively (move_bench). OUT: where logs go.
set -u
B=.device-carry/base
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
echo "== move_bench (natively)"
$B/bin/move_bench 2GiB 512MiB 2>&1 | tee $OUT/move_bench.log
echo "== reuse pattern, auto (twice)"
for i in 1 2; do
  LD_PRELOAD=$B/lib/liballocshim.so ALLOCSHIM_CONF=budget.device=8GiB,budget.spill=host,budget.migrate=auto \
    ALLOCSHIM_STATS=$OUT/reuse$i.json $B/bin/migrate_bench malloc 8GiB 4GiB 50 2>&1 | grep -E "hot_gbps|verify|moved" 
done
echo "== share_bench"
timeout 200 bash tests/gpu/share_bench.sh $B > $OUT/share_bench.md 2>&1
grep -E "^\| |sweeps|round" $OUT/share_bench.md
