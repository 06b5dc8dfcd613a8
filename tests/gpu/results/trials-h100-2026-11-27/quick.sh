#!/bin/sh
# quick A/B: GPT auto NEW at 89/71, HF auto NEW and BASE twice interleaved
NEW=$1 BASE=$2 OUT=$3
mkdir -p $OUT
PY=${PYTHON:-python3}
H=tools/bench
$PY $H/torch_gpt.py --steps 40 --warmup 20 > $OUT/gn.out 2> $OUT/gn.err
peak=$(sed -n 's/^peak_reserved: //p' $OUT/gn.err)
echo "native $(grep step_ms $OUT/gn.err)"
for pct in 89 71; do
  b=$((peak / 100 * pct / 1048576))MiB
  LD_PRELOAD=$NEW/lib/liballocshim.so ALLOCSHIM_CONF="budget.device=$b,budget.spill=host,budget.migrate=auto" ALLOCSHIM_STATS=$OUT/g$pct.stats.json $PY $H/torch_gpt.py --steps 40 --warmup 20 > $OUT/g$pct.out 2> $OUT/g$pct.err
  echo "gpt $pct auto: $(grep 'step_ms\|phase_ms' $OUT/g$pct.err | tr '\n' ' ') losses $(cmp -s $OUT/gn.out $OUT/g$pct.out && echo same || echo different)"
  grep -h "step_times_ms\|trials" $OUT/g$pct.err | cut -c1-100; grep -o "[0-9]* trials.*" $OUT/g$pct.err
done
$PY $H/hf_generate.py > $OUT/hn.out 2> $OUT/hn.err; echo "hf native $(grep ms_per_token $OUT/hn.err)"
for r in 1 2; do for v in new:$NEW base:$BASE; do n=${v%%:*} d=${v#*:}
  LD_PRELOAD=$d/lib/liballocshim.so ALLOCSHIM_CONF="budget.device=1228MiB,budget.spill=host,budget.migrate=auto" ALLOCSHIM_STATS=$OUT/h$n$r.stats.json $PY $H/hf_generate.py > $OUT/h$n$r.out 2> $OUT/h$n$r.err
  echo "hf $n $r: $(grep ms_per_token $OUT/h$n$r.err) tokens $(cmp -s $OUT/hn.out $OUT/h$n$r.out && echo same || echo different) $(grep -o '[0-9]* trials.*' $OUT/h$n$r.err)"
done; done
