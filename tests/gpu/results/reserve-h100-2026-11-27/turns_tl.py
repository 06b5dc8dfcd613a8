"""Each turn of every long-turns run under DIR (ab.sh's OUT, unpacked), from the passes' timelines
alone: the gap since the previous turn's last pass to this turn's first pass end, plus the turn's
passes (sequential: 1.92 s on the H100); then the run's turns, what each process spilled as it
allocated, and its host pieces reused / pinned anew.

    python3 turns_tl.py DIR
"""
import glob, os, re, sys

for d in sorted(glob.glob(sys.argv[1] + '/long-*')):
    turns = []
    for i in (0, 1):
        by_round = {}
        for line in open(f'{d}/auto.timeline.{i}'):
            r, p, t = line.split()
            by_round.setdefault(int(r), []).append((int(p), float(t)))
        for r, passes in by_round.items():
            passes.sort()
            turns.append((passes[0][1], passes[-1][1], i, r))
    turns.sort()
    out, prev = [], None
    for first, last, i, r in turns:
        out.append(f"P{i}r{r} {first - prev if prev else 0:.2f}+{last - first:.2f}")
        prev = last
    log = open(f'{d}/auto.log').read()
    spilled = re.findall(r'spilled \d+ allocations, ([\d.]+ \w+) to host', log)
    pins = re.findall(r'(\d+) host pieces reused, (\d+) pinned anew', log)
    total = re.search(r'turns ([\d.]+) s', log).group(1)
    print(os.path.basename(d), total, ' | '.join(out), 'spilled', spilled, 'pins', pins)
