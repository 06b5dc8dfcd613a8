#!/bin/bash
# core_overhead with a per-thread null driver: base (main before) and new, interleaved, 3 rounds.
cd "$(dirname "$0")"
O=${OUT:-/tmp/out}; mkdir -p $O
lscpu | grep -E "^CPU\(s\)|Thread|Core|Socket|Model name" > $O/cpu.txt
for r in 1 2 3; do
  for v in base new; do
    ./$v/core_overhead 1000000 | grep '^{' > $O/core2_$v.$r.json
  done
done
cat $O/cpu.txt
for f in $O/core2_*.json; do echo "$(basename $f .json): $(sed 's/.*"threads":\([0-9]*\),"direct_ns_per_pair":\([0-9.]*\),"core_ns_per_pair":\([0-9.]*\),"added_ns_per_call":\([0-9.]*\).*/\1:\2\/\3\/\4/' $f | tr '\n' ' ')"; done
