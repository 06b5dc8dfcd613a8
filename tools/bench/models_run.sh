#!/bin/sh
# Real models under a device budget (issue 23's training and generation rows): the GPT-style
# training loop (torch_gpt.py, caching allocator) natively, then at 89% and 71% of its native peak
# reserved memory with migrate = "off" and "auto"; Llama-style generation (hf_generate.py, 2.2 GB
# of fp16 weights) natively, under a 1.2 GiB budget with "off" and "auto", and with HF accelerate's
# own CPU offload. Ratios against native from the same run; the losses and tokens must match.
# bench.py's models section. Usage: models_run.sh BUILD OUT   (BUILD has lib/liballocshim.so). Prints a table last.
set -u
B=$1
OUT=$2
. "$(dirname "$0")/run_common.sh"
run_under() {  # run_under CONF NAME CMD...: `under`, with stdout/stderr to OUT/NAME.{out,err}
  conf=$1 name=$2
  shift 2
  under "$conf" "$OUT/$name.stats.json" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
}
val() { sed -n "s/^$1: //p" "$OUT/$2.err" | tail -1; }

"$PY" "$HERE/torch_gpt.py" >"$OUT/gpt.native.out" 2>"$OUT/gpt.native.err" || { note "gpt native FAILED"; status=1; }
native_ms=$(val step_ms gpt.native)
peak=$(val peak_reserved gpt.native)
note "gpt native: step_ms $native_ms, peak reserved $peak bytes"
for pct in 89 71; do
  budget=$((peak / 100 * pct / 1048576))MiB
  for mode in off auto; do
    name=gpt.$pct.$mode
    run_under "budget.device=$budget,budget.spill=host,budget.migrate=$mode" "$name" "$PY" "$HERE/torch_gpt.py" ||
      { note "$name FAILED"; status=1; }
    same=$(cmp -s "$OUT/gpt.native.out" "$OUT/$name.out" && echo same || echo different)
    note "gpt $pct% ($budget) $mode: step_ms $(val step_ms "$name") ($(awk "BEGIN{print $(val step_ms "$name")/$native_ms}")x native), losses $same"
  done
done

"$PY" "$HERE/hf_generate.py" >"$OUT/hf.native.out" 2>"$OUT/hf.native.err" || { note "hf native FAILED"; status=1; }
hf_native=$(val ms_per_token hf.native)
note "hf native: ms_per_token $hf_native"
for mode in off auto; do
  run_under "budget.device=1228MiB,budget.spill=host,budget.migrate=$mode" hf.$mode "$PY" "$HERE/hf_generate.py" ||
    { note "hf $mode FAILED"; status=1; }
  same=$(cmp -s "$OUT/hf.native.out" "$OUT/hf.$mode.out" && echo same || echo different)
  note "hf 1.2GiB $mode: ms_per_token $(val ms_per_token hf.$mode) ($(awk "BEGIN{print $(val ms_per_token hf.$mode)/$hf_native}")x native), tokens $same"
done
"$PY" "$HERE/hf_generate.py" --offload >"$OUT/hf.offload.out" 2>"$OUT/hf.offload.err" || { note "hf offload FAILED"; status=1; }
same=$(cmp -s "$OUT/hf.native.out" "$OUT/hf.offload.out" && echo same || echo different)
note "hf accelerate cpu_offload: ms_per_token $(val ms_per_token hf.offload) ($(awk "BEGIN{print $(val ms_per_token hf.offload)/$hf_native}")x native), tokens $same"
note "status $status"
exit $status
