#!/usr/bin/env python3
"""[compute] shares on the GPU machine (docs/operators.md, "Compute share and priority").

    tools/bench/compute_share_run.py BUILD [--rounds N] [--seconds S] [--launch-rounds M] > report.md

BUILD has bin/ (compute_spin, launch_rate) and lib/ (the shim). Every round runs, in an order
rotated by one each round (interleaved, so that a slow process start weighs on no one setup):
  alone              compute_spin natively, kernels and graph mode: the rates the shares are of;
  alone, 30%         under the shim with [compute] share = "30%" and nobody else: 100% of native?
  pair, native       two compute_spin processes at once without the shim (the GPU's own split);
  pair, 30% / -      under the shim, one with share = "30%", one without a cap, kernels and graph;
  pair, 30% / 30%    both capped (their caps leave the GPU idle part of the time);
  pair, high / low   priority = "high" against priority = "low".
Each process's rate over the common window, divided by the same round's native rate alone, is its
share of the GPU's time. Then launch_rate (1 thread) natively, under the shim without a [compute]
section and with one (nobody else), in M rounds of the three in rotated order: the launch overhead
without contention; and launch_overhead --driver, the launch gate's cost inside one process.
--rounds 0 runs the launch part only.
Prints a Markdown report; exit 0 when every goal holds (each capped process within 5 points of its
share, a low priority within 5 points of nothing beside a high one, alone, a high priority and the
launch rate at least 99% of native by the median), 1 otherwise, 77 without a GPU.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

GOAL_POINTS = 0.05
GOAL_NATIVE = 0.99


def spin_cmd(build, mode, seconds, start_at):
    return [os.path.join(build, "bin", "compute_spin"), mode, str(seconds), "%.3f" % start_at]


def shim_env(build, share_dir, conf, stats):
    env = dict(os.environ)
    env["LD_PRELOAD"] = os.path.join(build, "lib", "liballocshim.so")
    env["ALLOCSHIM_SHARE_DIR"] = share_dir
    env["ALLOCSHIM_CONF"] = conf
    env["ALLOCSHIM_STATS"] = stats
    return env


def run_spins(build, share_dir, mode, seconds, confs, stats_dir, label):
    """Runs one compute_spin per conf (None: natively) over one window; returns their rates."""
    start_at = time.time() + 3.0  # past every process's CUDA start
    procs = []
    for i, conf in enumerate(confs):
        env = dict(os.environ) if conf is None else shim_env(
            build, share_dir, conf, os.path.join(stats_dir, "%s.%d.json" % (label, i)))
        procs.append(subprocess.Popen(spin_cmd(build, mode, seconds, start_at), env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    rates = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        if p.returncode == 77:
            print(out.strip(), file=sys.stderr)
            sys.exit(77)
        m = re.search(r"rate=([0-9.]+)", out)
        if p.returncode != 0 or not m:
            raise RuntimeError("%s: exit %d\n%s%s" % (label, p.returncode, out, err))
        rates.append(float(m.group(1)))
    return rates


def launch_rate(build, share_dir, conf, stats):
    cmd = [os.path.join(build, "bin", "launch_rate"), "1", "200000", "3"]
    env = dict(os.environ) if conf is None else shim_env(build, share_dir, conf, stats)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    return statistics.median(float(x) for x in re.findall(r"launches_per_s=([0-9.]+)", out))


def span(values):
    return "%.3f (%.3f-%.3f)" % (statistics.median(values), min(values), max(values))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--launch-rounds", type=int, default=10)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    cap = "compute.share=30%"
    free = "compute.share=100%"
    setups = [  # label, mode, confs, expected share of each process (None: no goal)
        ("alone", "kernels", [None], None),
        ("alone, graph", "graph", [None], None),
        ("alone, 30%", "kernels", [cap], [1.0]),
        ("pair, native", "kernels", [None, None], None),
        ("pair, 30% / -", "kernels", [cap, free], [0.30, 0.70]),
        ("pair, 30% / -, graph", "graph", [cap, free], [0.30, 0.70]),
        ("pair, 30% / 30%", "kernels", [cap, cap], [0.30, 0.30]),
        ("pair, high / low", "kernels", ["compute.priority=high", "compute.priority=low"],
         [1.0, 0.0]),
    ]
    shares = {label: [[] for _ in confs] for label, _, confs, _ in setups}
    with tempfile.TemporaryDirectory() as share_dir, tempfile.TemporaryDirectory() as stats_dir:
        for r in range(a.rounds):
            base = {}
            order = setups[r % len(setups):] + setups[:r % len(setups)]
            # The native rates alone come first in every round: the others are shares of them.
            native = ("alone", "alone, graph")
            order = [s for s in order if s[0] in native] + [s for s in order if s[0] not in native]
            for label, mode, confs, _ in order:
                rates = run_spins(build, share_dir, mode, a.seconds, confs, stats_dir,
                                  "%s.%d" % (re.sub(r"[^a-z0-9]+", "_", label), r))
                if label in ("alone", "alone, graph"):
                    base[mode] = rates[0]
                for i, rate in enumerate(rates):
                    shares[label][i].append(rate / base[mode])
        # Natively, under the shim without the section (the hooks' one-load path: what loading the
        # shim costs, and the spread between processes) and with it, the order rotating by round.
        # ("shim": a policy override of another section, so the policy has no [compute].)
        arms = [("native", None), ("shim", "log.level=warn"), ("compute", cap)]
        launch = {name: [] for name, _ in arms}
        for r in range(a.launch_rounds):
            for name, conf in arms[r % 3:] + arms[:r % 3]:
                launch[name].append(
                    launch_rate(build, share_dir, conf, os.path.join(stats_dir, "launch.json")))
        hooks = subprocess.run([os.path.join(build, "bin", "launch_overhead"), "--driver"],
                               capture_output=True, text=True, timeout=300).stdout

    ok = True
    commit = open(os.path.join(build, "COMMIT")).read().strip() if os.path.exists(
        os.path.join(build, "COMMIT")) else "unknown"
    print("# [compute] shares: %s, commit %s\n" % (time.strftime("%Y-%m-%d", time.gmtime()), commit))
    print("`tools/bench/compute_share_run.py BUILD --rounds %d --seconds %g --launch-rounds %d`; "
          "each process's rate over the common window divided by the same round's native rate "
          "alone (median, min-max over the rounds). Kernels of 1 ms that fill every SM, 8 a batch, "
          "a stream synchronization after each; period 100 ms.\n" % (a.rounds, a.seconds, a.launch_rounds))
    print("| setup | process 1 | process 2 | goal | |")
    print("|---|---|---|---|---|")
    for label, _, confs, goal in setups if a.rounds > 0 else []:
        cells = [span(v) for v in shares[label]] + [""] * (2 - len(confs))
        verdict = ""
        if goal is not None:
            # A share is met within GOAL_POINTS either way; running alone, at GOAL_NATIVE or faster.
            good = all(statistics.median(v) >= GOAL_NATIVE if g >= 1 else
                       abs(statistics.median(v) - g) <= GOAL_POINTS
                       for v, g in zip(shares[label], goal))
            verdict = "ok" if good else "MISSED"
            ok = ok and good
        goal_text = "" if goal is None else " / ".join("%.2f" % g for g in goal)
        print("| %s | %s | %s | %s | %s |" % (label, cells[0], cells[1], goal_text, verdict))
    ratios = [c / n for c, n in zip(launch["compute"], launch["native"])]
    plain = [c / n for c, n in zip(launch["shim"], launch["native"])]
    good = statistics.median(ratios) >= GOAL_NATIVE
    ok = ok and good
    print("\nLaunch rate alone (launch_rate, 1 thread, median of 3 runs of 200000 launches per "
          "process), %d rounds, each the three in an order rotated by one; native median %.0f "
          "launches/s:\n" % (a.launch_rounds, statistics.median(launch["native"])))
    print("| against native | median | min-max |\n|---|---|---|")
    print("| shim with `compute.share=30%%` | %.3f | %.3f-%.3f |" %
          (statistics.median(ratios), min(ratios), max(ratios)))
    print("| shim without `[compute]` | %.3f | %.3f-%.3f |\n" %
          (statistics.median(plain), min(plain), max(plain)))
    print("Goal (at least %.2f by the median): %s\n" % (GOAL_NATIVE, "ok" if good else "MISSED"))
    print("Inside one process (`launch_overhead --driver`: a real launch alone and inside the "
          "launch gate, which is all a launch passes with only `[compute]`, alternating in "
          "batches):\n\n```\n%s```" % hooks)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
