"""Each turn of a timeline.sh run, from turn_detail.py's listing: the gap since the previous
turn's last pass and the time from its first pass to its last (sequential: 1.92 s on the H100).

    python3 turns.py DETAIL.txt   # DETAIL.txt: takeover-h100-2026-11-27/turn_detail.py's output
"""
import re, sys
turns = {}
for line in open(sys.argv[1]):
    m = re.match(r'\s*(-?[\d.]+) (P\d) r(\d) p(\d+)', line)
    if m:
        t = float(m.group(1))
        span = turns.setdefault((m.group(2), int(m.group(3))), [t, t])
        span[0], span[1] = min(span[0], t), max(span[1], t)
prev = None
out = []
for (proc, rnd), (start, end) in sorted(turns.items(), key=lambda kv: kv[1][0]):
    out.append(f"{proc}r{rnd} {start - prev if prev is not None else 0:.2f}+{end - start:.2f}")
    prev = end
print(' | '.join(out))
