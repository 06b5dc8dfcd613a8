#!/usr/bin/env python3
"""Reads gpt_probe_run.sh's output folder and prints, per budgeted run: where the host-resident bytes
are (per segment of the caching allocator, per kind of tensor: parameters, gradients, Adam states,
the allocator's free cache), which of the step's allocations land on host chunks (by Python line),
and which kernels slowed down against native (CUDA time over two steps).

    gpt_probe_report.py OUT [--top N]
"""
import argparse
import collections
import glob
import json
import os

MiB = 1 << 20
CHUNK = 2 * MiB


def host_ranges(seg):
    out = []
    for i, t in enumerate(seg["chunks"]):
        if t == 1:
            lo = seg["address"] + i * CHUNK
            out.append((lo, min(lo + CHUNK, seg["address"] + seg["size"])))
    return out


def overlap(ranges, lo, hi):
    return sum(max(0, min(hi, b) - max(lo, a)) for a, b in ranges)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    native = json.load(open(os.path.join(args.out, "gpt.native.json")))
    nk = {k: t for k, c, t in native["kernels"]}
    for path in sorted(glob.glob(os.path.join(args.out, "gpt.*.*.json"))):
        if path.endswith("stats.json") or "native" in path:
            continue
        name = os.path.basename(path)[:-5]
        p = json.load(open(path))
        print(f"== {name}")
        segs = p["segments"]
        hr = [r for s in segs for r in host_ranges(s)]
        total = sum(s["size"] for s in segs)
        print(f"segments {len(segs)}, {total / MiB:.0f} MiB; on host {sum(b - a for a, b in hr) / MiB:.0f} MiB")
        stats_path = os.path.join(args.out, name + ".stats.json")
        seq = {}
        if os.path.exists(stats_path):
            st = json.load(open(stats_path))
            for dev, base, dbytes, hbytes, sq, uses, epochs, last, rate, *_ in st.get("migration", {}).get("allocations", []):
                seq[base] = (sq, uses, epochs, rate, hbytes)
            b = st.get("budget", [{}])[0]
            print(f"stats: spilled {b.get('spilled_bytes', 0) / MiB:.0f} MiB in {b.get('spilled_allocs')}, demoted "
                  f"{b.get('demoted_bytes', 0) / MiB:.0f} MiB, promoted {b.get('promoted_bytes', 0) / MiB:.0f} MiB; "
                  + ", ".join(f"{k} {v}" for k, v in st.get("migration", {}).items() if k in ("rebalances", "regrets", "ahead", "ahead_declined", "epoch")
                             or k.startswith("trial")))
        # Tensors alive at the step's end, by kind.
        kinds = collections.Counter()
        kinds_all = collections.Counter()
        for kind, n, ptr, nb in p["tensors"]:
            kinds_all[kind] += nb
            kinds[kind] += overlap(hr, ptr, ptr + nb)
        print("alive at step end, host MiB / total MiB: " + ", ".join(f"{k} {kinds[k] / MiB:.0f}/{kinds_all[k] / MiB:.0f}" for k in kinds_all))
        free_host = sum(overlap(hr, a, a + sz) for s in segs for a, sz, st_ in s["blocks"] if st_ != "active_allocated")
        print(f"free (cached) blocks on host: {free_host / MiB:.0f} MiB")
        # Segments with host bytes.
        print("segments with host chunks (MiB: size, on host; shim seq, uses, epochs, rate/16 per MiB):")
        for s in sorted(segs, key=lambda s: s["address"]):
            h = sum(1 for t in s["chunks"] if t == 1) * CHUNK
            info = seq.get(s["address"])
            if h == 0 and not (info and info[4]):
                continue
            owners = collections.Counter()
            for kind, n, ptr, nb in p["tensors"]:
                o = overlap([(s["address"], s["address"] + s["size"])], ptr, ptr + nb)
                if o:
                    owners[kind] += o
            extra = f" seq {info[0]} uses {info[1]} epochs {info[2]} rate/MiB {info[3] / 16 / (s['size'] / MiB):.3f}" if info else ""
            print(f"  {s['address']:#x} {s['size'] / MiB:7.0f} {h / MiB:6.0f}{extra} holds " +
                  ", ".join(f"{k} {v / MiB:.0f}" for k, v in owners.items()))
        # The step's allocations that land on host chunks, by Python line.
        lines = collections.Counter()
        counts = collections.Counter()
        for action, addr, size, frames in p["events"]:
            if action != "alloc":
                continue
            o = overlap(hr, addr, addr + size)
            if o:
                key = " < ".join(frames[:2]) + " | " + " < ".join(frames[2:])
                lines[key] += o
                counts[key] += 1
        print("the step's allocations on host chunks (MiB, count, where):")
        for k, v in lines.most_common(args.top):
            print(f"  {v / MiB:7.0f} {counts[k]:3d}  {k}")
        # Kernels: CUDA time over the two profiled steps against native.
        bk = {k: t for k, c, t in p["kernels"]}
        rows = sorted(((bk.get(k, 0) - nk.get(k, 0), k) for k in set(bk) | set(nk)), reverse=True)
        print(f"kernels (ms over 2 steps: native, budget, +): total native {sum(nk.values()) / 1e3:.0f}, budget {sum(bk.values()) / 1e3:.0f}")
        for d, k in rows[: args.top]:
            print(f"  {nk.get(k, 0) / 1e3:8.1f} {bk.get(k, 0) / 1e3:8.1f} {d / 1e3:+8.1f}  {k[:110]}")
        print()


if __name__ == "__main__":
    main()
