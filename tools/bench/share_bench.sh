#!/usr/bin/env bash
# Two processes sharing one 8 GiB device budget (share_bench.cu), as one Markdown report on stdout
# (tests/gpu/results/README.md lists the runs made on the GPU machine):
#
#   tools/bench/share_bench.sh [BUILD_DIR] [STATS_DIR] > report.md   (bench.py's share section)   (defaults: build, a temporary dir)
#
# First `share_bench --mode link` (no shim): the pinned copy rate each way and both at once. Then
# runs, each under `allocshim run` with budget.device=8GiB, spill=host, share=user:
#   sequential        the two processes one after the other (each fits: the reference);
#   shared, MIGRATE   both at once, turns alternating, 10 passes a turn (56 ms on an H100), for
#                     each migrate mode this build accepts (and auto without the host reserve,
#                     host_reserve 0);
#   long sequential, long shared, migrate auto
#                     the same sets with turns of SHARE_LONG_RATIO (default 20) times the time the
#                     link needs to move what a turn must move (2 x 6 - 8 = 4 GiB each way, both
#                     directions at once), SHARE_LONG_ROUNDS (default 2) turns each; the passes are
#                     computed from the link run and the sequential run's sweep rate (or
#                     SHARE_LONG_PASSES). `long shared, migrate off` only where SHARE_RUNS names it:
#                     it runs every pass partly from the host, ~10x the sequential time;
#   long shared, migrate auto, start apart / together
#                     the same with the start's split set (share_bench --start): process 1
#                     allocates once process 0 has filled its set, or both piece by piece in
#                     lockstep (each spills part of its set), rather than as the start order falls;
#   handoff, ...      process 0 holds its set idle while process 1 allocates its own (migrate off,
#                     auto, auto with share_wait_ms 3000).
# SHARE_ROUNDS=N (default 1) repeats the runs other than the hand-offs N times, each round in an
# order rotated by one (interleaved; the ratios pair runs with the sequential run of their round).
# SHARE_RUNS=REGEX runs only the labels it matches (extended regex, e.g. '^(long )?(sequential|shared, migrate (off|auto))$').
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
budget_gib=8 hot_gib=6 procs=2
rounds=${SHARE_ROUNDS:-1}
long_ratio=${SHARE_LONG_RATIO:-20}
long_rounds=${SHARE_LONG_ROUNDS:-2}
long_passes=${SHARE_LONG_PASSES:-}
filter=${SHARE_RUNS:-}
# Bytes a turn change must move each way: the active set minus the room the other's set leaves.
move_gib=$((2 * hot_gib - budget_gib))

echo "# Two processes, one shared 8 GiB budget: 6 GiB hot each, alternating"
echo
echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'), host $(uname -n)"
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
fi
# The shim's own build commit: the tree this script runs from may be a copy without git history.
echo "- shim: $("$allocshim" --version 2>/dev/null || echo unknown)"
echo "- command: tools/bench/share_bench.sh (allocshim run --conf ${conf}[,budget.migrate=M] -- share_bench --mode MODE [--rounds R --passes P])"
echo "- SHARE_ROUNDS=$rounds SHARE_LONG_RATIO=$long_ratio SHARE_LONG_ROUNDS=$long_rounds SHARE_LONG_PASSES=${long_passes:-computed} SHARE_RUNS=${filter:-all}"

echo
echo "## link (no shim)"
echo
echo '```'
link_out=$("$bench" --mode link 2>&1)
link_rc=$?
echo "$link_out"
echo '```'
[ "$link_rc" = 77 ] && exit 77
# Both directions at once: what a turn change can reach moving out and in together.
link_both=$(echo "$link_out" | sed -n 's/.*both at once \([0-9.]*\) GB\/s.*/\1/p')
# Seconds the link needs per turn change (0: not measured).
t_move=$(awk -v g="$move_gib" -v r="${link_both:-0}" 'BEGIN { if (r > 0) printf "%.4f", g * 2^30 / (r * 1e9); else print 0 }')

status=0
declare -A total turns
run() {
  local label=$1 extra=$2 mode=$3 args=$4
  if [ -n "$filter" ]; then
    echo "${label%, round *}" | grep -Eq -- "$filter" || return 0
  elif [ "${label%, round *}" = "long shared, migrate off" ]; then
    return 0
  fi
  echo
  echo "## $label"
  echo
  [ -n "$args" ] && { echo "share_bench $args"; echo; }
  echo '```'
  local out
  # shellcheck disable=SC2086  # args is a list of options
  out=$(ALLOCSHIM_STATS="$stats/${label// /_}-%p.json" "$allocshim" run --conf "$conf$extra" -- "$bench" --mode "$mode" $args 2>&1)
  local rc=$?
  echo "$out" | grep -v -e '^allocations:' -e '^frees:'
  echo '```'
  [ "$rc" = 77 ] && exit 77
  [ "$rc" = 0 ] || status=1
  total[$label]=$(echo "$out" | sed -n 's/^share_bench .*: \([0-9.]*\) s total.*/\1/p')
  turns[$label]=$(echo "$out" | sed -n 's/^share_bench .*, turns \([0-9.]*\) s.*/\1/p')
  # The device's sweep rate, read+write GB/s, from the runs that fit.
  if [ "$mode" = sequential ] && [ -z "${sweep:-}" ]; then
    sweep=$(echo "$out" | sed -n 's/^proc .* round .*, \([0-9.]*\) GB\/s (read+write)/\1/p' | sort -n |
      awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }')
  fi
}
accepts() { ALLOCSHIM_CONF="$conf$1" "$allocshim" check >/dev/null 2>&1; }

# The runs a round makes, "label|extra|mode|args"; the long ones (LONG, then any options of their
# own) get their rounds and passes once the passes are known.
list=("sequential||sequential|")
for m in off promote auto; do
  # Only the modes this build's policy accepts.
  accepts ",budget.migrate=$m" && list+=("shared, migrate $m|,budget.migrate=$m|shared|")
done
accepts ",budget.migrate=auto,backends.host.host_reserve=0" &&
  list+=("shared, migrate auto, host_reserve 0|,budget.migrate=auto,backends.host.host_reserve=0|shared|")
list+=("long sequential||sequential|LONG")
for m in auto off; do
  accepts ",budget.migrate=$m" && list+=("long shared, migrate $m|,budget.migrate=$m|shared|LONG")
done
if accepts ",budget.migrate=auto"; then
  for start in apart together; do
    list+=("long shared, migrate auto, start $start|,budget.migrate=auto|shared|LONG --start $start")
  done
fi
# Sets long_passes once: ratio x the move's seconds / one pass's seconds (a pass reads and writes
# the set), from the link run and the first sequential run's sweep rate.
set_long_passes() {
  [ -n "$long_passes" ] && return
  long_passes=$(awk -v k="$long_ratio" -v t="$t_move" -v s="${sweep:-0}" -v h="$hot_gib" \
    'BEGIN { if (t > 0 && s > 0) { p = k * t / (2 * h * 2^30 / (s * 1e9)); printf "%d", p == int(p) ? p : int(p) + 1 } }')
  if [ -z "$long_passes" ]; then
    long_passes=600
    echo
    echo "(no link or sweep rate measured: long turns use $long_passes passes)"
  fi
}
for ((r = 1; r <= rounds; r++)); do
  n=${#list[@]}
  for ((i = 0; i < n; i++)); do
    IFS='|' read -r label extra mode args <<<"${list[$(((i + r - 1) % n))]}"
    [ "$r" -gt 1 ] && label="$label, round $r"
    if [ "${args%% *}" = LONG ]; then
      set_long_passes
      args="--rounds $long_rounds --passes $long_passes${args#LONG}"
    fi
    run "$label" "$extra" "$mode" "$args"
  done
done
# A request for room answered by demotion: process 0 holds 6 GiB idle, then process 1 allocates
# 6 GiB (share_wait_ms 200, the default, then 3000: demoting 4 GiB pins 4 GiB of host memory).
for extra in ",budget.migrate=off" ",budget.migrate=auto" ",budget.migrate=auto,budget.share_wait_ms=3000"; do
  accepts "$extra" || continue
  run "handoff$(echo "$extra" | sed 's/,budget\./, /g; s/=/ /g')" "$extra" handoff ""
done
echo
echo "Turns: sequential, each process's first turn's start to its last turn's end, summed; shared,"
echo "from when both had filled their sets to the last turn's end, plus the turns run before that:"
echo "without the process starts, the first fill and the final check."
echo "Bound: the turns' ratio if every turn change moved $move_gib GiB each way at the link's rate"
echo "both ways at once (${link_both:-?} GB/s: ${t_move} s) and nothing else were lost."
echo
echo "| run | total s | sequential / run | turns s | sequential / run, turns | bound, turns |"
echo "|---|---|---|---|---|---|"
for ((r = 1; r <= rounds; r++)); do
  suffix=
  [ "$r" -gt 1 ] && suffix=", round $r"
  for entry in "${list[@]}"; do
    base=${entry%%|*}
    label=$base$suffix
    t=${total[$label]:-}
    [ -n "$t" ] || continue
    case $base in long*) ref="long sequential$suffix"; nr=$long_rounds ;; *) ref="sequential$suffix"; nr=3 ;; esac
    u=${turns[$label]:-}
    awk -v l="$label" -v t="$t" -v a="${total[$ref]:-0}" -v u="${u:-0}" -v b="${turns[$ref]:-0}" \
      -v m="$t_move" -v c=$((procs * nr - 1)) -v shared="$([ "$base" != "${base#*shared}" ] && echo 1 || echo 0)" \
      'BEGIN {
        r = (t > 0 && a > 0) ? sprintf("%.2f", a / t) : "";
        ru = (u > 0 && b > 0) ? sprintf("%.2f", b / u) : "";
        bd = (shared && b > 0 && m > 0) ? sprintf("%.2f", b / (b + c * m)) : "";
        printf "| %s | %s | %s | %s | %s | %s |\n", l, t, r, (u > 0 ? u : ""), ru, bd }'
  done
done
# What moved between the processes (each worker's stats file; the parent never used CUDA).
if command -v python3 >/dev/null 2>&1; then
  echo
  echo "| run | process | spilled GiB | demoted GiB | promoted GiB | reserve hits / misses | asked by the other | gave GiB | waited (ms) | timeouts |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  python3 - "$stats" <<'EOF'
import glob, json, os, sys
names = []
for p in ("shared*.json", "long_shared*.json", "handoff*.json"):
    names += glob.glob(os.path.join(sys.argv[1], p))
for f in sorted(names):
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
