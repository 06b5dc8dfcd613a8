"""Per turn change of a long-turns run: when the previous turn ended, when moves started/ended
(trace aligned via the trace headers' CLOCK_MONOTONIC start), when the next turn's first pass ended."""
import json, glob, struct, subprocess, sys, os
d = sys.argv[1]
traces = sorted(glob.glob(f'{d}/auto.*.trace'))
starts = {}
for f in traces:
    b = open(f, 'rb').read(32)
    pid = struct.unpack_from('<I', b, 12)[0]; mono = struct.unpack_from('<Q', b, 16)[0]
    starts[pid] = mono / 1e9
base = min(starts.values())
ej = f'{d}/e.json'
if not os.path.exists(ej):
    subprocess.run(['/work/main/build/bin/allocshim', 'report', '-f', 'perfetto', '-o', ej] + traces, check=True)
ev = json.load(open(ej))
ev = ev['traceEvents'] if isinstance(ev, dict) else ev
pids = sorted(starts)
mig = sorted([(e['ts'] / 1e6 + base, e['dur'] / 1e6, pids.index(e['pid']), e['args']['from'][0] + '>' + e['args']['to'][0]) for e in ev if e['name'] == 'migration'])
frees = sorted([(e['ts'] / 1e6 + base, pids.index(e['pid'])) for e in ev if e['ph'] == 'e'])
turns = []
for i in (0, 1):
    by = {}
    for line in open(f'{d}/auto.timeline.{i}'):
        r, p, t = line.split(); by.setdefault(int(r), []).append((int(p), float(t)))
    for r, ps in by.items():
        ps.sort(); turns.append((ps[0][1], ps[-1][1], i, r, ps[1][1] - ps[0][1] if len(ps) > 1 else 0))
turns.sort()
prev = None
for first, last, i, r, p1 in turns:
    if prev:
        lo, hi = prev[1], first
        ms = [m for m in mig if lo - 0.3 < m[0] < hi]
        s = ' '.join(f'P{p}{k}:{sum(1 for m in ms if m[2]==p and m[3]==k)}' for p in (0, 1) for k in ('d>h', 'h>d') if any(m[2]==p and m[3]==k for m in ms))
        if ms:
            print(f'P{prev[2]}r{prev[3]}->P{i}r{r}: gap {first-lo:.3f}  moves {ms[0][0]-lo:+.3f}..{max(m[0]+m[1] for m in ms)-lo:+.3f} {s}  first pass end {first-lo:+.3f}, pass2 {p1*1000:.1f} ms')
        else:
            print(f'P{prev[2]}r{prev[3]}->P{i}r{r}: gap {first-lo:.3f} no moves')
        fr = [f for f in frees if lo - 0.3 < f[0] < hi]
        if fr: print('   frees', ' '.join(f'P{p}@{t-lo:+.3f}' for t, p in fr))
    else:
        ms = [m for m in mig if m[0] < last]
        print(f'P{i}r{r} first: start moves {[(round(m[0]-first,3)) for m in ms[:1]]} pass2 {p1*1000:.1f} ms')
    prev = (first, last, i, r)
