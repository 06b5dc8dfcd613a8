#!/usr/bin/env bash
# Two processes sharing one 8 GiB device budget (share_bench.cu), as one Markdown report on stdout
# (tests/gpu/results/README.md lists the runs made on the GPU machine):
#
#   tools/bench/share_bench.sh [BUILD_DIR] [STATS_DIR] > report.md   (bench.py's share section)   (defaults: build, a temporary dir)
#
# Runs, each under `allocshim run` with budget.device=8GiB, spill=host, share=user:
#   sequential        the two processes one after the other (each fits: the reference);
#   shared, MIGRATE   both at once, turns alternating, for each migrate mode this build accepts
#                     (and auto without the host reserve, host_reserve 0);
#   handoff, ...      process 0 holds its set idle while process 1 allocates its own (migrate off,
#                     auto, auto with share_wait_ms 3000).
# Each run's per-process stats files (ALLOCSHIM_STATS) go to STATS_DIR. Exit: 0, 1 if a run failed
# or a process found bad words, 77 without a GPU.
set -u
build=$(cd "${1:-build}" && pwd) || exit 2
stats=${2:-}
cleanup=
if [ -z "$stats" ]; then
  stats=$(mktemp -d)
  cleanup=$stats
fi
mkdir -p "$stats"
bench=$build/bin/share_bench
allocshim=$build/bin/allocshim
for f in "$bench" "$allocshim"; do
  [ -x "$f" ] || { echo "share_bench.sh: $f not built" >&2; exit 2; }
done
conf=budget.device=8GiB,budget.spill=host,budget.share=user

echo "# Two processes, one shared 8 GiB budget: 6 GiB hot each, alternating"
echo
echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'), host $(uname -n)"
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
fi
# The shim's own build commit: the tree this script runs from may be a copy without git history.
echo "- shim: $("$allocshim" --version 2>/dev/null || echo unknown)"
echo "- command: tools/bench/share_bench.sh (allocshim run --conf $conf[,budget.migrate=M] -- share_bench --mode MODE)"
status=0
declare -A total
run() {
  local label=$1 extra=$2 mode=$3
  echo
  echo "## $label"
  echo
  echo '```'
  local out
  out=$(ALLOCSHIM_STATS="$stats/${label// /_}-%p.json" "$allocshim" run --conf "$conf$extra" -- "$bench" --mode "$mode" 2>&1)
  local rc=$?
  echo "$out" | grep -v -e '^allocations:' -e '^frees:'
  echo '```'
  [ "$rc" = 77 ] && exit 77
  [ "$rc" = 0 ] || status=1
  total[$label]=$(echo "$out" | sed -n 's/^share_bench .*: \([0-9.]*\) s total.*/\1/p')
}
run "sequential" "" sequential
for m in off promote auto; do
  # Only the modes this build's policy accepts.
  ALLOCSHIM_CONF="$conf,budget.migrate=$m" "$allocshim" check >/dev/null 2>&1 || continue
  run "shared, migrate $m" ",budget.migrate=$m" shared
done
if ALLOCSHIM_CONF="$conf,budget.migrate=auto,budget.host_reserve=0" "$allocshim" check >/dev/null 2>&1; then
  run "shared, migrate auto, host_reserve 0" ",budget.migrate=auto,budget.host_reserve=0" shared
fi
# A request for room answered by demotion: process 0 holds 6 GiB idle, then process 1 allocates
# 6 GiB (share_wait_ms 200, the default, then 3000: demoting 4 GiB pins 4 GiB of host memory).
for extra in ",budget.migrate=off" ",budget.migrate=auto" ",budget.migrate=auto,budget.share_wait_ms=3000"; do
  ALLOCSHIM_CONF="$conf$extra" "$allocshim" check >/dev/null 2>&1 || continue
  run "handoff$(echo "$extra" | sed 's/,budget\./, /g; s/=/ /g')" "$extra" handoff
done
echo
echo "| run | total s | sequential / run |"
echo "|---|---|---|"
for label in "sequential" "shared, migrate off" "shared, migrate promote" "shared, migrate auto" \
  "shared, migrate auto, host_reserve 0"; do
  t=${total[$label]:-}
  [ -n "$t" ] || continue
  echo "| $label | $t | $(awk -v a="${total[sequential]:-0}" -v b="$t" 'BEGIN { if (b > 0) printf "%.2f", a / b }') |"
done
# What moved between the processes (each worker's stats file; the parent never used CUDA).
if command -v python3 >/dev/null 2>&1; then
  echo
  echo "| run | process | spilled GiB | demoted GiB | promoted GiB | reserve hits / misses | asked by the other | gave GiB | waited (ms) | timeouts |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  python3 - "$stats" <<'EOF'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "shared*.json")) + glob.glob(os.path.join(sys.argv[1], "handoff*.json"))):
    try:
        j = json.load(open(f))
    except ValueError:
        continue
    b = (j.get("budget") or [{}])[0]
    n = ((j.get("node") or {}).get("devices") or [{}])[0]
    if not b.get("limit"):
        continue  # the parent: no CUDA, no budget
    run = os.path.basename(f).rsplit("-", 1)[0].replace("_", " ")
    print(f"| {run} | {os.path.basename(f).rsplit('-', 1)[1][:-5]} | {b.get('spilled_bytes', 0) / 2**30:.2f} | "
          f"{b.get('demoted_bytes', 0) / 2**30:.2f} | "
          f"{b.get('promoted_bytes', 0) / 2**30:.2f} | {b.get('reserve_hits', 0)} / {b.get('reserve_misses', 0)} | "
          f"{n.get('requests', 0)} | {n.get('given_bytes', 0) / 2**30:.2f} | "
          f"{n.get('wait_ns', 0) / 1e6:.0f} | {n.get('timeouts', 0)} |")
EOF
fi
[ -n "$cleanup" ] && rm -rf "$cleanup"
exit $status
