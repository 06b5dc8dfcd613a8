#!/bin/sh
# Pinning ahead ([backends.host] pin_ahead; docs/design/oversubscription.md, "Pinning ahead") on the GPU
# machine, every configuration interleaved over ROUNDS rounds (default 3):
#   1. A program that computes between allocations (pin_ahead_bench 4GiB 2GiB 4GiB 3000: 4 GiB
#      written and left alone, 2 GiB written and read by kernels for 3 s, then 4 GiB more): that
#      last allocation's time natively (no budget), and under a 7 GiB budget with migrate =
#      "auto" (it demotes 3 GiB of the cold set) with pin_ahead off and on; then the same with no
#      compute between them (pin_ahead has no time to work), and with no cold set (pin_ahead_bench
#      0 4GiB 4GiB 3000 under 6 GiB: nothing is colder than the newcomer, which is spilled).
#   2. Weights first (migrate_bench weights-first 8GiB 4GiB 20, 8 GiB budget, "auto"), pin_ahead off
#      and on: pinning ahead must not make it worse.
# Run by migrate_run.sh (bench.py's migrate section). Usage: pin_ahead_run.sh BUILD OUT [ROUNDS]
# Prints a table last (also appended to OUT/table.txt). Exit 0 when every run verified its data.
set -u
B=$1
OUT=$2
ROUNDS=${3:-3}
. "$(dirname "$0")/run_common.sh"
auto=budget.spill=host,budget.migrate=auto
one() {  # one NAME COLD HOT COMPUTE_MS [CONF]
  name=$1 cold=$2 hot=$3 ms=$4 conf=${5:-}
  if [ -n "$conf" ]; then
    under "$conf" "$OUT/pa.$name.stats.json" "$B/bin/pin_ahead_bench" "$cold" "$hot" 4GiB "$ms"
  else
    "$B/bin/pin_ahead_bench" "$cold" "$hot" 4GiB "$ms"
  fi >"$OUT/pa.$name.log" 2>&1 && grep -q "verify ok" "$OUT/pa.$name.log" || { note "pin_ahead_bench $name FAILED"; status=1; }
}
wf() {  # wf NAME CONF
  under "$2" "$OUT/wf.$1.stats.json" "$B/bin/migrate_bench" weights-first 8GiB 4GiB 20 >"$OUT/wf.$1.log" 2>&1 &&
    grep -q "verify ok" "$OUT/wf.$1.log" || { note "weights-first $1 FAILED"; status=1; }
}
r=1
while [ $r -le "$ROUNDS" ]; do
  one native.$r 4GiB 2GiB 3000
  one off.$r 4GiB 2GiB 3000 "budget.device=7GiB,$auto,backends.host.pin_ahead=false"
  one on.$r 4GiB 2GiB 3000 "budget.device=7GiB,$auto,backends.host.pin_ahead=true"
  one off0.$r 4GiB 2GiB 0 "budget.device=7GiB,$auto,backends.host.pin_ahead=false"
  one on0.$r 4GiB 2GiB 0 "budget.device=7GiB,$auto,backends.host.pin_ahead=true"
  one hotoff.$r 0 4GiB 3000 "budget.device=6GiB,$auto,backends.host.pin_ahead=false"
  one hoton.$r 0 4GiB 3000 "budget.device=6GiB,$auto,backends.host.pin_ahead=true"
  wf off.$r "budget.device=8GiB,$auto,backends.host.pin_ahead=false"
  wf on.$r "budget.device=8GiB,$auto,backends.host.pin_ahead=true"
  r=$((r + 1))
done
"$PY" - "$OUT" "$ROUNDS" <<'PYEOF' | tee -a "$OUT/table.txt"
import json, os, re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def field(path, key):
    try:
        m = re.search(key + r"=([0-9.]+)", open(path).read())
        return float(m.group(1)) if m else float("nan")
    except OSError:
        return float("nan")
def stats(path):
    try:
        return json.load(open(path))["budget"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return {}
def row(label, name, key, base=None):
    v = [field(os.path.join(out, f"pa.{name}.{r}.log"), key) for r in range(1, rounds + 1)]
    s = [stats(os.path.join(out, f"pa.{name}.{r}.stats.json")) for r in range(1, rounds + 1)]
    med = statistics.median(v)
    extra = ""
    if s and s[-1]:
        b = s[-1]
        extra = (f"demoted {b.get('demoted_bytes', 0) / 2**30:.2f} GiB, spilled {b.get('spilled_bytes', 0) / 2**30:.2f} GiB; "
                 f"host pieces pinned on the caller "
                 f"{b.get('reserve_misses', 0)}, from the pinner {b.get('ahead_used', 0)} "
                 f"(pinned ahead {b.get('ahead_pinned', 0)}, given back {b.get('ahead_returned', 0)})")
    ratio = f"{med / base:.2f}" if base else "-"
    print(f"| {label} | {', '.join(f'{x:.1f}' for x in v)} | {med:.1f} | {ratio} | {extra} |")
    return med
print(f"| pin_ahead_bench, the last allocation (4 GiB) | ms per round ({rounds} rounds) | median | / native | last round's stats |")
print("|---|---|---|---|---|")
nat = row("4 GiB cold, 2 GiB hot, 3 s compute: native (no budget)", "native", "alloc_ms")
for n, label in [("off", "7 GiB budget, auto, pin_ahead off"), ("on", "7 GiB budget, auto, pin_ahead on"),
                 ("off0", "the same, no compute, off"), ("on0", "the same, no compute, on"),
                 ("hotoff", "no cold set, 4 GiB hot, 6 GiB budget, off"), ("hoton", "no cold set, 4 GiB hot, 6 GiB budget, on")]:
    row(label, n, "alloc_ms", nat)
print()
print(f"| weights-first 8GiB 4GiB 20, 8 GiB budget, auto | hot GB/s per round | median | e2e ms per round | median e2e |")
print("|---|---|---|---|---|")
for n in ["off", "on"]:
    g = [field(os.path.join(out, f"wf.{n}.{r}.log"), "hot_gbps") for r in range(1, rounds + 1)]
    e = [field(os.path.join(out, f"wf.{n}.{r}.log"), "e2e_ms") for r in range(1, rounds + 1)]
    print(f"| pin_ahead {n} | {', '.join(f'{x:.0f}' for x in g)} | {statistics.median(g):.0f} | "
          f"{', '.join(f'{x:.0f}' for x in e)} | {statistics.median(e):.0f} |")
PYEOF
exit $status
