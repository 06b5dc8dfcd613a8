#!/bin/bash
# Run 3: main at b5f15ea (.device-carry/full: the whole build, stripped) on the GPU suite, then
# against base (d045686's shim, .device-carry/base) interleaved: the reuse pattern with `again`
# (the same migrate_bench binary for both) and share_bench's alternating and hand-off runs (auto).
set -u
C=budget.device=8GiB,budget.spill=host
N=.device-carry/full
OUT=$OUT/suite timeout 400 tests/gpu/run_gpu_suite.sh $N > /dev/null 2>&1
grep -E "\| FAIL|^passed [0-9]" $OUT/suite/gpu-suite.log
echo "== reuse pattern, auto, then again"
for round in 1 2; do for b in base full; do
  LD_PRELOAD=.device-carry/$b/lib/liballocshim.so ALLOCSHIM_QUIET=1 ALLOCSHIM_CONF=$C,budget.migrate=auto \
    ALLOCSHIM_STATS=$OUT/reuse-$b-$round.json $N/bin/migrate_bench malloc 8GiB 4GiB 50 again 2>&1 | grep -E "result|again|FAIL" | sed "s/^/$b: /"
done; done
echo "== share_bench (auto)"
for round in 1 2; do for b in base full; do
  B=.device-carry/$b
  for mode in shared handoff; do
    ALLOCSHIM_STATS=$OUT/share-$b-$mode-$round-%p.json timeout 60 $B/bin/allocshim run --quiet \
      --conf $C,budget.share=user,budget.migrate=auto -- $N/bin/share_bench --mode $mode > $OUT/share-$b-$mode-$round.log 2>&1
    echo "$b $mode $round: $(grep -E 'total|sweeps|bad words' $OUT/share-$b-$mode-$round.log | grep -v ' 0 bad' | tr '\n' ' ')"
  done
done; done
cd $OUT && tar czf logs.tgz *.log *.json suite && rm -rf suite && find . -maxdepth 1 -type f ! -name logs.tgz -delete
