"""The first turn of one long-turns run (a directory of ab.sh's OUT, unpacked): how long each of
process 0's first passes took, then each move of a 64 MiB piece in order (pid, start and length
from `allocshim report -f perfetto` over the run's traces), to see the giver's copies slow down
while the taker computes.

    python3 first_turn.py RUN_DIR ALLOCSHIM [PASSES] [MOVES]
"""
import glob, json, subprocess, sys, tempfile

run, tool = sys.argv[1], sys.argv[2]
passes = int(sys.argv[3]) if len(sys.argv) > 3 else 24
moves = int(sys.argv[4]) if len(sys.argv) > 4 else 40
first = sorted((int(p), float(t)) for r, p, t in (l.split() for l in open(f'{run}/auto.timeline.0')) if r == '0')
prev = first[0][1]
for p, t in first[:passes]:
    print(f'pass {p:3d} at {t - first[0][1]:.3f} s: {(t - prev) * 1e3:.1f} ms')
    prev = t
with tempfile.NamedTemporaryFile(suffix='.json') as out:
    subprocess.run([tool, 'report', '-f', 'perfetto', '-o', out.name] + sorted(glob.glob(f'{run}/auto.*.trace')),
                   check=True, stdout=subprocess.DEVNULL)
    events = json.load(open(out.name))
events = events['traceEvents'] if isinstance(events, dict) else events
for e in sorted((e for e in events if e.get('name') == 'migration'), key=lambda e: e['ts'])[:moves]:
    a = e['args']
    print(f"pid {e['pid']} at {e['ts'] / 1e6:.3f} s: {a['from']}->{a['to']} {a['size'] >> 20} MiB in {e['dur'] / 1e3:.1f} ms")
