#!/bin/bash
# Issue 23 items 1-2, one call: launch_overhead (null driver) main vs branch interleaved;
# launch_race (checked buffer hidden from the scan) under migrate=auto; torch_threads; launch_rate
# 1 and 8 threads, native / main+budget / branch+budget, interleaved rounds.
# usage: ab.sh CARRY OUT [RATE_ROUNDS] [RACE_RUNS]
set -u
C=$1; OUT=$2; ROUNDS=${3:-10}; RACE=${4:-8}
N=$C/build; M=$C/main
mkdir -p "$OUT/logs"; L=$OUT/logs; T=$OUT/table.txt
note() { echo "$*" | tee -a "$T"; }
under() { b=$1 conf=$2 stats=$3; shift 3; timeout 120 env LD_PRELOAD="$b/lib/liballocshim.so" ALLOCSHIM_QUIET=1 ALLOCSHIM_CONF="$conf" ALLOCSHIM_STATS="$stats" "$@"; }
note "## ab $(date -u +%FT%TZ) branch $(cat $N/COMMIT) main $(cat $M/COMMIT); $(nproc) cpus, $(lscpu | grep 'Model name' | sed 's/ \+/ /g')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$T"
# 1. launch_overhead, interleaved
for r in 1 2 3; do
  "$M/bin/launch_overhead" 4000000 >"$L/lo.main.$r.log" 2>&1
  "$N/bin/launch_overhead" 4000000 >"$L/lo.branch.$r.log" 2>&1
done
python3 - "$L" <<'PY' | tee -a "$T"
import json, glob, sys, statistics
L = sys.argv[1]
for k in ("main", "branch"):
    rows = {}
    for f in sorted(glob.glob(f"{L}/lo.{k}.*.log")):
        for line in open(f):
            if line.startswith("{"):
                j = json.loads(line); rows.setdefault(j["threads"], []).append(j)
    for t in sorted(rows):
        b = [j["budget_added_ns"] for j in rows[t]]; i = [j["idle_added_ns"] for j in rows[t]]
        extra = ""
        if "gate_added_ns" in rows[t][0]:
            extra = " gate %s scan %s" % ("/".join("%.1f" % j["gate_added_ns"] for j in rows[t]), "/".join("%.1f" % j["scan_added_ns"] for j in rows[t]))
        print(f"launch_overhead {k} {t} threads: budget added {'/'.join('%.1f' % x for x in b)} ns (median {statistics.median(b):.1f}); idle added {'/'.join('%.1f' % x for x in i)}{extra}")
PY
# 2. launch_race: native once, then RACE runs under auto, each must see >= 2 moves of the checked buffer
moves() { python3 -c '
import json, sys
s = json.load(open(sys.argv[1])); b = (s.get("budget") or [{}])[0]; m = s.get("migration", {})
print(b.get("demotions", 0) + b.get("promotions", 0), b.get("demoted_bytes", 0) >> 20, m.get("gate_waits", 0), m.get("gate_closes", 0), m.get("launches_scanned", 0), m.get("unknown_layouts", 0))' "$1" 2>/dev/null || echo "0 0 0 0 0 0"; }
timeout 90 "$N/bin/launch_race" 1GiB 3584MiB 2 >"$L/race.native.log" 2>&1; note "race native rc=$? $(grep ^result "$L/race.native.log")"
fails=0
for i in $(seq 1 "$RACE"); do
  under "$N" budget.device=4GiB,budget.spill=host,budget.migrate=auto "$L/race.$i.json" "$N/bin/launch_race" 1GiB 3584MiB 6 2 >"$L/race.$i.log" 2>&1 || fails=$((fails+1))
  note "race $i: $(grep -h '^result\|^FAIL' "$L/race.$i.log" | tr '\n' ' ') stats(moves demotedMiB waits closes scanned unknown)=$(moves "$L/race.$i.json")"
done
note "race: $RACE runs, $fails failed"
# 3. PyTorch inference threads, branch shim
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for i in 1 2 3; do
  under "$N" budget.device=256MiB,budget.spill=host,budget.migrate=auto "$L/torch.$i.json" python3 tests/gpu/torch_threads.py 2 30 >"$L/torch.$i.log" 2>&1
  note "torch_threads $i rc=$? $(grep -h '^result' "$L/torch.$i.log") stats=$(moves "$L/torch.$i.json")"
done
unset PYTORCH_NO_CUDA_MEMORY_CACHING
# 4. launch rate, interleaved: native, main+budget, branch+budget; one process per cell per round
for t in 1 8; do
  per=$((400000 / t))
  for r in $(seq 1 "$ROUNDS"); do
    "$N/bin/launch_rate" $t $per 1 >>"$L/rate.native.$t.log" 2>&1
    under "$M" budget.device=40GiB,budget.spill=host,budget.migrate=auto "$L/rate.json" "$N/bin/launch_rate" $t $per 1 >>"$L/rate.main.$t.log" 2>&1
    under "$N" budget.device=40GiB,budget.spill=host,budget.migrate=auto "$L/rate.json" "$N/bin/launch_rate" $t $per 1 >>"$L/rate.branch.$t.log" 2>&1
  done
  python3 - "$L" $t <<'PY' | tee -a "$T"
import re, statistics, sys
L, t = sys.argv[1], sys.argv[2]
r = {k: [float(x) for x in re.findall(r"launches_per_s=(\d+)", open(f"{L}/rate.{k}.{t}.log").read())] for k in ("native", "main", "branch")}
n = statistics.median(r["native"])
ratios = lambda k: [b / a for a, b in zip(r["native"], r[k])]
print(f"launch rate {t} threads: native {n:.0f}/s; main+budget {statistics.median(r['main'])/n:.3f}x, branch+budget {statistics.median(r['branch'])/n:.3f}x "
      f"(medians of {len(r['native'])} rounds; per-round ratio medians main {statistics.median(ratios('main')):.3f} branch {statistics.median(ratios('branch')):.3f})")
PY
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
