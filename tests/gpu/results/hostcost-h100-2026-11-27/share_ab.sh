#!/usr/bin/env bash
# share_bench.sh on two slim builds, interleaved A B A B (one round each), the reports in OUT:
#   share_ab.sh A_DIR B_DIR OUT [RUNS_REGEX]
# A slim build holds bin/share_bench, bin/allocshim, lib/ and COMMIT (packed from a build tree).
set -u
a=$1 b=$2 out=$3
runs=${4:-'^(long )?(sequential|shared, migrate auto)$'}
mkdir -p "$out"
for i in 1 2; do
  for d in "$a" "$b"; do
    name=$(cat "$d/COMMIT")-$i
    SHARE_ROUNDS=1 SHARE_RUNS="$runs" bash tools/bench/share_bench.sh "$d" "$out/stats-$name" > "$out/$name.md" 2>&1
    grep -E "^share_bench .*turns" "$out/$name.md" | sed "s/^/$name: /"
  done
done
