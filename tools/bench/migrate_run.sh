#!/bin/sh
# Live migration on the GPU machine, in one run (docs/oversubscription.md, "Migration"):
#   1. oversub_migrate under budget 2GiB, migrate = "auto": data verified by kernels on two streams
#      around every demotion and promotion; the stats must show both directions, a safe point
#      skipped while a stream was busy, and no failed move.
#   2. pin_bench: what pinning host memory costs natively, by piece size and threads; move_bench:
#      what a move costs step by step, natively, with the host piece made beforehand;
#      host_give_bench: a demotion into host pieces another process made, against pinning its own.
#   3. The reuse pattern (migrate_bench: 8 GiB cold, then 4 GiB hot read 50 times) natively (device
#      bandwidth, first and last), under an 8 GiB budget with migrate = "auto" (pin_threads 0, the
#      default 8, and 16), "promote" and "off" (static spill), and with managed memory three ways:
#      the hot set's bandwidth, the time to allocate it, and allocation + 50 reads end to end;
#      under "auto", then `again`: the cold set promoted back, the hot set allocated again (its
#      demotion takes the host pieces the promotion kept).
#   4. PyTorch with expandable segments (its own cuMemCreate) training a model of 10.2 GiB
#      (torch_big.py) natively and under a 2 GiB budget with spill = "host", migrate = "auto":
#      same losses, time against natively, what was made on the host.
#   5. Pinning ahead (pin_ahead_run.sh): the allocation that demotes after the program computed,
#      natively and with pin_ahead off and on, interleaved; weights first with it off and on.
# bench.py's migrate section. Usage: migrate_run.sh BUILD OUT   (BUILD has bin/ and lib/; logs and stats go to OUT)
# Prints a table last. Exit 0 when every check passed.
set -u
B=$1
OUT=$2
. "$(dirname "$0")/run_common.sh"
rm -f "$OUT/bench_failed"

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

# 2. Pinning host memory, natively.
"$B/bin/pin_bench" 4GiB >"$OUT/pin_bench.log" 2>&1 || echo "pin_bench failed" >&2
"$B/bin/move_bench" 2GiB >"$OUT/move_bench.log" 2>&1 || { echo "move_bench failed" >&2; status=1; }
"$B/bin/host_give_bench" 2GiB >"$OUT/host_give_bench.log" 2>&1 || { echo "host_give_bench failed" >&2; status=1; }

# 3. The reuse pattern.
bench() {  # bench NAME [CONF]: one run of the reuse pattern, prints "hot_gbps alloc_hot_ms e2e_ms"
  name=$1 conf=${2:-}
  mode=malloc
  case $name in managed-*) mode=$name ;; esac
  if [ -n "$conf" ]; then
    again=
    case $name in auto-again) again=again ;; esac
    under "$conf" "$OUT/bench.$name.stats.json" "$B/bin/migrate_bench" $mode 8GiB 4GiB 50 $again
  else
    "$B/bin/migrate_bench" $mode 8GiB 4GiB 50
  fi >"$OUT/bench.$name.log" 2>&1 || echo "bench $name failed" >&2
  # In a command substitution: a failure is left as a file for the end of the script.
  grep -q "verify ok" "$OUT/bench.$name.log" || echo "$name" >>"$OUT/bench_failed"
  sed -n 's/.*hot_gbps=\([0-9.]*\).*alloc_hot_ms=\([0-9.]*\).*e2e_ms=\([0-9.]*\).*/\1 \2 \3/p' "$OUT/bench.$name.log"
}
budget=budget.device=8GiB,budget.spill=host
dev1=$(bench native)
auto0=$(bench auto-serial "$budget,budget.migrate=auto,backends.host.pin_threads=0")
auto=$(bench auto "$budget,budget.migrate=auto")
auto16=$(bench auto-16 "$budget,budget.migrate=auto,backends.host.pin_threads=16")
bench auto-again "$budget,budget.migrate=auto" >/dev/null
promote=$(bench promote "$budget,budget.migrate=promote")
static=$(bench static "$budget,budget.migrate=off")
m_host=$(bench managed-host)
m_pref=$(bench managed-prefetch)
m_fault=$(bench managed-fault)
dev2=$(bench native2)
first_fault=$(sed -n 's/.*first_gbps=\([0-9.]*\).*/\1/p' "$OUT/bench.managed-fault.log")

# 4. PyTorch with expandable segments, a model of several GiB under a 2 GiB budget.
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
"$PY" "$HERE/torch_big.py" >"$OUT/torch.native.out" 2>"$OUT/torch.native.err"
trn=$?
under budget.device=2GiB,budget.spill=host,budget.migrate=auto "$OUT/torch.shim.stats.json" \
  "$PY" "$HERE/torch_big.py" >"$OUT/torch.shim.out" 2>"$OUT/torch.shim.err"
trc=$?
unset PYTORCH_CUDA_ALLOC_CONF
if [ $trc -eq $trn ] && [ -s "$OUT/torch.native.out" ] && cmp -s "$OUT/torch.native.out" "$OUT/torch.shim.out"; then t3=PASS; else t3=FAIL; status=1; fi
tn=$(sed -n 's/^train_seconds: //p' "$OUT/torch.native.err")
ts=$(sed -n 's/^train_seconds: //p' "$OUT/torch.shim.err")
tpeak=$(sed -n 's/^peak_allocated: //p' "$OUT/torch.native.err")
tspill=$("$PY" -c "import json,sys; b=json.load(open(sys.argv[1])).get('budget',[{}])[0]; print('spilled', b.get('spilled_allocs',0), 'handles', b.get('spilled_bytes',0), 'bytes; peak_backed', b.get('peak_backed',0), 'limit', b.get('limit',0))" "$OUT/torch.shim.stats.json" 2>/dev/null)

migrate_ms() {  # migrate_ms NAME: the stats' demoted bytes and time moving
  "$PY" -c "import json,sys; b=json.load(open(sys.argv[1]))['budget'][0]; print(f\"{b['demoted_bytes']/2**30:.2f} GiB demoted in {b['migrate_ns']/1e6:.0f} ms\")" "$OUT/bench.$1.stats.json" 2>/dev/null
}
note "pin_bench (cuMemCreate at the host location, natively):"
sed -n '/^| piece/,$p' "$OUT/pin_bench.log" | tee -a "$OUT/table.txt"
"$PY" - "$dev1" "$dev2" "$auto0" "$auto" "$auto16" "$promote" "$static" "$m_host" "$m_pref" "$m_fault" "$first_fault" <<'EOF' | tee -a "$OUT/table.txt"
import sys
def row(s):
    v = s.split()
    return [float(x) for x in v] if len(v) == 3 else [float("nan")] * 3
a = sys.argv[1:]
d1, d2, auto0, auto, auto16, prom, stat, mh, mp, mf = (row(x) for x in a[:10])
first = float(a[10]) if a[10] else float("nan")
dev = (d1[0] + d2[0]) / 2
rows = [("device (native, no budget)", [dev, d1[1], d1[2]]), ("migrate = auto, pin_threads 0 (serial)", auto0),
        ("migrate = auto (pin_threads 8, default)", auto), ("migrate = auto, pin_threads 16", auto16),
        ("migrate = promote", prom), ("static spill (migrate = off)", stat),
        ("managed, host preferred + accessed-by", mh), ("managed, prefetch cold->host hot->GPU", mp),
        ("managed, faulting", mf)]
print("| hot set, 4 GiB after 8 GiB cold, 8 GiB budget | GB/s (50 reads) | / device | allocate hot ms | allocate + 50 reads ms | auto e2e / this e2e |")
print("|---|---|---|---|---|---|")
for name, (g, al, e2e) in rows:
    print(f"| {name} | {g:.1f} | {g / dev:.1%} | {al:.1f} | {e2e:.1f} | {auto[2] / e2e:.2f} |")
print(f"(device runs: {d1[0]:.1f} and {d2[0]:.1f} GB/s; managed faulting, first read alone: {first:.1f} GB/s)")
EOF
[ -s "$OUT/bench_failed" ] && { note "benchmark runs that failed verification: $(cat "$OUT/bench_failed")"; status=1; }
note "demotion: pin_threads 0: $(migrate_ms auto-serial); 8: $(migrate_ms auto); 16: $(migrate_ms auto-16)"
note "auto, again (the cold set promoted back, the hot set allocated again): $(sed -n 's/^again //p' "$OUT/bench.auto-again.log")"
note "move_bench (natively, 64 MiB and 2 MiB pieces, host piece made beforehand):"
sed -n '/^| sequence/,$p' "$OUT/move_bench.log" | tee -a "$OUT/table.txt"
note "host_give_bench (natively, 2 GiB of 64 MiB pieces demoted into host pieces pinned by the giver, then made by another process):"
sed -n '/^| host pieces/,$p' "$OUT/host_give_bench.log" | tee -a "$OUT/table.txt"
note "oversub_migrate (2 GiB budget, auto, kernels on two streams): $t1"
note "pytorch under the budget, the shim's summary: $(grep -E 'by api|budget device|created' "$OUT/torch.shim.err" | tr -s ' ' | tr '\n' ';')"
note "pytorch expandable_segments, torch_big (peak allocated $tpeak B natively), 2 GiB budget, spill host, auto: $t3 (same losses, exit $trn/$trc); train_seconds native $tn, under budget $ts; $tspill"

# 5. Pinning ahead.
sh "$HERE/pin_ahead_run.sh" "$B" "$OUT/pin_ahead" || status=1
note "pinning ahead (pin_ahead_run.sh):"
cat "$OUT/pin_ahead/table.txt" >>"$OUT/table.txt"
exit $status
