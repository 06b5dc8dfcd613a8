#!/bin/sh
# GPT-style training under migrate = "auto", two builds interleaved: at 89% NEW BASE NEW BASE, at
# 71% BASE NEW BASE NEW (median step of steps 20-39 of 40; ratios against native of the same run).
# Usage: ab.sh NEW BASE OUT
NEW=$1 BASE=$2 OUT=$3
mkdir -p "$OUT"
PY=${PYTHON:-python3}
H=tools/bench
$PY $H/torch_gpt.py --steps 40 --warmup 20 >"$OUT/gn.out" 2>"$OUT/gn.err"
peak=$(sed -n 's/^peak_reserved: //p' "$OUT/gn.err")
native=$(sed -n 's/^step_ms: //p' "$OUT/gn.err")
echo "native step_ms $native, peak reserved $peak"
for pct in 89 71; do
  b=$((peak / 100 * pct / 1048576))MiB
  order="new base new base"
  [ $pct = 71 ] && order="base new base new"
  i=0
  for v in $order; do
    i=$((i + 1))
    d=$NEW
    [ $v = base ] && d=$BASE
    n=g$pct.$v.$i
    LD_PRELOAD=$d/lib/liballocshim.so ALLOCSHIM_CONF="budget.device=$b,budget.spill=host,budget.migrate=auto" \
      ALLOCSHIM_STATS="$OUT/$n.stats.json" $PY $H/torch_gpt.py --steps 40 --warmup 20 >"$OUT/$n.out" 2>"$OUT/$n.err"
    ms=$(sed -n 's/^step_ms: //p' "$OUT/$n.err")
    echo "gpt $pct% $v ($i): step_ms $ms ($(awk "BEGIN{printf \"%.2f\", $ms/$native}")x) losses $(cmp -s "$OUT/gn.out" "$OUT/$n.out" && echo same || echo different); $(grep -o '[0-9]* trials.*' "$OUT/$n.err")"
  done
done
