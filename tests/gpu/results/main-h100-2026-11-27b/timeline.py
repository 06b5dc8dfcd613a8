"""Lines up a timeline.sh run's passes with the moves its traces recorded.

    cd OUT; for t in auto.*.trace; do allocshim report -f perfetto -o ${t%.trace}.json $t; done
    python3 timeline.py auto PID0 PID1      # PIDs of process 0 and 1 (the traces' names)

Prints each process's rounds (when its passes ended, how many took over 8 ms and how long they
took together), then the MiB each process demoted and promoted in each 250 ms window. Times are
seconds from 2 s before the first pass ended (CLOCK_MONOTONIC, the traces' and --timeline's clock).
"""
import json, struct, sys, collections
def load(label, pid, idx):
    start = struct.unpack_from('<Q', open(f'{label}.{pid}.trace','rb').read(), 16)[0] / 1e9
    ev = json.load(open(f'{label}.{pid}.json'))['traceEvents']
    mig = [(start + e['ts']/1e6, e['args']['size'], e['args']['to']) for e in ev if e.get('name') == 'migration']
    tl = [tuple(map(float, l.split())) for l in open(f'{label}.timeline.{idx}')]
    return mig, tl
label = sys.argv[1]; pids = sys.argv[2:4]
data = [load(label, p, i) for i, p in enumerate(pids)]
t0 = min(tl[0][2] for _, tl in data) - 2.0
# per process: turns (rounds) with start/end, pass durations; moves binned per 100 ms
for i, (mig, tl) in enumerate(data):
    rounds = collections.defaultdict(list)
    for r, p, t in tl: rounds[int(r)].append(t - t0)
    for r, ts in rounds.items():
        d = [b - a for a, b in zip(ts, ts[1:])]
        slow = sum(1 for x in d if x > 0.008)
        print(f'proc {i} round {r}: passes end {ts[0]:.3f}..{ts[-1]:.3f}  slow passes(>8ms) {slow}, time in slow {sum(x for x in d if x>0.008):.2f}s; first slow..last slow ' +
              (f'{ts[[j for j,x in enumerate(d) if x>0.008][0]]:.2f}..{ts[[j for j,x in enumerate(d) if x>0.008][-1]+1]:.2f}' if slow else ''))
# moves per 250 ms window per process/direction
win = 0.25
b = collections.defaultdict(lambda: [0,0,0,0])
for i, (mig, tl) in enumerate(data):
    for t, sz, to in mig:
        k = int((t - t0) / win)
        b[k][i*2 + (to == 'device')] += sz
print('window(s)  p0 demote  p0 promote  p1 demote  p1 promote  (MiB)')
for k in sorted(b):
    v = b[k]
    print(f'{k*win:6.2f}  ' + '  '.join(f'{x/2**20:9.0f}' for x in v))
