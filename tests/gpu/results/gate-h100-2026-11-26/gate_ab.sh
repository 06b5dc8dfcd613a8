#!/bin/bash
# launch_rate at 1 thread: native, main+budget, branch+budget with the light gate (membarrier) and
# the same library with the locked-exchange gate (ALLOCSHIM_TEST_GATE_HEAVY, a build-only switch);
# ROUNDS rounds, the order rotating.
set -u
C=$1; OUT=$2; ROUNDS=${3:-20}; N=$C/build; M=$C/main; H=$C/heavy; L=$OUT/logs; mkdir -p "$L"
run() {  # run KIND
  case $1 in
    native) "$N/bin/launch_rate" 1 400000 1 ;;
    main) LD_PRELOAD="$M/lib/liballocshim.so" ALLOCSHIM_QUIET=1 ALLOCSHIM_CONF=budget.device=40GiB,budget.spill=host,budget.migrate=auto "$N/bin/launch_rate" 1 400000 1 ;;
    light) LD_PRELOAD="$H/lib/liballocshim.so" ALLOCSHIM_QUIET=1 ALLOCSHIM_CONF=budget.device=40GiB,budget.spill=host,budget.migrate=auto "$N/bin/launch_rate" 1 400000 1 ;;
    heavy) ALLOCSHIM_TEST_GATE_HEAVY=1 LD_PRELOAD="$H/lib/liballocshim.so" ALLOCSHIM_QUIET=1 ALLOCSHIM_CONF=budget.device=40GiB,budget.spill=host,budget.migrate=auto "$N/bin/launch_rate" 1 400000 1 ;;
  esac
}
kinds=(native main light heavy)
for r in $(seq 1 "$ROUNDS"); do
  for j in 0 1 2 3; do k=${kinds[$(( (r + j) % 4 ))]}; timeout 60 bash -c "$(declare -f run); N=$N M=$M H=$H run $k" >>"$L/rate.$k.log" 2>&1; done
done
python3 - "$L" <<'PY' | tee "$OUT/table.txt"
import re, statistics, sys
L = sys.argv[1]
r = {k: [float(x) for x in re.findall(r"launches_per_s=(\d+)", open(f"{L}/rate.{k}.log").read())] for k in ("native", "main", "light", "heavy")}
n = statistics.median(r["native"])
for k in ("main", "light", "heavy"):
    pr = [b / a for a, b in zip(r["main"], r[k])]
    print(f"{k}: median {statistics.median(r[k]):.0f}/s = {statistics.median(r[k])/n:.3f}x native; per round vs main median {statistics.median(pr):.3f}, below main in {sum(x < 1 for x in pr)} of {len(pr)}")
for k in r: print(f"  {k}: " + " ".join("%.0f" % x for x in r[k]))
PY
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
