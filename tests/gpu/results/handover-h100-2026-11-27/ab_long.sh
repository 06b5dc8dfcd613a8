#!/bin/sh
# Long turns only (timeline.sh, 342 passes, traced), two packed builds interleaved A B A B ..., N
# rounds, then one sequential run of B for the reference: ab_long.sh A B OUT [N]
a=$1 b=$2 out=$3 n=${4:-3}
tl=tests/gpu/results/main-h100-2026-11-27b/timeline.sh
for i in $(seq "$n"); do
  for d in "$a" "$b"; do
    c=$(cat "$d/COMMIT")
    NO_SEQ=1 sh $tl "$d" "$out/long-$c-$i" 342 | sed "s/^/$c-$i /"
  done
done
sh $tl "$b" "$out/seq" 342 | sed "s/^/$(cat "$b/COMMIT")-seq /"
