#!/usr/bin/env python3
"""A/B of alloc_latency's pair latency under two builds of the shim, in one session.

    ab_latency.py BASE NEW [--configs vmm:none,vmm:device] [--sizes 256,1MiB,1GiB] [--reps 6]
                  [--budget-ms 250] [--log FILE]

BASE and NEW are build (or carry) directories with bin/allocshim, bin/alloc_latency and
lib/liballocshim.so. Each rep runs every config once per build, alternating which build goes first,
so both see the same machine state: a host's median can move between processes of the same
binary (the hit-path run listed in tools/bench/results/README.md), which only interleaving and
several reps average out. Prints each rep's pair median per config and size, and the ratio
NEW/BASE of the medians over reps (bench.py's ab section). Exit status: 0, 2 usage, 1 a run produced no numbers.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run_once(build, backend, sync, sizes, budget_ms, log):
    cmd = [os.path.join(build, "bin", "allocshim"), "run", "-q", "--backend", backend, "--conf",
           f"free_sync={sync}", "--", os.path.join(build, "bin", "alloc_latency"), "--sizes", sizes,
           "--budget-ms", str(budget_ms)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if log:
        log.write(" ".join(cmd) + "\n" + p.stdout + p.stderr + "\n")
    rows, clock = {}, None
    for line in p.stdout.splitlines():
        if line.startswith('{"bench":"latency"') and "pair_median_ns" in line:
            j = json.loads(line)
            rows[j["size"]] = j
        elif line.startswith('{"bench":"info"'):
            clock = json.loads(line).get("clock_overhead_ns")
    return rows, clock


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--configs", default="vmm:none,vmm:device", help="backend:free_sync,...")
    ap.add_argument("--sizes", default="256,1MiB,1GiB")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--budget-ms", type=float, default=250)
    ap.add_argument("--log", help="every command and its output")
    a = ap.parse_args()
    configs = [tuple(c.split(":")) for c in a.configs.split(",")]
    if any(len(c) != 2 for c in configs):
        ap.error("--configs takes backend:free_sync pairs")
    builds = {"base": a.base, "new": a.new}
    log = open(a.log, "w") if a.log else None
    pairs = {}  # (backend, sync, size, build) -> [row per rep]
    clocks = {"base": [], "new": []}
    for rep in range(a.reps):
        for backend, sync in configs:
            for name in (("base", "new") if rep % 2 == 0 else ("new", "base")):
                rows, clock = run_once(builds[name], backend, sync, a.sizes, a.budget_ms, log)
                if not rows:
                    print(f"no numbers from {name} {backend}/{sync} (see --log)", file=sys.stderr)
                    return 1
                clocks[name].append(clock)
                for size, row in rows.items():
                    pairs.setdefault((backend, sync, size, name), []).append(row)
    print("config size: base pair medians per rep (ns) | new | new/base of the medians over reps | "
          "new alloc/free medians (base)")
    for backend, sync in configs:
        sizes = sorted({k[2] for k in pairs if k[0] == backend and k[1] == sync})
        for size in sizes:
            b = pairs[(backend, sync, size, "base")]
            n = pairs[(backend, sync, size, "new")]
            med = lambda rows, key: statistics.median(r[key] for r in rows)
            print(f"{backend}/{sync} {size}: {[r['pair_median_ns'] for r in b]} | "
                  f"{[r['pair_median_ns'] for r in n]} | "
                  f"{med(n, 'pair_median_ns') / med(b, 'pair_median_ns'):.3f} | "
                  f"{med(n, 'alloc_median_ns'):.0f}/{med(n, 'free_median_ns'):.0f} "
                  f"({med(b, 'alloc_median_ns'):.0f}/{med(b, 'free_median_ns'):.0f})")
    print("clock read ns per run:", clocks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
