#!/bin/sh
# Long turns traced (timeline.sh, shared run only) and short turns (share_bench.sh, one round:
# sequential, off, auto) for two packed builds interleaved A B A B: ab.sh A B OUT.
# Call 2 ran it as it is; call 3 with SEQ=1 THEN=pinahead, call 4 with SHORT_FIRST=1 THEN=shorttl.
#   SEQ=1          the long turns' sequential run once first
#   SHORT_FIRST=1  each build's short turns before its long ones
#   THEN=pinahead  then B's long turns once with pin_ahead = true
#   THEN=shorttl   then B's short turns (10 passes a turn) traced once
a=$1 b=$2 out=$3
tl=tests/gpu/results/main-h100-2026-11-27b/timeline.sh
[ -n "$SEQ" ] && sh $tl "$a" "$out/seq" 342 | head -1
long() { NO_SEQ=1 sh $tl "$1" "$out/long-$2" 342 | sed "s/^/$2 /"; }
short() {
  SHARE_ROUNDS=1 SHARE_RUNS='^(sequential|shared, migrate (auto|off))$' \
    bash tools/bench/share_bench.sh "$1" "$out/short-$2" > "$out/short-$2.md" 2>&1
  grep -E "^\| (sequential|shared)" "$out/short-$2.md" | head -3 | sed "s/^/$2 short /"
}
for i in 1 2; do
  for d in "$a" "$b"; do
    c=$(cat "$d/COMMIT")
    if [ -n "$SHORT_FIRST" ]; then short "$d" "$c-$i"; long "$d" "$c-$i"
    else long "$d" "$c-$i"; short "$d" "$c-$i"; fi
  done
done
c=$(cat "$b/COMMIT")
case "$THEN" in
  pinahead) NO_SEQ=1 sh $tl "$b" "$out/long-$c-pinahead" 342 ,budget.pin_ahead=true | sed "s/^/$c-pinahead /" ;;
  shorttl) NO_SEQ=1 sh $tl "$b" "$out/shorttl-$c" 10 | sed "s/^/$c-short-traced /" ;;
esac
