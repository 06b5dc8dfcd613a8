#!/usr/bin/env python3
"""The summary of tools/bench/sync_bench.sh: reads the logs in OUT and prints markdown tables.

    sync_summary.py OUT
"""
import glob
import hashlib
import json
import os
import re
import sys

o = sys.argv[1]
rc = dict(l.split(" rc=") for l in open(os.path.join(o, "rc.txt")).read().split("\n") if " rc=" in l)
print("GPU:", open(os.path.join(o, "gpu.txt")).read().strip())
bad = [k for k, v in rc.items() if v.strip() not in ("0",) and not (k.startswith("race.") and ".none" in k)]
print("runs failed:", bad or "none")

def churn(tag):
    rows = {}
    for f in sorted(glob.glob(os.path.join(o, f"churn{tag}.*.log"))):
        cfg = os.path.basename(f)[len(f"churn{tag}."):-4].rsplit(".", 1)[0]
        if tag == "" and cfg.startswith("nb."):
            continue
        for l in open(f):
            if l.startswith('{"bench":"kernel_churn"'):
                j = json.loads(l)
                rows.setdefault(cfg, {}).setdefault(j["threads"], []).append(j["us_per_iteration"])
    return rows
for tag, name in (("", "blocking streams"), (".nb", "non-blocking streams")):
    rows = churn(tag)
    if not rows:
        continue
    threads = sorted({t for r in rows.values() for t in r})
    print(f"\nkernel_churn, {name}: us per iteration (each run, rounds interleaved)")
    print("| config | " + " | ".join(f"{t} thr" for t in threads) + " | 16 thr / vmm_device |")
    print("|---|" + "---|" * (len(threads) + 1))
    dev16 = min(rows.get("vmm_device", {}).get(16, [0]) or [0])
    for cfg, r in rows.items():
        cells = [" / ".join(f"{v:.0f}" for v in r.get(t, [])) for t in threads]
        ratio = f"{min(r[16]) / dev16:.2f}x" if 16 in r and dev16 else "-"
        print(f"| {cfg} | " + " | ".join(cells) + f" | {ratio} |")

print("\nreuse_race (exit 0: no corruption, 3: corrupted)")
for k in sorted(k for k in rc if k.startswith("race.")):
    log = open(os.path.join(o, k + ".log")).read()
    m = re.findall(r"^summary: .*$", log, re.M)
    print(f"| {k} | exit {rc[k].strip()} | {m[-1] if m else (log.strip().splitlines() or [''])[-1]} |")

tr = {}
for f in sorted(glob.glob(os.path.join(o, "torch.*.log"))):
    cfg, rep = os.path.basename(f)[6:-4].rsplit(".", 1)
    text = open(f).read()
    sec = re.findall(r"train_seconds: ([0-9.]+)", text)
    losses = hashlib.sha256("\n".join(l for l in text.splitlines()
                                      if re.match(r"^(step \d+:|parameter checksum:)", l)).encode()).hexdigest()[:12]
    stats = os.path.join(o, f"torch.{cfg}.{rep}.stats.json")
    allocs = "-"
    if os.path.exists(stats):
        j = json.load(open(stats))
        allocs = {b.get("kind"): sum(int(d.get("allocs", 0)) for d in b.get("devices", []))
                  for b in j.get("backends", [])}
    tr.setdefault(cfg, []).append((float(sec[-1]) if sec else None, losses, allocs))
if tr:
    base = min(s for s, _, _ in tr.get("caching", [(None, 0, 0)]) if s) if tr.get("caching") else None
    steps = int(os.environ.get("TORCH_STEPS", "200")) - 10  # torch_train.py's default warm-up
    print(f"\nPyTorch loop, {steps} timed steps: us per step (each run), best ratio to the caching allocator, losses hash")
    for cfg, v in tr.items():
        secs = [s for s, _, _ in v if s]
        us = " / ".join(f"{s / steps * 1e6:.0f}" for s in secs)
        ratio = f"{min(secs) / base:.3f}x" if base and secs else "-"
        allocs = next((a for _, _, a in v if a != "-"), "-")
        print(f"| {cfg} | {us} | {ratio} | {' '.join(sorted({h for _, h, _ in v}))} | allocs {allocs} |")
