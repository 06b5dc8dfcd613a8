#!/bin/sh
# Launch-aware migration on the GPU machine, in one run (docs/oversubscription.md, "Migration";
# issue 23's benchmarks):
#   1. launch_race: a thread checks its buffer with kernels on its own stream while another
#      thread's allocations past a 4 GiB budget force moves of that very buffer (its kernels
#      reach it through a pointer the parameter scan cannot see); RACE_RUNS runs under
#      migrate = "auto", each must find 0 wrong words, no CUDA error, moves in its statistics and
#      at least 2 moves of the checked buffer seen by the program.
#   2. torch_threads.py: PyTorch inference threads, each on its own stream, without the caching
#      allocator, under a 256 MiB budget: TORCH_RUNS runs, same rules.
#   3. Weights first (migrate_bench weights-first 8GiB 4GiB 20): natively, "off", "auto",
#      interleaved twice: the hot set's bandwidth per pass and end to end.
#   4. The reuse pattern (migrate_bench malloc 8GiB 4GiB 50): natively and "auto".
#   5. launch_rate at 1 and 8 threads: natively, under the shim without a budget, with one
#      (migrate = "auto", room for everything) and with one that moves nothing (migrate = "off":
#      the hooks' one-load path, a control for the spread between processes), RATE_ROUNDS
#      processes each, the order rotating by round; launch_overhead on this host's CPU, and with
#      a real driver (the hooks' cost inside one thread, which process rates cannot resolve).
# bench.py's launch section. Usage: launch_run.sh BUILD OUT [RACE_RUNS] [TORCH_RUNS] [RATE_ROUNDS]   (BUILD has bin/ and lib/)
# Prints a table last. Exit 0 when every check passed.
set -u
B=$1
OUT=$2
RACE_RUNS=${3:-20}
TORCH_RUNS=${4:-20}
RATE_ROUNDS=${5:-16}
. "$(dirname "$0")/run_common.sh"
# moves STATS: demotions+promotions of device 0, and the gate's counters.
moves() {
  "$PY" -c '
import json, sys
s = json.load(open(sys.argv[1]))
b = (s.get("budget") or [{}])[0]
m = s.get("migration", {})
print(b.get("demotions", 0) + b.get("promotions", 0), m.get("gate_waits", 0), m.get("gate_closes", 0),
      m.get("launches_scanned", 0), m.get("unknown_layouts", 0))' "$1" 2>/dev/null || echo "0 0 0 0 0"
}
# repeat NAME RUNS CONF CMD...: RUNS runs under CONF; counts failures and runs without a move.
repeat() {
  name=$1 runs=$2 conf=$3
  shift 3
  fails=0 nomove=0 total=0 i=0
  while [ "$i" -lt "$runs" ]; do
    i=$((i + 1))
    st="$OUT/$name.$i.stats.json"
    if ! under "$conf" "$st" "$@" >"$OUT/$name.$i.log" 2>&1; then fails=$((fails + 1)); fi
    m=$(moves "$st")
    n=${m%% *}
    [ "$n" -gt 0 ] || nomove=$((nomove + 1))
    total=$((total + n))
  done
  note "$name: $runs runs, $fails failed, $nomove without a move, $total moves in all (last: moves gate_waits gate_closes launches_scanned unknown_layouts = $m)"
  [ "$fails" -eq 0 ] && [ "$nomove" -eq 0 ] || status=1
}

note "## launch_run $(date -u +%Y-%m-%dT%H:%MZ)"
# 1. Threads launching while another thread's allocations force moves.
"$B/bin/launch_race" 1GiB 3584MiB 2 >"$OUT/race.native.log" 2>&1 || { note "race native FAILED"; status=1; }
repeat race "$RACE_RUNS" budget.device=4GiB,budget.spill=host,budget.migrate=auto "$B/bin/launch_race" 1GiB 3584MiB 6 2

# 2. PyTorch inference threads without the caching allocator.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
"$PY" "$GPU_TESTS/torch_threads.py" 2 30 >"$OUT/torch.native.log" 2>&1 || { note "torch native FAILED"; status=1; }
repeat torch_threads "$TORCH_RUNS" budget.device=256MiB,budget.spill=host,budget.migrate=auto \
  "$PY" "$GPU_TESTS/torch_threads.py" 2 30
unset PYTORCH_NO_CUDA_MEMORY_CACHING

# 3 and 4. Weights first, and the reuse pattern.
wf() {  # wf NAME CONF: one weights-first run
  if [ -n "$2" ]; then
    under "$2" "$OUT/wf.$1.stats.json" "$B/bin/migrate_bench" weights-first 8GiB 4GiB 20 >"$OUT/wf.$1.log" 2>&1
  else
    "$B/bin/migrate_bench" weights-first 8GiB 4GiB 20 >"$OUT/wf.$1.log" 2>&1
  fi || { note "weights-first $1 FAILED"; status=1; }
  note "weights-first $1: $(grep -h '^passes\|^result' "$OUT/wf.$1.log" | tr '\n' ' ')"
}
for round in 1 2; do
  wf native.$round ""
  wf off.$round budget.device=8GiB,budget.spill=host,budget.migrate=off
  wf auto.$round budget.device=8GiB,budget.spill=host,budget.migrate=auto
done
"$B/bin/migrate_bench" malloc 8GiB 4GiB 50 >"$OUT/reuse.native.log" 2>&1 || status=1
under budget.device=8GiB,budget.spill=host,budget.migrate=auto "$OUT/reuse.auto.stats.json" \
  "$B/bin/migrate_bench" malloc 8GiB 4GiB 50 >"$OUT/reuse.auto.log" 2>&1 || status=1
note "reuse native: $(grep -h '^result' "$OUT/reuse.native.log")"
note "reuse auto:   $(grep -h '^result' "$OUT/reuse.auto.log")"

# 5. Launch rate: rounds of native, the shim without a budget, with one, and with one that moves
# nothing; one process per cell and round (the host's speed differs between processes, not
# within one), the order rotating so that no cell always runs first.
rate_cell() {  # rate_cell CELL THREADS PER
  case $1 in
    native) "$B/bin/launch_rate" "$2" "$3" 1 ;;
    shim) LD_PRELOAD="$SHIM" ALLOCSHIM_QUIET=1 "$B/bin/launch_rate" "$2" "$3" 1 ;;
    budget | off)
      mode=auto
      [ "$1" = off ] && mode=off
      under budget.device=40GiB,budget.spill=host,budget.migrate=$mode "$OUT/rate.$1.$2.stats.json" \
        "$B/bin/launch_rate" "$2" "$3" 1 ;;
  esac >>"$OUT/rate.$1.$2.log" 2>&1
}
for threads in 1 8; do
  per=$((400000 / threads))
  for round in $(seq 1 "$RATE_ROUNDS"); do
    set -- native shim budget off
    i=0
    while [ $i -lt $((round % 4)) ]; do first=$1; shift; set -- "$@" "$first"; i=$((i + 1)); done
    for cell in "$@"; do rate_cell "$cell" "$threads" "$per" || status=1; done
  done
  "$PY" - "$OUT" "$threads" <<'EOF' | tee -a "$OUT/table.txt"
import re, statistics, sys
out, t = sys.argv[1], sys.argv[2]
med = {}
for k in ("native", "shim", "budget", "off"):
    rates = [float(m) for m in re.findall(r"launches_per_s=(\d+)", open(f"{out}/rate.{k}.{t}.log").read())]
    med[k] = statistics.median(rates) if rates else float("nan")
print(f"launch rate {t} threads: native {med['native']:.0f}/s, shim {med['shim'] / med['native']:.3f}x, "
      f"shim+budget {med['budget'] / med['native']:.3f}x, shim+budget moving nothing {med['off'] / med['native']:.3f}x "
      f"(medians of {len(rates)} processes)")
EOF
done
if [ -x "$B/bin/launch_overhead" ]; then
  "$B/bin/launch_overhead" 4000000 >"$OUT/launch_overhead.log" 2>&1 &&
    grep -v '^{' "$OUT/launch_overhead.log" | tee -a "$OUT/table.txt"
  "$B/bin/launch_overhead" --driver 6000000 >"$OUT/launch_overhead_driver.log" 2>&1 &&
    grep -v '^{' "$OUT/launch_overhead_driver.log" | tee -a "$OUT/table.txt"
fi
note "status $status"
exit $status
