#!/bin/bash
# Third GPU run for the mig helper: the landed code (6efa536) once: sequential, alternating and
# hand-off under migrate = auto; one log with each worker's stats.
cd "$(dirname "$0")"
conf=budget.device=8GiB,budget.spill=host,budget.share=user,budget.migrate=auto
log=$OUT/run3.log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $log
for m in sequential shared handoff; do
  echo "== $m" >> $log
  ALLOCSHIM_STATS=/tmp/s-%p.json new/bin/allocshim run --conf $conf -- new/bin/share_bench --mode $m >> $log 2>&1
  for f in /tmp/s-*.json; do python3 -c "
import json,sys; j=json.load(open(sys.argv[1])); b=(j.get('budget') or [{}])[0]; n=((j.get('node') or {}).get('devices') or [{}])[0]
if b.get('limit'): print('stats: demoted %.2f GiB promoted %.2f GiB migrate %.0f ms reserve %s/%s asks %s asked-by %s gave %.2f GiB waited %.0f ms timeouts %s' % (b['demoted_bytes']/2**30, b['promoted_bytes']/2**30, b['migrate_ns']/1e6, b.get('reserve_hits'), b.get('reserve_misses'), n.get('asks'), n.get('requests'), n.get('given_bytes',0)/2**30, n.get('wait_ns',0)/1e6, n.get('timeouts')))
" $f >> $log; rm -f $f; done
done
grep -E '^==|total|sweeps in|round|stats' $log
