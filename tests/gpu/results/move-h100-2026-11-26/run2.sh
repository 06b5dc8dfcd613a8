#!/bin/bash
# Run 2: base (main at d045686) against new (a demotion maps host memory once; a busy safe point
# asks for all it has spilled) and new16 (the same, a busy safe point promoting 16 bytes per
# nanosecond waited instead of 4), interleaved, on one machine. OUT: where logs go.
set -u
C=budget.device=8GiB,budget.spill=host
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
echo "== move_bench (natively, with the swap sequence)"
.device-carry/new/bin/move_bench 2GiB 512MiB > $OUT/move_bench.log 2>&1; sed -n '/^| sequence/,$p' $OUT/move_bench.log
echo "== reuse pattern, auto, then again (the cold set promoted, the hot set allocated again)"
for round in 1 2; do for b in base new; do
  B=.device-carry/$b
  LD_PRELOAD=$B/lib/liballocshim.so ALLOCSHIM_QUIET=1 ALLOCSHIM_CONF=$C,budget.migrate=auto ALLOCSHIM_STATS=$OUT/reuse-$b-$round.json \
    $B/bin/migrate_bench malloc 8GiB 4GiB 50 again 2>&1 | grep -E "result|again|FAIL" | sed "s/^/$b: /"
done; done
echo "== share_bench (shared, then handoff; auto)"
for round in 1 2; do for b in base new new16; do
  B=.device-carry/$b
  for mode in shared handoff; do
    ALLOCSHIM_STATS=$OUT/share-$b-$mode-$round-%p.json timeout 60 $B/bin/allocshim run --quiet \
      --conf $C,budget.share=user,budget.migrate=auto -- $B/bin/share_bench --mode $mode > $OUT/share-$b-$mode-$round.log 2>&1
    echo "$b $mode $round: $(grep -E 'total|sweeps|bad words' $OUT/share-$b-$mode-$round.log | grep -v ' 0 bad' | tr '\n' ' ')"
  done
done; done
echo "== share_bench shared, 8 rounds"
for b in base new16 new; do
  B=.device-carry/$b
  timeout 90 $B/bin/allocshim run --quiet --conf $C,budget.share=user,budget.migrate=auto -- $B/bin/share_bench --mode shared --rounds 8 > $OUT/share8-$b.log 2>&1
  echo "$b: $(grep -E 'total' $OUT/share8-$b.log)"
done
B=.device-carry/base
timeout 90 $B/bin/allocshim run --quiet --conf $C,budget.share=user,budget.migrate=off -- $B/bin/share_bench --mode shared --rounds 8 > $OUT/share8-off.log 2>&1
echo "off: $(grep -E 'total' $OUT/share8-off.log)"
timeout 90 $B/bin/allocshim run --quiet --conf $C,budget.share=user -- $B/bin/share_bench --mode sequential --rounds 8 > $OUT/share8-seq.log 2>&1
echo "sequential: $(grep -E 'total' $OUT/share8-seq.log)"
cd $OUT && tar czf logs.tgz *.log *.json && find . -maxdepth 1 -type f ! -name logs.tgz -delete
