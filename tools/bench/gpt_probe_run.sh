#!/bin/sh
# Where the GPT-style training loop's data lies under a device budget, and what it costs: torch_gpt.py
# --probe natively, then at 89% and 71% of its native peak reserved with migrate = "off" and
# "auto" (each: tensors and allocator segments per 2 MiB chunk on device or host, the allocator's
# events of one step, per-kernel CUDA time of two steps, phase times; the shim's stats file with
# every movable allocation's uses). Read the files with gpt_probe_report.py OUT.
# Usage: gpt_probe_run.sh BUILD OUT [PCT...]   (BUILD has lib/liballocshim.so; default 89 71)
set -u
B=$1
OUT=$2
shift 2
PCTS=${*:-89 71}
. "$(dirname "$0")/run_common.sh"
val() { sed -n "s/^$1: //p" "$OUT/$2.err" | tail -1; }
"$PY" "$HERE/torch_gpt.py" --probe "$OUT/gpt.native.json" >"$OUT/gpt.native.out" 2>"$OUT/gpt.native.err" ||
  { note "gpt native FAILED"; status=1; }
native_ms=$(val step_ms gpt.native)
peak=$(val peak_reserved gpt.native)
note "gpt native: step_ms $native_ms, peak reserved $peak bytes, $(val phase_ms gpt.native)"
for pct in $PCTS; do
  budget=$((peak / 100 * pct / 1048576))MiB
  for mode in off auto; do
    name=gpt.$pct.$mode
    under "budget.device=$budget,budget.spill=host,budget.migrate=$mode" "$OUT/$name.stats.json" \
      "$PY" "$HERE/torch_gpt.py" --probe "$OUT/$name.json" >"$OUT/$name.out" 2>"$OUT/$name.err" ||
      { note "$name FAILED"; status=1; }
    same=$(cmp -s "$OUT/gpt.native.out" "$OUT/$name.out" && echo same || echo different)
    note "gpt $pct% ($budget) $mode: step_ms $(val step_ms "$name") ($(awk "BEGIN{print $(val step_ms "$name")/$native_ms}")x native), $(val phase_ms "$name"), losses $same"
  done
done
note "status $status"
exit $status
