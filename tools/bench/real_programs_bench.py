#!/usr/bin/env python3
"""Real programs natively and under allocshim: a PyTorch training loop and a Thrust/CUB program.

    real_programs_bench.py BUILD [--python PY] [--reps N] [--steps N] [--arrays N] [--time-limit S]
                           [--json FILE]

PyTorch (tests/gpu/torch_train.py, run by PY, default this interpreter), the time of the training
steps after warm-up ("train_seconds" on its stderr), best of --reps runs, interleaved:
  (a) native, PyTorch's caching allocator                         -- the baseline
  (b) native, PYTORCH_NO_CUDA_MEMORY_CACHING=1                    -- every tensor a cudaMalloc
  (c) PYTORCH_NO_CUDA_MEMORY_CACHING=1 under `allocshim run`, default policy
  (d) the same with --backend async_pool --conf free_sync=barrier
Ratios are against (a): the target is (c) within 1.1x. "losses" says whether the run printed
exactly the losses and parameter checksum (a) printed.

Thrust (BUILD/bin/thrust_sort), total time from its stderr, natively and under the shim (default
policy; async_pool with free_sync=barrier), with the same identical-output check.

Prints a markdown table (and the shim's allocation counts per run); --json FILE writes the same rows
as JSON (tools/bench/bench.py reads it). Bounded by --time-limit
(default 220 s): a run that would not start in time is skipped and marked so. Exit status: 0 all
runs finished with identical output, 1 a run failed or printed different results, 77 no GPU/driver
(SKIPPED: no GPU/driver: ...). Python standard library only.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

SKIP = 77
GPU_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "gpu")
sys.path.insert(0, GPU_TESTS)

from check_stats import gpu_absent_reason, totals  # noqa: E402  (the suite's probe and counts)


def clean_env(extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ALLOCSHIM_") and k != "PYTORCH_NO_CUDA_MEMORY_CACHING"}
    env.update(extra)
    return env


def result_lines(stdout, keep):
    return [l for l in stdout.splitlines() if re.match(keep, l)]


def shim_counts(stats_path):
    try:
        with open(stats_path) as f:
            stats = json.load(f)
    except (OSError, ValueError):
        return None
    t, served = totals(stats)
    return {"allocs": t["allocs"], "served": {k: v for k, v in served.items() if v}, "error": stats.get("error")}


class Session:
    def __init__(self, args):
        self.args = args
        self.build = os.path.abspath(args.build)
        self.allocshim = os.path.join(self.build, "bin", "allocshim")
        self.deadline = time.monotonic() + args.time_limit
        # Removed with everything in it when the session goes (at exit at the latest).
        self._tmp = tempfile.TemporaryDirectory(prefix="allocshim-real-")
        self.tmp = self._tmp.name
        self.runs = 0

    def run(self, cmd, env, shim, seconds_key):
        """One run: dict(status, seconds, stdout, stats, detail)."""
        left = self.deadline - time.monotonic()
        if left < 10:
            return dict(status="skipped", detail="time limit", seconds=None, stdout="", stats=None)
        self.runs += 1
        stats_path = os.path.join(self.tmp, f"stats{self.runs}.json")
        if shim is not None:
            cmd = [self.allocshim, "run", "--quiet", "--stats", stats_path] + shim + ["--"] + cmd
        print(f"--- {' '.join(cmd)}" + "".join(f" [{k}={v}]" for k, v in env.items()), file=sys.stderr,
              flush=True)
        try:
            p = subprocess.run(cmd, env=clean_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, errors="replace", timeout=min(left, 150))
        except subprocess.TimeoutExpired:
            return dict(status="failed", detail="timed out", seconds=None, stdout="", stats=None)
        found = re.findall(rf'{seconds_key}\D*([0-9.]+)', p.stderr)
        stats = shim_counts(stats_path) if shim is not None else None
        if p.returncode == SKIP:
            why = next((l for l in p.stdout.splitlines() if l.startswith("SKIPPED")), "exit 77")
            return dict(status="skipped", detail=why, seconds=None, stdout=p.stdout, stats=stats)
        if p.returncode != 0 or not found:
            tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
            return dict(status="failed", detail=f"exit {p.returncode}: {' | '.join(tail)}",
                        seconds=None, stdout=p.stdout, stats=stats)
        if shim is not None and stats is None:
            return dict(status="failed", detail="no statistics: was the shim loaded?",
                        seconds=float(found[-1]), stdout=p.stdout, stats=None)
        return dict(status="ok", detail="", seconds=float(found[-1]), stdout=p.stdout, stats=stats)


def measure(session, configs, cmd, seconds_key, keep, reps):
    """Runs every config reps times, interleaved; returns rows (name, best, all times, identical to
    the first config's output, stats, detail)."""
    results = {name: [] for name, _, _ in configs}
    for _ in range(reps):
        for name, env, shim in configs:
            results[name].append(session.run(cmd, env, shim, seconds_key))
    base_out = None
    rows = []
    for name, _, _ in configs:
        runs = results[name]
        ok = [r for r in runs if r["status"] == "ok"]
        outs = {tuple(result_lines(r["stdout"], keep)) for r in ok}
        if base_out is None and ok:
            base_out = next(iter(outs))
        if not ok:
            status = runs[-1]["status"]
            rows.append(dict(name=name, best=None, times=[], identical=None, stats=None,
                             detail=f"{status}: {runs[-1]['detail']}", failed=status == "failed"))
            continue
        identical = len(outs) == 1 and base_out is not None and next(iter(outs)) == base_out
        bad = [r for r in runs if r["status"] == "failed"]
        rows.append(dict(name=name, best=min(r["seconds"] for r in ok), times=[r["seconds"] for r in ok],
                         identical=identical, stats=ok[-1]["stats"],
                         detail="; ".join(r["detail"] for r in bad), failed=bool(bad) or not identical))
    return rows


def table(title, rows, target_row=None, target=1.1):
    base = rows[0]["best"] if rows and rows[0]["best"] else None
    out = [f"### {title}", "",
           "| run | best s | runs (s) | ratio vs first | output identical to first | shim allocations (by backend) | note |",
           "|---|---:|---|---:|---|---|---|"]
    for r in rows:
        ratio = f"{r['best'] / base:.3f}x" if (base and r["best"]) else "n/a"
        if r["name"] == target_row and base and r["best"]:
            ratio += " (target <= %.1fx: %s)" % (target, "met" if r["best"] / base <= target else "MISSED")
        ident = {None: "n/a", True: "yes", False: "**NO**"}[r["identical"]]
        st = r["stats"]
        shim = "-" if st is None else (f"{st['allocs']} (" + ", ".join(f"{k} {v}" for k, v in st["served"].items())
                                       + ")" + (f"; error: {st['error']}" if st.get("error") else ""))
        best = f"{r['best']:.3f}" if r["best"] is not None else "-"
        times = ", ".join(f"{t:.3f}" for t in r["times"]) or "-"
        out.append(f"| {r['name']} | {best} | {times} | {ratio} | {ident} | {shim} | {r['detail']} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", help="the build directory (bin/allocshim, lib/liballocshim.so, bin/thrust_sort)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter with torch")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--arrays", type=int, default=300)
    ap.add_argument("--time-limit", type=float, default=220)
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON (tools/bench/bench.py reads it)")
    args = ap.parse_args()

    reason = gpu_absent_reason()
    if reason:
        print(f"SKIPPED: no GPU/driver: {reason}")
        return SKIP
    session = Session(args)
    for path in (session.allocshim, os.path.join(session.build, "lib", "liballocshim.so")):
        if not os.path.exists(path):
            print(f"FAIL: {path} does not exist: build the allocshim and allocshim_preload targets")
            return 2

    nocache = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    pool = ["--backend", "async_pool", "--conf", "free_sync=barrier"]
    sections = []
    failed = False
    # What --json writes: per program, its rows (measure()'s dicts) or why it did not run.
    doc = {"steps": args.steps, "reps": args.reps, "arrays": args.arrays,
           "torch": {"rows": [], "target_row": "(c) shim default policy, no caching", "target": 1.1},
           "thrust": {"rows": []}}

    torch_cmd = [args.python, os.path.join(GPU_TESTS, "torch_train.py"), "--steps", str(args.steps)]
    torch_rows = measure(session, [
        ("(a) native, caching allocator", {}, None),
        ("(b) native, no caching", nocache, None),
        ("(c) shim default policy, no caching", nocache, []),
        ("(d) shim async_pool free_sync=barrier, no caching", nocache, pool),
    ], torch_cmd, "train_seconds", r"^(step \d+:|parameter checksum:)", args.reps)
    doc["torch"]["rows"] = torch_rows
    if all(r["detail"].startswith("skipped") for r in torch_rows):
        sections.append(f"### PyTorch training loop\n\nskipped: {torch_rows[0]['detail']}\n")
    else:
        sections.append(table(f"PyTorch training loop ({args.steps} steps, timed after warm-up; "
                              f"best of {args.reps})", torch_rows,
                              target_row="(c) shim default policy, no caching"))
        failed |= any(r["failed"] for r in torch_rows)

    thrust = os.path.join(session.build, "bin", "thrust_sort")
    if os.path.exists(thrust):
        thrust_rows = measure(session, [
            ("native", {}, None),
            ("shim default policy", {}, []),
            ("shim async_pool free_sync=barrier", {}, pool),
        ], [thrust, str(args.arrays)], '"seconds"', r"^(arrays|elements|bytes sorted|checksum|PASS|FAIL)",
            args.reps)
        doc["thrust"]["rows"] = thrust_rows
        sections.append(table(f"thrust_sort ({args.arrays} arrays, total time; best of {args.reps})",
                              thrust_rows))
        failed |= any(r["failed"] for r in thrust_rows)
    else:
        doc["thrust"]["not_built"] = thrust
        sections.append(f"### thrust_sort\n\nnot built ({thrust}): cmake --build BUILD --target thrust_sort\n")

    print("\n".join(sections))
    if args.json:
        doc["failed"] = failed
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    print(("FAIL" if failed else "PASS") + ": real_programs_bench")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
