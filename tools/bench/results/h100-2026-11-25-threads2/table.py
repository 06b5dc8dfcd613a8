"""Prints the churn results of run.sh as a markdown table: total pairs/s per thread count and the
16-thread total over the 1-thread total, one row per run (label.round)."""
import glob
import json
import os
import sys


def rows(out):
    """(label, {threads: pairs/s}) per log: churn_LABEL.txt (alloc_latency), core_LABEL.txt
    (churn_core, labelled core_LABEL)."""
    paths = sorted(glob.glob(os.path.join(out, "churn_*.txt"))) + sorted(glob.glob(os.path.join(out, "core_*.txt")))
    for path in paths:
        name = os.path.basename(path)[:-len(".txt")]
        label = name[len("churn_"):] if name.startswith("churn_") else name
        rates = {}
        with open(path) as f:
            for line in f:
                if line.startswith('{"bench":"churn'):
                    rec = json.loads(line)
                    rates[rec["threads"]] = rec["pairs_per_s"]
        yield label, rates


def fmt(x):
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.0f} k"


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    threads = [1, 2, 4, 8, 16]
    print("| run | " + " | ".join(str(t) for t in threads) + " | 16/1 |")
    print("|---|" + "---:|" * (len(threads) + 1))
    for label, rates in rows(out):
        cells = [fmt(rates[t]) if t in rates else "-" for t in threads]
        ratio = f"{rates[16] / rates[1]:.2f}" if rates.get(1) and 16 in rates else "-"
        print(f"| {label} | " + " | ".join(cells) + f" | {ratio} |")


if __name__ == "__main__":
    main()
