#!/usr/bin/env python3
"""Every benchmark of allocshim in one command, CPU and GPU, into one results folder.

    bench.py BUILD OUTDIR [--commit SHA | --commit-file FILE] [--only LIST | --skip LIST]
             [--base BUILD2] [--time-limit S] [--quick]
    bench.py --from-results OUTDIR/results.json [OUTDIR2]      (redraw results.md and the plots)

BUILD holds bin/ and lib/: a build tree, or a copy made by tests/gpu/pack_build.sh (the commit
measured: --commit, else BUILD/COMMIT, which pack_build.sh writes, else this checkout's HEAD). The sections, in order (tools/bench/README.md says what each measures):

  suite alloc real spill trace replay ipc     the GPU suite, then the allocation, real-program,
                                              spill, tracing, replay and IPC benchmarks
  sync migrate launch models share            the scripts beside this file (sync_bench.sh, ...)
  hitpath                                     a pool hit taken apart (hit_path, cudart_cost, churn_core)
  ahead ab                                    BUILD against --base BUILD2 (only with --base)
  core_overhead launch_overhead policy        host only (a null driver; policy/bench): run without a GPU too

Each section runs whatever became of the ones before (a failure is recorded and the next goes
on). Without a GPU, the GPU sections are skipped and the host-only ones run.

Time: without --time-limit each section runs to its end (a hung one is stopped after an hour).
With it, each section gets a share of the time left, at least its minimum, keeping the minimums
of the sections after it; a section that cannot get its minimum is skipped ("time limit"); one
still running when its share ends is stopped, and what it printed so far is kept. The results are
rewritten after every section, so a run killed from outside leaves the sections it finished.

Writes into OUTDIR: results.md (the command, commit and machine, then each section's summary
table and the commands it ran), results.json (the same, with every number), the plots drawn from
it with matplotlib (headline.png, the README's plot: alloc+free latency of cudaMalloc, a warm
cudaMallocAsync pool and the default policy, and spilled read bandwidth against its bound; then
latency.png, churn.png, bandwidth.png; skipped, saying so, where matplotlib is missing) and logs/
(every command's output and the programs' own files). Prints a short table last.

Exit status: 0 every section ran (missed targets and sections skipped for time included), 1 a
section or a suite test failed, 2 usage or BUILD incomplete, 77 no GPU/driver and no host-only
section to run. Python standard library; matplotlib for the plots (optional).
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GPU_TESTS = os.path.join(REPO, "tests", "gpu")
sys.path.insert(0, HERE)
sys.path.insert(0, GPU_TESTS)

import all_report  # noqa: E402
import all_results as ar  # noqa: E402
import bench_plots  # noqa: E402
import run_benchmarks as rb  # noqa: E402
from all_sections import RUNNERS, SKIP, Context, Stop  # noqa: E402
from check_stats import gpu_absent_reason  # noqa: E402
# Seconds, used under --time-limit: each section's share of the time left, and the least worth
# starting it with. The shares are in proportion to what each section took in the kept runs
# (tools/bench/results/README.md); time a section does not use goes to the ones after it.
SHARE = {"suite": 280, "alloc": 80, "real": 70, "spill": 35, "trace": 25, "replay": 20, "ipc": 30, "sync": 300,
         "migrate": 400, "launch": 400, "models": 300, "share": 200, "hitpath": 60, "ahead": 600, "ab": 120, "core_overhead": 15,
         "launch_overhead": 15, "policy": 15}
MINIMUM = {"suite": 30, "alloc": 25, "real": 30, "spill": 15, "trace": 8, "replay": 8, "ipc": 8, "sync": 30,
           "migrate": 60, "launch": 60, "models": 60, "share": 60, "hitpath": 15, "ahead": 60, "ab": 20, "core_overhead": 5,
           "launch_overhead": 5, "policy": 5}
# The most a section may take, with or without --time-limit: a hung program is stopped.
MAXIMUM = dict.fromkeys(ar.SECTIONS, 3600.0)
WRITE_MARGIN_S = 5  # writing results and plots at the end


# ---- time, results, main ------------------------------------------------------------------------

def budget_for(name, enabled, remaining, quick=False, caps=None):
    """Seconds for section `name` with `remaining` seconds left, or None to skip it. caps: the
    most each section may take, where --section-time sets it."""
    def cap_of(n):
        return (caps or {}).get(n, MAXIMUM[n])

    def minimum(n):
        return min(1.0 if quick else MINIMUM[n], cap_of(n))

    def weight(n):  # a capped section claims no more of the time left than its cap
        return min(SHARE[n], cap_of(n))

    cap = cap_of(name)
    later = [n for n in ar.SECTIONS[ar.SECTIONS.index(name) + 1:] if n in enabled]
    fair = remaining * weight(name) / (weight(name) + sum(weight(n) for n in later))
    budget = min(max(fair, minimum(name)), remaining - sum(minimum(n) for n in later), cap)
    if budget < minimum(name):  # its minimum, if there is that much: the later sections get less
        return min(minimum(name), cap) if remaining >= minimum(name) else None
    return budget


def build_results(meta, sections):
    results = {"meta": meta, "sections": sections}
    suite = (sections.get("suite") or {}).get("data")
    if suite:
        results["compatibility"] = ar.compatibility(suite)
    results["targets"] = ar.collect_targets(results)
    return results


def write_outputs(results, out):
    """results.json, the plots (matplotlib, where it imports), results.md (which links the plots
    drawn); returns the paths."""
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
        f.write("\n")
    s = results.get("sections", {})
    alloc = (s.get("alloc") or {}).get("data")
    spill = (s.get("spill") or {}).get("data")
    plots = [p for p in [bench_plots.plot_headline(alloc, spill, out, results.get("meta"))] if p]
    if alloc:
        plots += bench_plots.plot_all(alloc, out)
    if spill:
        plots += bench_plots.plot_bandwidth(spill, out)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(all_report.render_markdown(results, plots={os.path.basename(p) for p in plots}))
    return [os.path.join(out, "results.json"), os.path.join(out, "results.md")] + plots


def from_results(args):
    with open(args.from_results) as f:
        results = json.load(f)
    out = args.build or os.path.dirname(os.path.abspath(args.from_results))
    os.makedirs(out, exist_ok=True)
    if "sections" not in results and "latency" in results:  # run_benchmarks.py's own results.json
        results = {"meta": results["meta"], "sections": {"alloc": {"status": "ok", "reason": "", "data": results}}}
    results = build_results(results.get("meta", {}), results.get("sections", {}))
    for path in write_outputs(results, out)[1:]:
        print(f"wrote {path}")
    print(all_report.render_short_table(results))
    return 0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("build", nargs="?", help="directory with bin/ and lib/ (a build tree or stripped copies)")
    ap.add_argument("out", nargs="?", help="the results folder (created)")
    ap.add_argument("--from-results", metavar="JSON", help="redraw results.md and the plots from a results.json")
    ap.add_argument("--commit", help="the commit measured (the GPU machine may have no git)")
    ap.add_argument("--commit-file", help="a file holding the commit measured")
    ap.add_argument("--time-limit", type=float, help="seconds for the whole run (default: no limit)")
    ap.add_argument("--base", metavar="BUILD2", help="another build (bin/, lib/) to compare with: the ahead and ab "
                    "sections, and sync's second shim")
    ap.add_argument("--skip", default="", help=f"sections to leave out, comma-separated: {','.join(ar.SECTIONS)}")
    ap.add_argument("--only", default="", help="run only these sections (comma-separated)")
    ap.add_argument("--section-time", action="append", default=[], metavar="NAME=S",
                    help="the most seconds section NAME may take (repeatable), e.g. suite=300")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter with PyTorch, CuPy and JAX (default: this one)")
    ap.add_argument("--quick", action="store_true", help="tiny workloads everywhere: a smoke run")
    g = ap.add_argument_group("sections")
    g.add_argument("--suite-filter", metavar="REGEX", help="suite tests whose name matches (GPU_SUITE_FILTER)")
    g.add_argument("--suite-script", help="the suite runner (default tests/gpu/run_gpu_suite.sh; tests use another)")
    g.add_argument("--alloc-args", metavar="ARGS", help="alloc: more run_benchmarks.py options, e.g. "
                   "'--backends vmm --free-sync none'")
    g.add_argument("--real-reps", type=int, default=1, help="real programs: runs of each configuration (default 1)")
    g.add_argument("--real-steps", type=int, default=200, help="real programs: PyTorch training steps (default 200)")
    g.add_argument("--real-arrays", type=int, default=300, help="real programs: thrust_sort arrays (default 300)")
    g.add_argument("--spill-budget", default="4GiB", help="spill: the device budget (default 4GiB)")
    g.add_argument("--trace-events", type=int, default=400000, help="trace: trace_bench events (default 400000)")
    g.add_argument("--loop-iterations", type=int, default=1000, help="trace: alloc_loop iterations (default 1000)")
    g.add_argument("--replay-ops", type=int, default=20000, help="replay: mixed workload operations (default 20000)")
    g.add_argument("--replay-cap", default="2GiB", help="replay: mixed workload's peak live bound (default 2GiB)")
    g.add_argument("--replay-backends", default="native,async_pool,vmm", help="replay: backends (default native,async_pool,vmm)")
    g.add_argument("--replay-simulate", metavar="SIZE", help="replay on the simulated device of this size, not the GPU")
    g.add_argument("--ipc-iterations", type=int, default=50, help="ipc: iterations per size (default 50)")
    args = ap.parse_args(argv)
    if args.from_results:
        return ap, args
    if not args.build or not args.out:
        ap.error("BUILD and OUTDIR are required")
    skip, only = [s for s in args.skip.split(",") if s], [s for s in args.only.split(",") if s]
    bad = [s for s in skip + only if s not in ar.SECTIONS]
    if bad:
        ap.error(f"unknown section: {', '.join(bad)} (sections: {', '.join(ar.SECTIONS)})")
    if not args.base and any(s in ar.BASE_SECTIONS for s in only):
        ap.error(f"{', '.join(s for s in only if s in ar.BASE_SECTIONS)} compare two builds: pass --base BUILD2")
    args.enabled = [s for s in ar.SECTIONS if s not in skip and (not only or s in only)
                    and (args.base or s not in ar.BASE_SECTIONS)]
    try:
        args.section_time = {k: float(v) for k, v in (x.split("=", 1) for x in args.section_time)}
    except ValueError:
        ap.error("--section-time wants NAME=SECONDS")
    bad = [k for k in args.section_time if k not in ar.SECTIONS]
    if bad:
        ap.error(f"unknown section in --section-time: {', '.join(bad)}")
    args.replay_backends = [b for b in args.replay_backends.split(",") if b]
    if args.quick:
        for k, v in (("real_steps", 20), ("real_arrays", 20), ("trace_events", 20000), ("loop_iterations", 20),
                     ("replay_ops", 400), ("ipc_iterations", 3)):
            if getattr(args, k) == ap.get_default(k):
                setattr(args, k, v)
        if args.replay_cap == ap.get_default("replay_cap"):
            args.replay_cap = "256MiB"
    return ap, args


def main(argv=None):
    ap, args = parse_args(argv)
    if args.from_results:
        return from_results(args)
    if args.base and not os.access(os.path.join(args.base, "lib", "liballocshim.so"), os.R_OK):
        print(f"bench.py: {os.path.join(args.base, 'lib', 'liballocshim.so')} is missing: --base must hold lib/",
              file=sys.stderr)
        return 2
    if not os.access(os.path.join(args.build, "bin", "allocshim"), os.X_OK):
        print(f"bench.py: {os.path.join(args.build, 'bin', 'allocshim')} is missing: BUILD must hold bin/ and lib/",
              file=sys.stderr)
        return 2
    ctx = Context(args)
    os.makedirs(ctx.work, exist_ok=True)
    if not args.commit and not args.commit_file and os.path.exists(os.path.join(args.build, "COMMIT")):
        args.commit_file = os.path.join(args.build, "COMMIT")  # pack_build.sh's: the commit built
    ctx.commit = rb.commit_of(args)
    started_wall, started = time.time(), time.monotonic()
    deadline = started + (args.time_limit or float("inf"))
    gpu, driver = rb.nvidia_smi()
    meta = {"date": datetime.datetime.fromtimestamp(started_wall, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "gpu": gpu or "?", "driver": driver or "? (nvidia-smi not available)", "commit": ctx.commit,
            "host": platform.node(), "build": ctx.build, "python": args.python, "time_limit": args.time_limit,
            "base": ctx.base, "command": shlex.join(["tools/bench/bench.py"] + list(sys.argv[1:] if argv is None else argv)),
            "sections_enabled": args.enabled, "quick": args.quick}

    def finish(partial):
        meta.update(total_seconds=time.monotonic() - started, partial=partial)
        results = build_results(meta, ctx.sections)
        write_outputs(results, ctx.out)
        return results

    no_gpu = gpu_absent_reason()
    if no_gpu and not any(s in ar.CPU_SECTIONS for s in args.enabled):
        for name in ar.SECTIONS:
            ctx.sections[name] = {"status": "skipped", "reason": f"no GPU/driver: {no_gpu}"}
        finish(False)
        print(f"SKIPPED: no GPU/driver: {no_gpu} (nothing run; {ctx.out}/results.md says so)")
        return SKIP

    def on_signal(signum, _frame):
        raise Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    finish(True)  # a results file from the start, in case the run is killed during the suite
    print(f"allocshim bench: sections {', '.join(args.enabled)}; "
          + (f"time limit {args.time_limit:.0f} s; " if args.time_limit else "")
          + f"results in {ctx.out}", flush=True)
    stopped = None
    for name in ar.SECTIONS:
        if stopped:
            ctx.sections[name] = {"status": "skipped", "reason": f"stopped ({stopped})"}
            continue
        if name not in args.enabled:
            ctx.sections[name] = {"status": "skipped", "reason": all_report.LEFT_OUT}
            continue
        if no_gpu and name not in ar.CPU_SECTIONS:
            ctx.sections[name] = {"status": "skipped", "reason": f"no GPU/driver: {no_gpu}"}
            continue
        remaining = deadline - time.monotonic() - WRITE_MARGIN_S
        budget = budget_for(name, args.enabled, remaining, args.quick, args.section_time)
        if budget is None:
            ctx.sections[name] = {"status": "skipped", "reason": f"time limit: {max(remaining, 0):.0f} s left"}
            print(f"[{name}] skipped: time limit", flush=True)
            continue
        print(f"[{name}] {ar.TITLES[name]}: up to {budget:.0f} s (elapsed {time.monotonic() - started:.0f} s)",
              flush=True)
        t0 = time.monotonic()
        try:
            result = RUNNERS[name](ctx, budget)
        except Stop as e:
            ctx.stopped = str(e)
            result = {"status": "partial", "reason": f"stopped by {e}"}
        except Exception as e:  # a broken section must not take the others with it
            with open(os.path.join(ctx.work, name + ".error.log"), "w") as f:
                f.write(traceback.format_exc())
            result = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
        if ctx.stopped:
            stopped = ctx.stopped
            if result["status"] == "ok":
                result.update(status="partial", reason=f"stopped by {stopped}")
        result.update(seconds=time.monotonic() - t0, budget=budget, commands=ctx.commands.get(name, []))
        ctx.sections[name] = result
        try:
            finish(True)  # what is done so far, in case the run is killed from outside
        except Stop as e:
            stopped = ctx.stopped = str(e)
        print(f"[{name}] {result['status']} in {result['seconds']:.0f} s"
              + (f": {result['reason'][:200]}" if result.get("reason") else ""), flush=True)

    partial = bool(stopped) or any(s.get("status") == "partial" or (s.get("status") == "skipped" and
                                                                   "time limit" in (s.get("reason") or ""))
                                   for s in ctx.sections.values())
    results = finish(partial)
    print(f"\nwrote {ctx.out}: " + ", ".join(sorted(os.listdir(ctx.out))))
    print(all_report.render_short_table(results), flush=True)
    suite = (ctx.sections.get("suite") or {}).get("data") or {}
    failed = any(s.get("status") == "failed" for s in ctx.sections.values()) or suite.get("failed", 0) > 0
    return 1 if failed or stopped else 0


if __name__ == "__main__":
    sys.exit(main())
