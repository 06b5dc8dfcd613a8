#!/bin/sh
# Long turns of share_bench with each process's pass times (--timeline) and a trace of its moves
# (no stacks), to line up a turn change's passes with the moves: timeline.sh BUILD OUT [PASSES] [CONF+]
# (NO_SEQ=1: the shared run only; SHARE_START=together|apart: share_bench --start, for the shared run)
b=$1 out=$2 passes=${3:-342} extra=${4:-}
mkdir -p "$out"
conf=budget.device=8GiB,budget.spill=host,budget.share=user
run() {  # label mode extra-conf share_bench-args
  ALLOCSHIM_TRACE_STACKS=off "$b/bin/allocshim" run --conf "$conf$3" --trace "$out/$1.%p.trace" \
    --stats "$out/$1.%p.stats.json" -- "$b/bin/share_bench" --mode "$2" --rounds 3 --passes "$passes" \
    --timeline "$out/$1.timeline" $4 > "$out/$1.log" 2>&1
  echo "$1: rc=$? $(tail -1 "$out/$1.log")"
}
[ -n "${NO_SEQ:-}" ] || run seq sequential "" ""
run auto shared ",budget.migrate=auto$extra" "${SHARE_START:+--start $SHARE_START}"
