#!/bin/sh
# Issue 23's model rows for two builds in one run: the GPT-style training loop (torch_gpt.py --probe)
# natively, then at 89% and 71% of its native peak reserved with migrate = "off" (NEW) and "auto"
# (BASE, then NEW); Llama-style generation (hf_generate.py) natively, "off", "auto" BASE and NEW
# under 1.2 GiB; weights first and the reuse pattern (migrate_bench, from BASE's bin/) natively,
# "off", "auto" BASE and NEW. Ratios against native of the same run; losses and tokens compared.
# Usage: gpt_ab_run.sh NEW BASE OUT   (each build has lib/liballocshim.so). Prints a table last.
# GPT_ARGS: torch_gpt.py's step options (default 40 steps, the median over the last 20: trials settle
# a placement over the first ones); GPT_ONLY=1 stops after the GPT rows.
set -u
NEW=$1
BASE=$2
B=$NEW
OUT=$3
GPT_ARGS=${GPT_ARGS:---steps 40 --warmup 20}
. "$(dirname "$0")/run_common.sh"
val() { sed -n "s/^$1: //p" "$OUT/$2.err" | tail -1; }
with() {  # with BUILD CONF NAME CMD...: CMD under BUILD's shim, stdout/stderr to OUT/NAME.{out,err}
  lib=$1/lib/liballocshim.so conf=$2 name=$3
  shift 3
  LD_PRELOAD="$lib" ALLOCSHIM_CONF="$conf" ALLOCSHIM_STATS="$OUT/$name.stats.json" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err" ||
    { note "$name FAILED"; status=1; }
}
# shellcheck disable=SC2086 # GPT_ARGS is a list of options
"$PY" "$HERE/torch_gpt.py" $GPT_ARGS --probe "$OUT/gpt.native.json" >"$OUT/gpt.native.out" 2>"$OUT/gpt.native.err" ||
  { note "gpt native FAILED"; status=1; }
native_ms=$(val step_ms gpt.native)
peak=$(val peak_reserved gpt.native)
note "gpt native: step_ms $native_ms, peak reserved $peak bytes, $(val phase_ms gpt.native)"
for pct in 89 71; do
  budget=$((peak / 100 * pct / 1048576))MiB
  for run in off:$NEW auto-base:$BASE auto:$NEW; do
    mode=${run%%:*} build=${run#*:}
    name=gpt.$pct.$mode
    with "$build" "budget.device=$budget,budget.spill=host,budget.migrate=${mode%-base}" "$name" \
      "$PY" "$HERE/torch_gpt.py" $GPT_ARGS --probe "$OUT/$name.json"
    same=$(cmp -s "$OUT/gpt.native.out" "$OUT/$name.out" && echo same || echo different)
    note "gpt $pct% ($budget) $mode: step_ms $(val step_ms "$name") ($(awk "BEGIN{print $(val step_ms "$name")/$native_ms}")x native), $(val phase_ms "$name"), losses $same"
  done
done

if [ "${GPT_ONLY:-0}" = 1 ]; then
  note "status $status"
  exit $status
fi
"$PY" "$HERE/hf_generate.py" >"$OUT/hf.native.out" 2>"$OUT/hf.native.err" || { note "hf native FAILED"; status=1; }
hf_native=$(val ms_per_token hf.native)
note "hf native: ms_per_token $hf_native"
for run in off:$NEW auto-base:$BASE auto:$NEW; do
  mode=${run%%:*} build=${run#*:}
  with "$build" "budget.device=1228MiB,budget.spill=host,budget.migrate=${mode%-base}" "hf.$mode" "$PY" "$HERE/hf_generate.py"
  same=$(cmp -s "$OUT/hf.native.out" "$OUT/hf.$mode.out" && echo same || echo different)
  note "hf 1.2GiB $mode: ms_per_token $(val ms_per_token hf.$mode) ($(awk "BEGIN{print $(val ms_per_token hf.$mode)/$hf_native}")x native), tokens $same"
done

"$BASE/bin/migrate_bench" weights-first 8GiB 4GiB 20 >"$OUT/wf.native.out" 2>"$OUT/wf.native.err" || status=1
note "weights-first native: $(grep -h '^passes\|^result' "$OUT/wf.native.out" | tr '\n' ' ')"
for run in off:$NEW auto-base:$BASE auto:$NEW; do
  mode=${run%%:*} build=${run#*:}
  with "$build" "budget.device=8GiB,budget.spill=host,budget.migrate=${mode%-base}" "wf.$mode" \
    "$BASE/bin/migrate_bench" weights-first 8GiB 4GiB 20
  note "weights-first $mode: $(grep -h '^passes\|^result' "$OUT/wf.$mode.out" | tr '\n' ' ')"
done
"$BASE/bin/migrate_bench" malloc 8GiB 4GiB 50 >"$OUT/reuse.native.out" 2>&1 || status=1
note "reuse native: $(grep -h '^result' "$OUT/reuse.native.out")"
for run in auto-base:$BASE auto:$NEW; do
  mode=${run%%:*} build=${run#*:}
  with "$build" "budget.device=8GiB,budget.spill=host,budget.migrate=auto" "reuse.$mode" \
    "$BASE/bin/migrate_bench" malloc 8GiB 4GiB 50
  note "reuse $mode: $(grep -h '^result' "$OUT/reuse.$mode.out")"
done
note "status $status"
exit $status
