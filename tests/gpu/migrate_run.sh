#!/bin/sh
# Live migration on the GPU machine, in one run (docs/oversubscription.md, "Migration"):
#   1. oversub_migrate under budget 2GiB, migrate = "auto": data verified by kernels on two streams
#      around every demotion and promotion; the stats must show both directions, a safe point
#      skipped while a stream was busy, and no failed move.
#   2. The reuse pattern (migrate_bench: 8 GiB cold, then 4 GiB hot read 50 times) natively (device
#      bandwidth, first and last), and under an 8 GiB budget with migrate = "auto", "promote" and
#      "off" (static spill), and with managed memory three ways; ratios to the native runs.
#   3. PyTorch with expandable segments (its own cuMemCreate) under a 128 MiB budget with spill =
#      "host": same losses as natively, time against natively.
# Usage: migrate_run.sh BUILD OUT   (BUILD has bin/ and lib/; logs and stats go to OUT)
# Prints a table last. Exit 0 when every check passed.
set -u
B=$1
OUT=$2
mkdir -p "$OUT"
rm -f "$OUT/bench_failed" "$OUT/table.txt"
SHIM="$B/lib/liballocshim.so"
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
status=0
note() { echo "$*" | tee -a "$OUT/table.txt"; }

under() {  # under CONF STATS CMD...: CMD with the shim, policy overrides CONF
  conf=$1 stats=$2
  shift 2
  LD_PRELOAD="$SHIM" ALLOCSHIM_CONF="$conf" ALLOCSHIM_STATS="$stats" "$@"
}

# 1. Correctness.
conf=budget.device=2GiB,budget.spill=host,budget.migrate=auto
if under "$conf" "$OUT/oversub_migrate.stats.json" "$B/bin/oversub_migrate" 2GiB >"$OUT/oversub_migrate.log" 2>&1 &&
  "$PY" - "$OUT/oversub_migrate.stats.json" <<'EOF'
import json, sys
b = json.load(open(sys.argv[1]))["budget"][0]
ok = b["demoted_bytes"] > 0 and b["promoted_bytes"] > 0 and b["skipped_busy"] >= 1 and b["move_failures"] == 0
print("oversub_migrate stats:", {k: b[k] for k in ("demoted_bytes", "demotions", "promoted_bytes",
      "promotions", "migrate_ns", "shim_syncs", "skipped_busy", "move_failures", "peak_backed")})
sys.exit(0 if ok else 1)
EOF
then t1=PASS; else t1=FAIL; status=1; fi
tail -3 "$OUT/oversub_migrate.log"

# 2. The reuse pattern.
bench() {  # bench NAME [CONF]: one run of the reuse pattern, prints hot_gbps
  name=$1 conf=${2:-}
  mode=malloc
  case $name in managed-*) mode=$name ;; esac
  if [ -n "$conf" ]; then
    under "$conf" "$OUT/bench.$name.stats.json" "$B/bin/migrate_bench" $mode 8GiB 4GiB 50
  else
    "$B/bin/migrate_bench" $mode 8GiB 4GiB 50
  fi >"$OUT/bench.$name.log" 2>&1 || echo "bench $name failed" >&2
  # In a command substitution: a failure is left as a file for the end of the script.
  grep -q "verify ok" "$OUT/bench.$name.log" || echo "$name" >>"$OUT/bench_failed"
  sed -n 's/.*hot_gbps=\([0-9.]*\).*/\1/p' "$OUT/bench.$name.log"
}
budget=budget.device=8GiB,budget.spill=host
dev1=$(bench native)
auto=$(bench auto "$budget,budget.migrate=auto")
promote=$(bench promote "$budget,budget.migrate=promote")
static=$(bench static "$budget,budget.migrate=off")
m_host=$(bench managed-host)
m_pref=$(bench managed-prefetch)
m_fault=$(bench managed-fault)
dev2=$(bench native2)
first_fault=$(sed -n 's/.*first_gbps=\([0-9.]*\).*/\1/p' "$OUT/bench.managed-fault.log")

# 3. PyTorch with expandable segments over budget.
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
"$PY" "$HERE/torch_train.py" --steps 60 >"$OUT/torch.native.out" 2>"$OUT/torch.native.err"
under budget.device=128MiB,budget.spill=host "$OUT/torch.shim.stats.json" \
  "$PY" "$HERE/torch_train.py" --steps 60 >"$OUT/torch.shim.out" 2>"$OUT/torch.shim.err"
trc=$?
unset PYTORCH_CUDA_ALLOC_CONF
if [ $trc -eq 0 ] && cmp -s "$OUT/torch.native.out" "$OUT/torch.shim.out"; then t3=PASS; else t3=FAIL; status=1; fi
tn=$(sed -n 's/^train_seconds: //p' "$OUT/torch.native.err")
ts=$(sed -n 's/^train_seconds: //p' "$OUT/torch.shim.err")
tspill=$("$PY" -c "import json,sys; b=json.load(open(sys.argv[1])).get('budget',[{}])[0]; print(b.get('spilled_allocs',0), b.get('spilled_bytes',0))" "$OUT/torch.shim.stats.json" 2>/dev/null)

"$PY" - "$dev1" "$dev2" "$auto" "$promote" "$static" "$m_host" "$m_pref" "$m_fault" "$first_fault" <<'EOF' | tee -a "$OUT/table.txt"
import sys
v = [float(x) if x else float("nan") for x in sys.argv[1:]]
dev = (v[0] + v[1]) / 2
rows = [("device (native, no budget)", dev), ("migrate = auto", v[2]), ("migrate = promote", v[3]),
        ("static spill (migrate = off)", v[4]), ("managed, host preferred + accessed-by", v[5]),
        ("managed, prefetch cold->host hot->GPU", v[6]), ("managed, faulting (50 reads)", v[7]),
        ("managed, faulting (first read)", v[8])]
print("| hot set, 4 GiB after 8 GiB cold, 8 GiB budget | GB/s | / device | auto / this |")
print("|---|---|---|---|")
for name, g in rows:
    print(f"| {name} | {g:.1f} | {g / dev:.1%} | {v[2] / g:.1f}x |")
print(f"(device runs: {v[0]:.1f} and {v[1]:.1f} GB/s)")
EOF
[ -s "$OUT/bench_failed" ] && { note "benchmark runs that failed verification: $(cat "$OUT/bench_failed")"; status=1; }
note "oversub_migrate (2 GiB budget, auto, kernels on two streams): $t1"
note "pytorch expandable_segments, 128 MiB budget, spill host: $t3 (same losses); train_seconds native $tn, under budget $ts; cuMemCreate on host (allocs, bytes): $tspill"
exit $status
