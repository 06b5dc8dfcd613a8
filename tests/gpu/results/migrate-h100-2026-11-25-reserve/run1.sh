#!/bin/bash
# One GPU run for the mig helper: share_bench (base e74b7b0 vs new, interleaved twice), the reuse
# pattern under auto (base vs new, interleaved twice), then migrate_run.sh with the new build.
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
for i in 1 2; do for v in base new; do
  bash src/tests/gpu/share_bench.sh $v $OUT/share-$v-$i > $OUT/share-$v-$i.md 2>&1
done; done
for i in 1 2; do for v in base new; do
  LD_PRELOAD=$PWD/$v/lib/liballocshim.so ALLOCSHIM_STATS=$OUT/reuse-$v-$i.json ALLOCSHIM_CONF=budget.device=8GiB,budget.spill=host,budget.migrate=auto \
    $v/bin/migrate_bench malloc 8GiB 4GiB 50 > $OUT/reuse-$v-$i.log 2>&1
done; done
sh src/tests/gpu/migrate_run.sh new $OUT/mig > $OUT/migrate_run.log 2>&1; echo "migrate_run exit $?"
for f in $OUT/share-*.md; do echo "== $f"; grep -E '^\| (sequential|shared)' $f; grep -E 'sweeps in' $f; done
for f in $OUT/reuse-*.log; do echo "$f: $(grep -o 'hot_gbps=[0-9.]*.*' $f)"; done
tail -22 $OUT/table.txt 2>/dev/null; tail -8 $OUT/mig/table.txt
