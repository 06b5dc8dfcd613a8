#!/bin/sh
# The GPT-style rows of gpt_ab_run.sh for one build under migrate = "auto" only (native, then 89%
# and 71% of the native peak reserved), with the same step options and files:
#   gpt_quick.sh BUILD OUT
set -u
B=$1
OUT=$2
GPT_ARGS=${GPT_ARGS:---steps 40 --warmup 20}
. "$(dirname "$0")/../../../../tools/bench/run_common.sh"
HERE=$(cd "$(dirname "$0")/../../../../tools/bench" && pwd)
val() { sed -n "s/^$1: //p" "$OUT/$2.err" | tail -1; }
# shellcheck disable=SC2086 # GPT_ARGS is a list of options
"$PY" "$HERE/torch_gpt.py" $GPT_ARGS --probe "$OUT/gpt.native.json" >"$OUT/gpt.native.out" 2>"$OUT/gpt.native.err" || status=1
native_ms=$(val step_ms gpt.native)
peak=$(val peak_reserved gpt.native)
note "gpt native: step_ms $native_ms, peak reserved $peak bytes, $(val phase_ms gpt.native)"
for pct in 89 71; do
  budget=$((peak / 100 * pct / 1048576))MiB
  name=gpt.$pct.auto
  # shellcheck disable=SC2086
  under "budget.device=$budget,budget.spill=host,budget.migrate=auto" "$OUT/$name.stats.json" \
    "$PY" "$HERE/torch_gpt.py" $GPT_ARGS --probe "$OUT/$name.json" >"$OUT/$name.out" 2>"$OUT/$name.err" || status=1
  same=$(cmp -s "$OUT/gpt.native.out" "$OUT/$name.out" && echo same || echo different)
  note "gpt $pct% ($budget) auto: step_ms $(val step_ms "$name") ($(awk "BEGIN{print $(val step_ms "$name")/$native_ms}")x native), $(val phase_ms "$name"), losses $same"
done
note "status $status"
exit $status
