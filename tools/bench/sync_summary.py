#!/usr/bin/env python3
"""The summary of tools/bench/sync_bench.sh: reads the logs in OUT and prints markdown tables.

    sync_summary.py OUT

Each configuration ran once per round, rounds interleaved; the host's speed changes from one
process to the next, so every ratio is given two ways: median over median, and the median of the
per-round ratios (each run against the reference run of its own round), with their range.
"""
import glob
import hashlib
import json
import os
import re
import statistics
import sys

o = sys.argv[1]
rc = dict(l.split(" rc=") for l in open(os.path.join(o, "rc.txt")).read().split("\n") if " rc=" in l)
print("GPU:", open(os.path.join(o, "gpu.txt")).read().strip())
bad = [k for k, v in rc.items() if v.strip() not in ("0",) and not (k.startswith("race.") and ".none" in k)]
print("runs failed:", bad or "none")


def ratios(runs, ref):
    """runs, ref: {round: value}. Median ratio, its range, median over median."""
    per = sorted(runs[r] / ref[r] for r in runs if r in ref and ref[r])
    if not per:
        return "-"
    mm = statistics.median(runs.values()) / statistics.median(ref.values())
    return f"{mm:.2f}x | {statistics.median(per):.2f}x ({per[0]:.2f}-{per[-1]:.2f})"


def sync_counters(path):
    """The free_sync counters and peak reserved bytes of a run's statistics file."""
    if not os.path.exists(path):
        return None
    try:
        j = json.load(open(path))
    except ValueError:
        return None
    for b in j.get("backends", []):
        if b.get("kind") in ("vmm", "async_pool"):
            for d in b.get("devices", []):
                return d.get("frees", 0), d.get("free_sync", {}), d.get("peak_reserved", 0)
    return None


def churn(tag):
    rows = {}  # config -> threads -> {round: us}
    for f in sorted(glob.glob(os.path.join(o, f"churn{tag}.*.log"))):
        cfg, rnd = os.path.basename(f)[len(f"churn{tag}."):-4].rsplit(".", 1)
        if tag == "" and cfg.startswith("nb."):
            continue
        for l in open(f):
            if l.startswith('{"bench":"kernel_churn"'):
                j = json.loads(l)
                rows.setdefault(cfg, {}).setdefault(j["threads"], {})[rnd] = j["us_per_iteration"]
    return rows


for tag, name in (("", "blocking streams"), (".nb", "non-blocking streams")):
    rows = churn(tag)
    if not rows:
        continue
    threads = sorted({t for r in rows.values() for t in r})
    top = threads[-1]
    ref = rows.get("vmm_device", {}).get(top, {})
    print(f"\nkernel_churn, {name}: us per iteration, each round in order; median; ratio to vmm_device at {top} threads")
    print("| config | " + " | ".join(f"{t} thr" for t in threads) +
          f" | median {top} thr | median/median | median of per-round ratios (range) |")
    print("|---|" + "---|" * (len(threads) + 3))
    for cfg, r in sorted(rows.items()):
        cells = [" / ".join(f"{r[t][k]:.0f}" for k in sorted(r[t])) if t in r else "-" for t in threads]
        med = f"{statistics.median(r[top].values()):.0f}" if top in r else "-"
        print(f"| {cfg} | " + " | ".join(cells) + f" | {med} | {ratios(r.get(top, {}), ref) if ref else '- | -'} |")
    # Where the time of `barrier` goes: the counters of each run's statistics.
    lines = []
    for cfg in sorted(rows):
        agg = {}
        for f in sorted(glob.glob(os.path.join(o, f"churn{tag}.{cfg}.*.stats.json"))):
            c = sync_counters(f)
            if c is None:
                continue
            frees, fs, peak = c
            agg.setdefault("frees", []).append(frees)
            agg.setdefault("peak", []).append(peak)
            for k, v in fs.items():
                agg.setdefault(k, []).append(v)
        if "epochs" not in agg:
            continue
        med = {k: statistics.median(v) for k, v in agg.items()}
        per_free = lambda k: med.get(k, 0) / med["frees"] if med["frees"] else 0
        lines.append(f"| {cfg} | {med['frees']:.0f} | {med['epochs']:.0f} | {med.get('shortage_closes', 0):.0f} | "
                     f"{med.get('kept_open', 0):.0f} | {per_free('events'):.2f} | {per_free('stream_queries'):.2f} | "
                     f"{med.get('close_ns', 0) / 1e6:.1f} | {med.get('drains', 0):.0f} | {med['peak'] / 2**20:.0f} |")
    if lines:
        print(f"\nfree_sync counters, {name} (median over rounds; frees of every thread count run)")
        print("| config | frees | epochs | closed at a shortage | shortages kept open | events/free | "
              "stream queries/free | ms closing | drains | peak reserved MiB |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        print("\n".join(lines))

print("\nreuse_race (exit 0: no corruption, 3: corrupted)")
for k in sorted(k for k in rc if k.startswith("race.")):
    log = open(os.path.join(o, k + ".log")).read()
    m = re.findall(r"^summary: .*$", log, re.M)
    print(f"| {k} | exit {rc[k].strip()} | {m[-1] if m else (log.strip().splitlines() or [''])[-1]} |")

tr = {}  # config -> round -> (seconds, losses hash, allocations by backend, peak reserved)
for f in sorted(glob.glob(os.path.join(o, "torch.*.log"))):
    cfg, rnd = os.path.basename(f)[6:-4].rsplit(".", 1)
    text = open(f).read()
    sec = re.findall(r"train_seconds: ([0-9.]+)", text)
    losses = hashlib.sha256("\n".join(l for l in text.splitlines()
                                      if re.match(r"^(step \d+:|parameter checksum:)", l)).encode()).hexdigest()[:12]
    stats = os.path.join(o, f"torch.{cfg}.{rnd}.stats.json")
    allocs = "-"
    if os.path.exists(stats):
        j = json.load(open(stats))
        allocs = {b.get("kind"): sum(int(d.get("allocs", 0)) for d in b.get("devices", []))
                  for b in j.get("backends", [])}
    if sec:
        tr.setdefault(cfg, {})[rnd] = (float(sec[-1]), losses, allocs)
if tr:
    steps = int(os.environ.get("TORCH_STEPS", "200")) - 10  # torch_train.py's default warm-up
    ref = {r: v[0] for r, v in tr.get("caching", {}).items()}
    print(f"\nPyTorch loop, {steps} timed steps: us per step, each round in order; median; ratio to the caching "
          "allocator; losses hash")
    print("| config | us per step | median | median/median | median of per-round ratios (range) | losses | allocations |")
    print("|---|---|---|---|---|---|---|")
    for cfg, v in tr.items():
        secs = {r: s for r, (s, _, _) in v.items()}
        us = " / ".join(f"{secs[r] / steps * 1e6:.0f}" for r in sorted(secs))
        med = statistics.median(secs.values()) / steps * 1e6
        allocs = next((a for _, _, a in v.values() if a != "-"), "-")
        hashes = " ".join(sorted({h for _, h, _ in v.values()}))
        print(f"| {cfg} | {us} | {med:.0f} | {ratios(secs, ref) if ref else '- | -'} | {hashes} | {allocs} |")
    # What the shim did in those runs (medians): peak reserved, misses (new memory mapped), and
    # for `barrier` its epochs and the time spent recording them.
    lines = []
    for cfg in tr:
        agg = {}
        for f in sorted(glob.glob(os.path.join(o, f"torch.{cfg}.*.stats.json"))):
            j = json.load(open(f))
            for b in j.get("backends", []):
                if b.get("kind") != "vmm":
                    continue
                for d in b.get("devices", []):
                    for k in ("frees", "misses", "peak_reserved"):
                        agg.setdefault(k, []).append(d.get(k, 0))
                    for k, v in d.get("free_sync", {}).items():
                        agg.setdefault(k, []).append(v)
        if agg:
            med = {k: statistics.median(v) for k, v in agg.items()}
            lines.append(f"| {cfg} | {med['frees']:.0f} | {med['misses']:.0f} | {med['peak_reserved'] / 2**20:.0f} | "
                         f"{med.get('epochs', 0):.0f} | {med.get('shortage_closes', 0):.0f} | {med.get('kept_open', 0):.0f} | "
                         f"{med.get('close_ns', 0) / 1e6:.1f} | {med.get('drains', 0):.0f} |")
    if lines:
        print("\nPyTorch loop under the shim (medians over rounds)")
        print("| config | frees | misses | peak reserved MiB | epochs | at a shortage | kept open | ms closing | drains |")
        print("|---|---|---|---|---|---|---|---|---|")
        print("\n".join(lines))
