#!/bin/sh
# Long turns (timeline.sh, 342 passes, traced) of several packed builds, each optionally with
# policy overrides, interleaved for N rounds, then one sequential run for the reference:
#   ab.sh OUT N BUILD[:,key=value...] ...
# e.g. ab.sh OUT 2 .device-carry/a .device-carry/a:,budget.host_reserve=5GiB .device-carry/b
out=$1 n=$2
shift 2
tl=tests/gpu/results/main-h100-2026-11-27b/timeline.sh
for i in $(seq "$n"); do
  k=0
  for spec in "$@"; do
    k=$((k + 1))
    d=${spec%%:*}
    extra=
    [ "$d" != "$spec" ] && extra=${spec#*:}
    c=$(cat "$d/COMMIT")$extra
    NO_SEQ=1 sh $tl "$d" "$out/long-$k-$i" 342 "$extra" | sed "s/^/$c-$i /"
  done
done
d=${1%%:*}
mkdir -p "$out/seq"
"$d/bin/allocshim" run --conf budget.device=8GiB,budget.spill=host,budget.share=user -- \
  "$d/bin/share_bench" --mode sequential --rounds 3 --passes 342 > "$out/seq/seq.log" 2>&1
echo "seq: rc=$? $(tail -1 "$out/seq/seq.log")"
