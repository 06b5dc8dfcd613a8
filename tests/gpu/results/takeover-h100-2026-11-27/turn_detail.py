"""Every move of a timeline.sh run next to each pass's end, one line each, by time.

    cd OUT; for t in auto.*.trace; do allocshim report -f perfetto -o ${t%.trace}.json $t; done
    python3 turn_detail.py OUT auto PID0 PID1 > detail.txt   # PIDs of process 0 and 1

Times are seconds from process 0's first pass end. A pass line shows round, pass and how long
the pass took (only the first and last four passes of a turn, and any over 8 ms); a move line
shows its direction (PROM: to the device), size and duration: the trace records each move when it
ends, with the time it took; the line is at its start (allocshim report's Perfetto slices).
"""
import json, struct, sys
d, label, p0, p1 = sys.argv[1:5]
def load(pid, idx):
    start = struct.unpack_from('<Q', open(f'{d}/{label}.{pid}.trace', 'rb').read(), 16)[0] / 1e9
    ev = json.load(open(f'{d}/{label}.{pid}.json'))['traceEvents']
    mig = [(start + e['ts'] / 1e6, e.get('dur', 0) / 1e6, e['args']['size'], e['args']['to'])
           for e in ev if e.get('name') == 'migration']
    tl = [tuple(map(float, l.split())) for l in open(f'{d}/{label}.timeline.{idx}')]
    return mig, tl
data = [load(p, i) for i, p in enumerate([p0, p1])]
t0 = min(tl[0][2] for _, tl in data)
ev = []
for i, (mig, tl) in enumerate(data):
    last = max(int(p) for _, p, _ in tl)
    prev = None
    for r, p, t in tl:
        took = (t - prev) * 1e3 if prev is not None and p > 0 else None
        if p < 4 or p > last - 4 or took is None or took > 8:
            ev.append((t - t0, f'P{i} r{int(r)} p{int(p)} ' + (f'{took:.1f}ms' if took is not None else '')))
        prev = t
    for t, dur, sz, to in mig:
        ev.append((t - t0, f'P{i}            {"PROM" if to == "device" else "dem "} {sz >> 20}MiB {dur * 1e3:.2f}ms'))
for t, s in sorted(ev):
    print(f'{t:8.3f} {s}')
