#!/bin/bash
# Run 4: main at b5f15ea (.device-carry/full): migrate_run.sh (migration verified by kernels on two
# streams around every move, pin_bench, the reuse pattern in every mode, PyTorch over a budget)
# and share_bench.sh (every mode).
set -u
N=.device-carry/full
timeout 300 sh tests/gpu/migrate_run.sh $N $OUT/mig > $OUT/migrate_run.log 2>&1; echo "migrate_run exit $?"
cat $OUT/mig/table.txt
timeout 200 bash tests/gpu/share_bench.sh $N $OUT/share > $OUT/share_bench.md 2>&1
grep -E "^\| " $OUT/share_bench.md
cd $OUT && tar czf logs.tgz mig share && rm -rf mig share
