#!/usr/bin/env python3
"""The allocation benchmarks: alloc_latency natively and under `allocshim run` for every backend and
free_sync mode, with ratios against the native runs of the same session.

    run_benchmarks.py BUILD OUTDIR [--commit SHA | --commit-file FILE] [options]
    run_benchmarks.py --from-results OUTDIR/results.json [OUTDIR2]   (redraw results.md and plots)

Runs, in this order (native baselines first, so every ratio has its denominator):
  native:  cudaMalloc+cudaFree latency per size; cudaMallocAsync+cudaFreeAsync (and + a legacy-stream
           sync); the mixed fragmentation workload; churn with 1..16 host threads;
  shim:    for B in native, async_pool, vmm and S in device, barrier, none:
           `allocshim run --stats F --backend B --conf free_sync=S -- alloc_latency ...` for latency,
           then the mixed workload (async_pool and vmm), then churn;
  last:    core_overhead (beside alloc_latency, when built): the core's cost per call, null driver.
A backend the shim cannot serve from (its statistics name an error, or no allocation was served by
it) is marked unavailable and its other runs are skipped. With --time-limit (bench.py
passes its alloc section's share) a run that would not finish in the time left is skipped and says
so; one still running at the limit is killed and fails.

Writes into OUTDIR: results.json, results.md, latency.png/churn.png (where matplotlib imports;
not with --no-png), logs/RUN.log (each run's command and output), stats/RUN.json (the shim's statistics).
Prints a short table last.

Exit status: 0 every run finished (unavailable backends included), 1 a run failed, 2 usage or a
missing file, 77 no GPU/driver (nothing measured). Python standard library; matplotlib optional.
"""

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_plots  # noqa: E402
import bench_results as br  # noqa: E402

SKIP = 77
PER_RUN_TIMEOUT_S = 180
THREADS = "1,2,4,8,16"


def plan(args, core_overhead=None):
    """The runs, in order: dicts with name, workload, backend, free_sync, args (and program, when
    not alloc_latency). core_overhead: that program's path, to run last, or None."""
    common = ["--quick"] if args.quick else []
    latency = common + ["--budget-ms", str(args.budget_ms), "--max-reps", str(args.max_reps)]
    workloads = {
        "latency": latency,
        "async": latency + ["--async"],
        "mixed": common + ["--mixed", "--mixed-ops", str(args.mixed_ops), "--mixed-cap", args.mixed_cap],
        "churn": common + ["--threads", args.threads, "--duration-ms", str(args.duration_ms)],
    }
    if args.sizes:
        for w in ("latency", "async"):
            workloads[w] = workloads[w] + ["--sizes", args.sizes]
    runs = [dict(name=f"native.{w}", workload=w, backend=None, free_sync=None, args=workloads[w])
            for w in ("latency", "async", "mixed", "churn")]
    for workload, backends in (("latency", br.BACKENDS), ("mixed", br.POOLS), ("churn", br.BACKENDS)):
        for b in backends:
            if b not in args.backends:
                continue
            for s in br.FREE_SYNC:
                if s in args.free_sync:
                    runs.append(dict(name=f"shim.{b}.{s}.{workload}", workload=workload, backend=b,
                                     free_sync=s, args=workloads[workload]))
    if core_overhead:
        runs.append(dict(name="core_overhead", workload="core_overhead", backend=None, free_sync=None,
                         args=[str(20000 if args.quick else 1000000)], program=core_overhead))
    return runs


def clean_env():
    # Inherited ALLOCSHIM_* settings would change what a run means: each shim run sets its own.
    return {k: v for k, v in os.environ.items() if not k.startswith("ALLOCSHIM_")}


def skipped_line(text):
    for line in text.splitlines():
        if line.startswith("SKIPPED"):
            return line.split(":", 1)[1].strip() if ":" in line else line
    return None


def last_line(text):
    lines = [l for l in text.splitlines() if l.strip()]
    return lines[-1] if lines else ""


def judge(run, rc, stdout, stderr, stats):
    """(status, reason) of a finished run."""
    if rc == SKIP:
        return "skipped", skipped_line(stdout) or "the program exited 77"
    if rc != 0:
        return "failed", f"exit {rc}: {last_line(stdout + chr(10) + stderr)}"
    last = "core_overhead" if run["workload"] == "core_overhead" else "done"
    if not br.records_of({"records": br.parse_records(stdout)}, last):
        return "failed", f'no {{"bench":"{last}"}} line in the output'
    if run["backend"] is None:
        return "ok", ""
    if stats is None:
        return "failed", "no statistics written: was the shim loaded?"
    inactive = br.backend_inactive_reason(stats, run["backend"])
    if inactive:
        return "unavailable", inactive
    return "ok", ""


def run_command(cmd, timeout):
    """(exit status or None, stdout, stderr, error or None). The command runs in a session of its
    own, so that on a timeout the whole group goes (`allocshim run` and the program under it)."""
    try:
        p = subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             errors="replace", start_new_session=True)
    except OSError as e:
        return None, "", "", f"cannot run {cmd[0]}: {e}"
    try:
        stdout, stderr = p.communicate(timeout=timeout)
        return p.returncode, stdout, stderr, None
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        stdout, stderr = p.communicate()
        return None, stdout, stderr, f"timed out after {timeout:.0f} s"


def execute(run, ctx):
    """Runs one benchmark; fills run's status, reason, seconds, records, stats, cmd, log."""
    name = run["name"]
    cmd = [run.get("program", ctx.bench)] + run["args"]
    stats_path = None
    if run["backend"] is not None:
        stats_path = os.path.join(ctx.out, "stats", name + ".json")
        if os.path.exists(stats_path):
            os.remove(stats_path)
        cmd = [ctx.allocshim, "run", "--stats", stats_path, "--backend", run["backend"], "--conf",
               f"free_sync={run['free_sync']}", "--"] + cmd
    run.update(cmd=cmd, log=os.path.join("logs", name + ".log"), records=[], stats=None, seconds=0.0)
    remaining = ctx.deadline - time.monotonic()
    if run["backend"] in ctx.unavailable:
        run.update(status="unavailable", reason=ctx.unavailable[run["backend"]])
        return
    # The native run of the same workload came first: a shim run that would not finish in the time
    # left is not started (it would be killed half way).
    needed = max(ctx.min_run_s, ctx.estimates.get(run["workload"], 0))
    if remaining < needed:
        run.update(status="skipped", reason=f"time limit: {max(remaining, 0):.0f} s left, about {needed:.0f} s needed")
        return
    timeout = min(remaining, PER_RUN_TIMEOUT_S)
    t0 = time.monotonic()
    rc, stdout, stderr, error = run_command(cmd, timeout)
    run["seconds"] = time.monotonic() - t0
    if run["backend"] is None:
        ctx.estimates[run["workload"]] = run["seconds"]
    with open(os.path.join(ctx.out, run["log"]), "w") as f:
        f.write(f"$ {' '.join(cmd)}\n# exit {rc if error is None else error}, {run['seconds']:.1f} s\n"
                f"--- stdout\n{stdout}\n--- stderr\n{stderr}\n")
    run["records"] = br.parse_records(stdout)
    if stats_path and os.path.exists(stats_path):
        try:
            with open(stats_path) as f:
                run["stats"] = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            stderr += f"\nunreadable statistics {stats_path}: {e}"
    if error:
        status, reason = "failed", error
    else:
        status, reason = judge(run, rc, stdout, stderr, run["stats"])
    run.update(status=status, reason=reason, rc=rc)
    if status == "unavailable":
        ctx.unavailable[run["backend"]] = reason


def nvidia_smi():
    """(GPU name, driver version) from nvidia-smi, or (None, None)."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=15)
        first = p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else ""
        name, _, driver = first.rpartition(",")
        return (name.strip() or None), (driver.strip() or None)
    except (OSError, subprocess.TimeoutExpired):
        return None, None


def commit_of(args):
    if args.commit:
        return args.commit
    if args.commit_file:
        with open(args.commit_file) as f:
            return f.read().strip() or "unknown"
    try:
        p = subprocess.run(["git", "-C", HERE, "rev-parse", "HEAD"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, timeout=10)
        return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def cuda_version(v):
    return f"{v // 1000}.{v % 1000 // 10}" if isinstance(v, int) else "?"


def make_meta(args, runs, started, total):
    info = next((r for run in runs for r in run.get("records", []) if r.get("bench") == "info"), {})
    gpu, driver = nvidia_smi()
    return {"date": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "gpu": gpu or info.get("name", "?"), "driver": driver or "? (nvidia-smi not available)",
            "cuda_driver": cuda_version(info.get("driver_version")),
            "cuda_runtime": cuda_version(info.get("runtime_version")),
            "gpu_memory_total": info.get("mem_total"), "gpu_memory_free": info.get("mem_free"),
            "clock_overhead_ns": info.get("clock_overhead_ns"), "commit": commit_of(args),
            "host": platform.node(), "build": os.path.abspath(args.build), "total_seconds": total,
            "time_limit": args.time_limit if args.time_limit != float("inf") else None, "quick": args.quick}


def write_outputs(results, out, png=True):
    """png=False: no plots (bench.py, which runs this as its alloc section, draws its own)."""
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(br.render_markdown(results))
    return [os.path.join(out, "results.json"), os.path.join(out, "results.md")] + \
        (bench_plots.plot_all(results, out) if png else [])


class Context:
    pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("build", nargs="?", help="the build directory (bin/alloc_latency, bin/allocshim)")
    ap.add_argument("out", nargs="?", help="where results go (created)")
    ap.add_argument("--from-results", metavar="JSON", help="redraw results.md and the plots from a results.json")
    ap.add_argument("--commit", help="the commit measured (the GPU machine may have no git history)")
    ap.add_argument("--commit-file", help="a file holding the commit measured")
    ap.add_argument("--bench", help="alloc_latency to run (default BUILD/bin/alloc_latency)")
    ap.add_argument("--allocshim", help="the allocshim tool (default BUILD/bin/allocshim)")
    ap.add_argument("--time-limit", type=float, default=float("inf"),
                    help="seconds for the runs (default: no limit; writing the results adds a few)")
    ap.add_argument("--backends", default=",".join(br.BACKENDS), help="shim backends to run (default all)")
    ap.add_argument("--free-sync", default=",".join(br.FREE_SYNC), help="free_sync modes to run (default all)")
    ap.add_argument("--sizes", help="latency sizes, e.g. 256,4KiB,1MiB (default: alloc_latency's 256 B..1 GiB)")
    ap.add_argument("--threads", default=THREADS, help=f"churn thread counts (default {THREADS})")
    ap.add_argument("--budget-ms", type=float, default=400, help="latency: measuring time per size (default 400)")
    ap.add_argument("--max-reps", type=int, default=200000, help="latency: most pairs per size (default 200000)")
    ap.add_argument("--duration-ms", type=float, default=300, help="churn: time per thread count (default 300)")
    ap.add_argument("--mixed-ops", type=int, default=20000, help="mixed: operations (default 20000)")
    ap.add_argument("--mixed-cap", default="2GiB", help="mixed: peak live bound (default 2GiB)")
    ap.add_argument("--quick", action="store_true", help="tiny budgets everywhere: a smoke run")
    ap.add_argument("--no-png", action="store_true", help="no plots (bench.py draws them from its own results.json)")
    args = ap.parse_args()

    if args.from_results:
        with open(args.from_results) as f:
            results = json.load(f)
        out = args.build or os.path.dirname(os.path.abspath(args.from_results))
        os.makedirs(out, exist_ok=True)
        for path in write_outputs(results, out, png=not args.no_png)[1:]:
            print(f"wrote {path}")
        print(br.render_short_table(results))
        return 0
    if not args.build or not args.out:
        ap.error("BUILD and OUTDIR are required")
    if args.quick:
        for k, v in (("budget_ms", 20), ("max_reps", 2000), ("duration_ms", 30), ("mixed_ops", 400)):
            if getattr(args, k) == ap.get_default(k):
                setattr(args, k, v)
        if args.mixed_cap == ap.get_default("mixed_cap"):
            args.mixed_cap = "256MiB"
    args.backends = [b for b in args.backends.split(",") if b]
    args.free_sync = [s for s in args.free_sync.split(",") if s]
    bad = [b for b in args.backends if b not in br.BACKENDS] + [s for s in args.free_sync if s not in br.FREE_SYNC]
    if bad:
        ap.error(f"unknown backend or free_sync mode: {', '.join(bad)}")

    ctx = Context()
    ctx.bench = os.path.abspath(args.bench or os.path.join(args.build, "bin", "alloc_latency"))
    ctx.allocshim = os.path.abspath(args.allocshim or os.path.join(args.build, "bin", "allocshim"))
    for path, target in ((ctx.bench, "alloc_latency"), (ctx.allocshim, "allocshim")):
        if not os.access(path, os.X_OK):
            print(f"run_benchmarks.py: {path} is missing or not executable: build the {target} target "
                  f"(or cmake --build BUILD --target allocshim_bench)", file=sys.stderr)
            return 2
    ctx.out = os.path.abspath(args.out)
    for sub in ("", "logs", "stats"):
        os.makedirs(os.path.join(ctx.out, sub), exist_ok=True)
    started_wall = time.time()
    started = time.monotonic()
    ctx.deadline = started + args.time_limit
    ctx.min_run_s = 1.0 if args.quick else 5.0
    ctx.unavailable = {}
    # workload -> seconds it should take: its native run's time, once known.
    ctx.estimates = {"core_overhead": 2.0 if args.quick else 20.0}

    # The core's own cost per call on a null driver (tools/bench/core_overhead.cpp): host only, last.
    core_overhead = os.path.join(os.path.dirname(ctx.bench), "core_overhead")
    runs = plan(args, core_overhead if os.access(core_overhead, os.X_OK) else None)
    print(f"allocation benchmarks: {len(runs)} runs, time limit {args.time_limit:.0f} s, output {ctx.out}",
          flush=True)
    for i, run in enumerate(runs, 1):
        execute(run, ctx)
        elapsed = time.monotonic() - started
        reason = f" ({run['reason']})" if run.get("reason") else ""
        print(f"[{i:2}/{len(runs)}] {run['name']:<30} {run['status']:<11} {run['seconds']:6.1f} s   "
              f"elapsed {elapsed:5.0f} s{reason}", flush=True)
        if i == 1 and run["status"] == "skipped" and run.get("rc") == SKIP:
            why = run["reason"] if run["reason"].startswith("no GPU/driver") else f"no GPU/driver: {run['reason']}"
            print(f"SKIPPED: {why} (alloc_latency exited 77; nothing measured)")
            return SKIP
        if i == 1 and run["status"] != "ok":
            print(f"the first native run {run['status']}: see {os.path.join(ctx.out, run['log'])}")

    total = time.monotonic() - started
    results = br.build_results(make_meta(args, runs, started_wall, total), runs)
    for path in write_outputs(results, ctx.out, png=not args.no_png):
        print(f"wrote {path}")
    failed = [r["name"] for r in runs if r["status"] == "failed"]
    counts = {s: sum(r["status"] == s for r in runs) for s in ("ok", "unavailable", "skipped", "failed")}
    print(f"\nruns {total:.1f} s (limit {args.time_limit:.0f} s), total {time.monotonic() - started:.1f} s; runs: "
          + ", ".join(f"{v} {k}" for k, v in counts.items())
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    print(br.render_short_table(results), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
