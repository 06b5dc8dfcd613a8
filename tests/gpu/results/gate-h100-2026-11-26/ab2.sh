#!/bin/bash
# Second call: launch_overhead main vs branch interleaved (3 each); launch_race x5 and
# torch_threads x3 under auto (the branch); launch_rate with each process pinned to the same CPUs
# (taskset), native / main+budget / branch+budget interleaved, order alternating.
# usage: ab2.sh CARRY OUT [ROUNDS]
set -u
C=$1; OUT=$2; ROUNDS=${3:-16}
N=$C/build; M=$C/main; L=$OUT/logs; T=$OUT/table.txt; mkdir -p "$L"
note() { echo "$*" | tee -a "$T"; }
under() { b=$1 conf=$2 stats=$3; shift 3; timeout 120 env LD_PRELOAD="$b/lib/liballocshim.so" ALLOCSHIM_QUIET=1 ALLOCSHIM_CONF="$conf" ALLOCSHIM_STATS="$stats" "$@"; }
note "## ab2 $(date -u +%FT%TZ) branch $(cat $N/COMMIT) main $(cat $M/COMMIT); $(nproc) cpus"
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
        b = [j["budget_added_ns"] for j in rows[t]]
        extra = ""
        if "gate_added_ns" in rows[t][0]:
            extra = " gate %s scan %s" % ("/".join("%.1f" % j["gate_added_ns"] for j in rows[t]), "/".join("%.1f" % j["scan_added_ns"] for j in rows[t]))
        print(f"launch_overhead {k} {t} threads: budget added {'/'.join('%.1f' % x for x in b)} ns (median {statistics.median(b):.1f}); idle added {'/'.join('%.1f' % j['idle_added_ns'] for j in rows[t])}{extra}")
PY
st() { python3 -c '
import json, sys
s = json.load(open(sys.argv[1])); b = (s.get("budget") or [{}])[0]; m = s.get("migration", {})
print("moves", b.get("demotions", 0) + b.get("promotions", 0), "waits", m.get("gate_waits", 0), "closes", m.get("gate_closes", 0), "scanned", m.get("launches_scanned", 0), "unknown", m.get("unknown_layouts", 0), "functions", m.get("functions", 0), "layout_misses", m.get("layout_misses", 0))' "$1" 2>/dev/null || echo "no stats"; }
fails=0
for i in 1 2 3 4 5; do
  under "$N" budget.device=4GiB,budget.spill=host,budget.migrate=auto "$L/race.$i.json" "$N/bin/launch_race" 1GiB 3584MiB 6 2 >"$L/race.$i.log" 2>&1 || fails=$((fails+1))
  note "race $i: $(grep -h '^result\|^FAIL' "$L/race.$i.log" | tr '\n' ' ') $(st "$L/race.$i.json")"
done
note "race: 5 runs, $fails failed"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for i in 1 2 3; do
  under "$N" budget.device=256MiB,budget.spill=host,budget.migrate=auto "$L/torch.$i.json" python3 tests/gpu/torch_threads.py 2 30 >"$L/torch.$i.log" 2>&1
  note "torch_threads $i rc=$? $(grep -h '^result' "$L/torch.$i.log") $(st "$L/torch.$i.json")"
done
unset PYTORCH_NO_CUDA_MEMORY_CACHING
for t in 1 8; do
  per=$((400000 / t)); cpus=4; [ $t -gt 1 ] && cpus=4-11
  for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then order="native main branch"; else order="branch main native"; fi
    for k in $order; do
      case $k in
        native) taskset -c $cpus "$N/bin/launch_rate" $t $per 1 >>"$L/rate.native.$t.log" 2>&1 ;;
        main) under "$M" budget.device=40GiB,budget.spill=host,budget.migrate=auto "$L/rate.json" taskset -c $cpus "$N/bin/launch_rate" $t $per 1 >>"$L/rate.main.$t.log" 2>&1 ;;
        branch) under "$N" budget.device=40GiB,budget.spill=host,budget.migrate=auto "$L/rate.json" taskset -c $cpus "$N/bin/launch_rate" $t $per 1 >>"$L/rate.branch.$t.log" 2>&1 ;;
      esac
    done
  done
  python3 - "$L" $t "$cpus" <<'PY' | tee -a "$T"
import re, statistics, sys
L, t, cpus = sys.argv[1], sys.argv[2], sys.argv[3]
r = {k: [float(x) for x in re.findall(r"launches_per_s=(\d+)", open(f"{L}/rate.{k}.{t}.log").read())] for k in ("native", "main", "branch")}
n = statistics.median(r["native"])
pr = [b / a for a, b in zip(r["main"], r["branch"])]
print(f"launch rate {t} threads, taskset {cpus} ({len(r['native'])} rounds): native {n:.0f}/s; main+budget {statistics.median(r['main'])/n:.3f}x, branch+budget {statistics.median(r['branch'])/n:.3f}x; branch/main per round median {statistics.median(pr):.3f} (range {min(pr):.2f}-{max(pr):.2f})")
for k in ("native", "main", "branch"): print(f"  {k}: " + " ".join("%.0f" % x for x in r[k]))
PY
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
