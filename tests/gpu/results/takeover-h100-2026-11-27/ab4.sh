#!/bin/sh
# Short turns (share_bench.sh, one round each: sequential, off, auto) and long turns traced
# (timeline.sh, shared run only), two packed builds interleaved A B A B; then B's short turns
# traced once: ab4.sh A B OUT
a=$1 b=$2 out=$3
tl=tests/gpu/results/main-h100-2026-11-27b/timeline.sh
for i in 1 2; do
  for d in "$a" "$b"; do
    c=$(cat "$d/COMMIT")
    SHARE_ROUNDS=1 SHARE_RUNS='^(sequential|shared, migrate (auto|off))$' \
      bash tools/bench/share_bench.sh "$d" "$out/short-$c-$i" > "$out/short-$c-$i.md" 2>&1
    grep -E "^\| (sequential|shared)" "$out/short-$c-$i.md" | head -3 | sed "s/^/$c-$i short /"
    NO_SEQ=1 sh $tl "$d" "$out/long-$c-$i" 342 | sed "s/^/$c-$i /"
  done
done
c=$(cat "$b/COMMIT")
NO_SEQ=1 sh $tl "$b" "$out/shorttl-$c" 10 | sed "s/^/$c-short-traced /"
