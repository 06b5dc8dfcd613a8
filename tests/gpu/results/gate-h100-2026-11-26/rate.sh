#!/bin/bash
# launch_rate at 1 thread, main+budget vs branch+budget (and native), ROUNDS interleaved rounds.
set -u
C=$1; OUT=$2; ROUNDS=${3:-20}; N=$C/build; M=$C/main; L=$OUT/logs; mkdir -p "$L"
under() { b=$1; shift; timeout 120 env LD_PRELOAD="$b/lib/liballocshim.so" ALLOCSHIM_QUIET=1 ALLOCSHIM_CONF=budget.device=40GiB,budget.spill=host,budget.migrate=auto ALLOCSHIM_STATS="$L/rate.json" "$@"; }
for t in 1 8; do per=$((400000 / t))
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then order="main branch"; else order="branch main"; fi
  "$N/bin/launch_rate" $t $per 1 >>"$L/rate.native.$t.log" 2>&1
  for k in $order; do b=$N; [ $k = main ] && b=$M; under "$b" "$N/bin/launch_rate" $t $per 1 >>"$L/rate.$k.$t.log" 2>&1; done
done
python3 - "$L" $t <<'PY' | tee -a "$OUT/table.txt"
import re, statistics, sys
L, t = sys.argv[1], sys.argv[2]
r = {k: [float(x) for x in re.findall(r"launches_per_s=(\d+)", open(f"{L}/rate.{k}.{t}.log").read())] for k in ("native", "main", "branch")}
n = statistics.median(r["native"])
pr = [b / a for a, b in zip(r["main"], r["branch"])]
print(f"launch rate {t} threads ({len(r['native'])} rounds): native {n:.0f}/s; main+budget {statistics.median(r['main'])/n:.3f}x, branch+budget {statistics.median(r['branch'])/n:.3f}x; branch/main per round median {statistics.median(pr):.3f} (range {min(pr):.2f}-{max(pr):.2f})")
for k in ("native", "main", "branch"): print(f"  {k}: " + " ".join("%.0f" % x for x in r[k]))
PY
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
