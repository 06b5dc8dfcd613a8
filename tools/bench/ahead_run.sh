#!/bin/sh
# Two builds of the shim side by side on issue 23's benchmarks (docs/design/oversubscription.md,
# "Migration"), interleaved in one run so that the host's per-process spread hits both alike:
#   1. weights first (migrate_bench weights-first 8GiB 4GiB 20): natively, "off" (build B), "auto"
#      under A and under B, ROUNDS rounds: per-pass bandwidth and end to end;
#   2. the reuse pattern (migrate_bench malloc 8GiB 4GiB 50): natively, A and B;
#   3. launch_race (a thread checks its buffer while another's allocations force moves) and
#      torch_threads (PyTorch inference threads, no caching allocator): RUNS runs each under A and B;
#      every run must pass; moves and promotions ahead are counted;
#   4. the GPT-style training loop at 89% and 71% of its peak (off, A, B) and Llama-style
#      generation under 1.2 GiB (off, A, B), against native.
# bench.py's ahead section (A: --base). Usage: ahead_run.sh A B OUT [ROUNDS] [RUNS]   (A and B have lib/; B also bin/). Prints a table last.
# PARTS (default "wf reuse threads gpt hf") picks the parts to run.
set -u
A=$1
B=$2
OUT=$3
ROUNDS=${4:-3}
RUNS=${5:-4}
. "$(dirname "$0")/run_common.sh"
PARTS=${PARTS:-wf reuse threads gpt hf}
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
lib() { [ "$1" = A ] && echo "$A/lib/liballocshim.so" || echo "$B/lib/liballocshim.so"; }
# shim WHICH CONF NAME CMD...: CMD under build WHICH's shim, stats to OUT/NAME.stats.json, output to OUT/NAME.log
shim() {
  which=$1 conf=$2 name=$3
  shift 3
  LD_PRELOAD="$(lib "$which")" ALLOCSHIM_CONF="$conf" ALLOCSHIM_STATS="$OUT/$name.stats.json" "$@" >"$OUT/$name.log" 2>&1
}
# counts NAME: moves (demotions+promotions), promotions ahead and their bytes, declined, rebalances
counts() {
  "$PY" -c '
import json, sys
try: s = json.load(open(sys.argv[1]))
except Exception: print("no stats"); sys.exit()
b = (s.get("budget") or [{}])[0]; m = s.get("migration", {})
print("moves", b.get("demotions", 0) + b.get("promotions", 0), "ahead", m.get("ahead", 0), m.get("ahead_bytes", 0),
      "declined", m.get("ahead_declined", 0), "rebalances", m.get("rebalances", 0), "regrets", m.get("regrets", 0))' "$OUT/$1.stats.json"
}
res() { grep -h '^passes\|^result\|^verify' "$OUT/$1.log" | tr '\n' ' '; }
W="$B/bin/migrate_bench weights-first 8GiB 4GiB 20"
C=budget.device=8GiB,budget.spill=host

note "## ahead_run $(date -u +%Y-%m-%dT%H:%MZ) A=$(cat "$A/COMMIT" 2>/dev/null) B=$(cat "$B/COMMIT" 2>/dev/null)"
part wf && for r in $(seq 1 "$ROUNDS"); do
  $W >"$OUT/wf.native.$r.log" 2>&1 || status=1
  note "wf native.$r: $(res wf.native.$r)"
  shim B $C,budget.migrate=off wf.off.$r $W || status=1
  note "wf off.$r: $(res wf.off.$r)"
  for w in A B; do
    shim $w $C,budget.migrate=auto wf.$w.$r $W || status=1
    note "wf auto-$w.$r: $(res wf.$w.$r) | $(counts wf.$w.$r)"
  done
done
part reuse && "$B/bin/migrate_bench" malloc 8GiB 4GiB 50 >"$OUT/reuse.native.log" 2>&1 &&
  note "reuse native: $(res reuse.native)" && for w in A B; do
  shim $w $C,budget.migrate=auto reuse.$w "$B/bin/migrate_bench" malloc 8GiB 4GiB 50 || status=1
  note "reuse auto-$w: $(res reuse.$w) | $(counts reuse.$w)"
done

part threads && for i in $(seq 1 "$RUNS"); do
  for w in A B; do
    shim $w budget.device=4GiB,budget.spill=host,budget.migrate=auto race.$w.$i "$B/bin/launch_race" 1GiB 3584MiB 6 &&
      ok=ok || { ok=FAILED; status=1; }
    note "race $w.$i: $ok $(grep -h '^result' "$OUT/race.$w.$i.log") | $(counts race.$w.$i)"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 shim $w budget.device=256MiB,budget.spill=host,budget.migrate=auto \
      torch.$w.$i "$PY" "$GPU_TESTS/torch_threads.py" 2 30 && ok=ok || { ok=FAILED; status=1; }
    note "torch_threads $w.$i: $ok | $(counts torch.$w.$i)"
  done
done

val() { sed -n "s/^$1: //p" "$OUT/$2.log" | tail -1; }
if part gpt; then
"$PY" "$HERE/torch_gpt.py" >"$OUT/gpt.native.out" 2>"$OUT/gpt.native.log" || status=1
gn=$(val step_ms gpt.native)
peak=$(val peak_reserved gpt.native)
note "gpt native: step_ms $gn, peak reserved $peak"
for pct in 89 71; do
  budget=$((peak / 100 * pct / 1048576))MiB
  for m in off A B; do
    w=$m mode=auto
    [ "$m" = off ] && w=B mode=off
    LD_PRELOAD="$(lib $w)" ALLOCSHIM_CONF="budget.device=$budget,budget.spill=host,budget.migrate=$mode" \
      ALLOCSHIM_STATS="$OUT/gpt.$pct.$m.stats.json" "$PY" "$HERE/torch_gpt.py" >"$OUT/gpt.$pct.$m.out" 2>"$OUT/gpt.$pct.$m.log" || status=1
    same=$(cmp -s "$OUT/gpt.native.out" "$OUT/gpt.$pct.$m.out" && echo same || echo different)
    s=$(val step_ms gpt.$pct.$m)
    note "gpt $pct% $m: step_ms $s ($(awk "BEGIN{print $s/$gn}")x), losses $same | $(counts gpt.$pct.$m)"
  done
done
fi
if part hf; then
"$PY" "$HERE/hf_generate.py" >"$OUT/hf.native.out" 2>"$OUT/hf.native.log" || status=1
hn=$(val ms_per_token hf.native)
note "hf native: ms_per_token $hn"
for m in off A B; do
  w=$m mode=auto
  [ "$m" = off ] && w=B mode=off
  LD_PRELOAD="$(lib $w)" ALLOCSHIM_CONF="budget.device=1228MiB,budget.spill=host,budget.migrate=$mode" \
    ALLOCSHIM_STATS="$OUT/hf.$m.stats.json" "$PY" "$HERE/hf_generate.py" >"$OUT/hf.$m.out" 2>"$OUT/hf.$m.log" || status=1
  same=$(cmp -s "$OUT/hf.native.out" "$OUT/hf.$m.out" && echo same || echo different)
  s=$(val ms_per_token hf.$m)
  note "hf 1.2GiB $m: ms_per_token $s ($(awk "BEGIN{print $s/$hn}")x), tokens $same | $(counts hf.$m)"
done
fi
note "status $status"
exit $status
