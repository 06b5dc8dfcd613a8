#!/usr/bin/env python3
"""The whole GPU run in one command: the GPU test suite, then every benchmark, into one results folder.

    run_all.py BUILD OUTDIR [--commit SHA | --commit-file FILE] [--time-limit S] [--skip LIST | --only LIST]
    run_all.py --from-results OUTDIR/results.json [OUTDIR2]      (redraw results.md and the plots)

BUILD holds bin/ and lib/: a build tree, or stripped copies of its bin/ and lib/ (no git needed on
the GPU machine: pass --commit). The sections, in order; each runs whatever became of the others
(a failure is recorded and the next section goes on):

  suite   tests/gpu/run_gpu_suite.sh BUILD: every suite.txt test through check_stats.py
  alloc   tools/bench/run_benchmarks.py: alloc+free latency per backend x free_sync x size against
          cudaMalloc and cudaMallocAsync, churn with 1..16 threads, fragmentation (mixed workload)
  real    tests/gpu/real_programs_bench.py: a PyTorch training loop with
          PYTORCH_NO_CUDA_MEMORY_CACHING=1 under the shim against PyTorch's caching allocator, and
          thrust_sort with and without the shim
  spill   spill_bench under budget.device=4GiB,budget.spill=host: read bandwidth at 1.25/1.5/2x the
          budget against the model bound and managed memory
  trace   trace_bench (cost per traced event, bytes per event), and alloc_loop natively, under the
          shim, and under the shim with --trace
  replay  alloc_latency --mixed recorded once under --trace, then `allocshim replay` with each backend
  ipc     ipc_bench (export + open + close) natively and under the shim with each backend

Time: --time-limit (default 540 s) bounds the whole run. Each section gets a share of the time left
(the suite the largest), at least its minimum, keeping the minimums of the sections after it; a
section that cannot get its minimum is skipped ("time limit"); one still running when its share
ends is stopped, and what it printed so far is kept (the suite's finished tests count). The results
are rewritten after every section, so a run killed from outside leaves the sections it finished.

Writes into OUTDIR at most 8 files, as the GPU machine's $OUT returns them: results.json,
results.md, latency.svg, churn.svg, bandwidth.svg (and PNGs with --png), logs.tar.gz (every
command's output, the shim's statistics, the suite's log). Prints a short table last.

Exit status: 0 every section ran (missed targets and sections skipped for time included), 1 a
section or a suite test failed, 2 usage or BUILD incomplete, 77 no GPU/driver (nothing run).
Python standard library; matplotlib optional (PNG).
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
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
from check_stats import gpu_absent_reason  # noqa: E402

SKIP = 77
# Seconds: each section's share of the time left, the least worth starting it with, the most it
# can use. The shares are about what each needs on an H100 (run_benchmarks.py took 63 s there); the
# suite's is the largest: ~80 tests, a few seconds each, the Python ones more. Time a section does
# not use goes to the ones after it.
SHARE = {"suite": 280, "alloc": 80, "real": 70, "spill": 35, "trace": 25, "replay": 20, "ipc": 30}
MINIMUM = {"suite": 30, "alloc": 25, "real": 30, "spill": 15, "trace": 8, "replay": 8, "ipc": 8}
MAXIMUM = {"suite": 3600, "alloc": 150, "real": 240, "spill": 120, "trace": 90, "replay": 90, "ipc": 90}
WRITE_MARGIN_S = 5  # writing results, plots and the log archive at the end
LOG_FILE_LIMIT = 4 << 20  # files larger than this (traces) stay out of logs.tar.gz


class Stop(Exception):
    """SIGTERM or SIGINT: stop the command running, write what there is, exit."""


class Proc:
    def __init__(self, rc, lines, times, error, seconds):
        self.rc, self.lines, self.times, self.error, self.seconds = rc, lines, times, error, seconds

    @property
    def text(self):
        return "\n".join(self.lines)

    def skipped_reason(self):
        return rb.skipped_line(self.text) or "the program exited 77"

    def failure(self):
        return self.error or f"exit {self.rc}: {rb.last_line(self.text)}"


class Context:
    def __init__(self, args):
        self.args = args
        self.build = os.path.abspath(args.build)
        self.out = os.path.abspath(args.out)
        self.work = os.path.join(self.out, ".work") if args.keep_work else None
        self.bindir = os.path.join(self.build, "bin") + os.sep
        self.bin = lambda name: self.bindir + name  # noqa: E731
        self.sections = {}
        self.stopped = None  # the signal that stopped the run, once one has

    def run(self, name, cmd, timeout, env=None, echo=None):
        """Runs cmd in a session of its own (so a stop takes its children too), output and errors
        streamed to logs/NAME.log; echo(line) says which lines to print as they come. A signal
        stops the command, and the run: the output so far is returned, with the signal as error."""
        if self.stopped:
            return Proc(None, [], [], f"not started: stopped by {self.stopped}", 0.0)
        missing = [w for w in cmd if w.startswith(self.bindir) and not os.path.exists(w)]
        if missing:  # also those run by `allocshim run`, which would only say it could not start them
            return Proc(None, [], [], f"{missing[0]} is missing (not built?)", 0.0)
        log = open(os.path.join(self.work, "logs", name + ".log"), "w")
        log.write(f"$ {' '.join(cmd)}\n")
        full_env = rb.clean_env()
        full_env.update(env or {})
        t0 = time.monotonic()
        try:
            p = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 errors="replace", start_new_session=True)
        except OSError as e:
            log.write(f"# cannot run: {e}\n")
            log.close()
            return Proc(None, [], [], f"cannot run {cmd[0]}: {e}", 0.0)
        lines, times = [], []

        def reader():
            for line in p.stdout:
                lines.append(line.rstrip("\n"))
                times.append(time.monotonic() - t0)
                if log.closed:  # a grandchild still writing after the command was given up on
                    continue
                log.write(line)
                if echo and echo(lines[-1]):
                    print(f"  {lines[-1]}", flush=True)

        th = threading.Thread(target=reader, daemon=True)
        th.start()
        error = None
        try:
            p.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            error = f"stopped at its time limit ({timeout:.0f} s)"
            kill_group(p)
        except Stop as e:
            self.stopped = str(e)
            error = f"stopped by {e}"
            kill_group(p)
        finally:
            th.join(5)  # a grandchild in a session of its own may keep the pipe open
            seconds = time.monotonic() - t0
            log.write(f"# exit {p.returncode if error is None else error}, {seconds:.1f} s\n")
            log.close()
        return Proc(p.returncode if error is None else None, lines, times, error, seconds)


def kill_group(p):
    for sig, wait in ((signal.SIGTERM, 3), (signal.SIGKILL, 5)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def status_of(p, ok_when=lambda p: p.rc == 0):
    """(status, reason) of one command: skipped (77), ok, partial (stopped), or failed."""
    if p.rc == SKIP:
        return "skipped", p.skipped_reason()
    if ok_when(p):
        return "ok", ""
    if p.error and p.error.startswith("stopped"):  # at its time limit, or by a signal
        return "partial", p.error
    return "failed", p.failure()


def merge(parts):
    """One status for a section made of several commands: [(label, status, reason)]. failed if
    one failed; skipped if all were; partial if one was left out for time or a signal; else ok
    (the reason names the parts skipped, e.g. a program that found no module it needs)."""
    statuses = {s for _, s, _ in parts}
    reason = "; ".join(f"{label}: {s}{' (' + r + ')' if r else ''}" for label, s, r in parts if s != "ok")
    if "failed" in statuses:
        return "failed", reason
    if statuses == {"skipped"}:
        return "skipped", reason
    if "partial" in statuses or any(s == "skipped" and (r.startswith("time limit") or r.startswith("stopped")) for _, s, r in parts):
        return "partial", reason
    return "ok", reason


# ---- the sections: each returns {"status", "reason", "data"} ------------------------------------

def section_suite(ctx, budget):
    a = ctx.args
    out = os.path.join(ctx.work, "suite")
    os.makedirs(out, exist_ok=True)
    env = {"PYTHON": a.python, "OUT": out}  # OUT: where run_gpu_suite.sh writes its log (not $OUT)
    if a.suite_filter:
        env["GPU_SUITE_FILTER"] = a.suite_filter
    script = a.suite_script or os.path.join(GPU_TESTS, "run_gpu_suite.sh")
    p = ctx.run("suite", ["bash", script, ctx.build], budget, env,
                echo=lambda l: re.match(r"^(PASS|FAIL|SKIPPED): \S+: ", l) is not None)
    with open(os.path.join(GPU_TESTS, "suite.txt")) as f:
        names = [n for n in ar.suite_names(f.read()) if not a.suite_filter or re.search(a.suite_filter, n)]
    data = ar.parse_suite(p.lines, p.times, names, interrupted=p.error)
    # The backend conformance suite on the real driver: a CTest test run_gpu_suite.sh runs only
    # where the build tree was configured, so not from a copy of bin/.
    conf = ctx.bin("conformance_gpu_test")
    if os.path.exists(conf) and (not a.suite_filter or re.search(a.suite_filter, "conformance_gpu_test")):
        left = budget - p.seconds
        test = {"name": "conformance_gpu_test", "served": None, "seconds": None}
        if left < 5 or p.error:
            test.update(result="NOT RUN", detail=p.error or "time limit")
        else:
            q = ctx.run("suite.conformance_gpu_test", [conf], left)
            passed, failed, skipped, names = ar.parse_gtest(q.text)
            detail = f"{passed} passed, {failed} failed, {skipped} skipped" if passed is not None else q.failure()
            if names:
                detail += ": " + ", ".join(names)
            result = "PASS" if q.rc == 0 and passed is not None else "NOT RUN" if q.error else "FAIL"
            test.update(result=result, detail=detail if not q.error else f"{q.error}; {detail}", seconds=q.seconds)
        ar.add_suite_test(data, test)
    if p.error and not data["complete"]:
        return {"status": "partial", "reason": p.error, "data": data}
    if p.rc not in (0, 1) or not data["tests"]:
        return {"status": "failed", "reason": p.failure(), "data": data}
    return {"status": "ok", "reason": "", "data": data}


def section_alloc(ctx, budget):
    a = ctx.args
    out = os.path.join(ctx.work, "alloc")
    cmd = [sys.executable, os.path.join(HERE, "run_benchmarks.py"), ctx.build, out, "--commit", ctx.commit,
           "--time-limit", f"{max(budget - 10, 5):.0f}", "--no-png"] + (["--quick"] if a.quick else [])
    p = ctx.run("alloc", cmd, budget, echo=lambda l: l.startswith("PASS") or l.startswith("MISS"))
    if p.rc == SKIP:
        return {"status": "skipped", "reason": p.skipped_reason()}
    try:
        with open(os.path.join(out, "results.json")) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        return {"status": "failed", "reason": f"{p.failure()}; no results.json ({e})"}
    failed = next((l for l in p.lines if "FAILED:" in l), "")
    if p.rc == 0:
        return {"status": "ok", "reason": "", "data": data}
    return {"status": "failed", "reason": failed.split("FAILED:", 1)[-1].strip() or p.failure(), "data": data}


def section_real(ctx, budget):
    a = ctx.args
    path = os.path.join(ctx.work, "real.json")
    cmd = [sys.executable, os.path.join(GPU_TESTS, "real_programs_bench.py"), ctx.build, "--python", a.python,
           "--reps", str(a.real_reps), "--steps", str(a.real_steps), "--arrays", str(a.real_arrays),
           "--time-limit", f"{max(budget - 10, 5):.0f}", "--json", path]
    p = ctx.run("real", cmd, budget)
    if p.rc == SKIP:
        return {"status": "skipped", "reason": p.skipped_reason()}
    try:
        with open(path) as f:
            data = ar.real_results(json.load(f))
    except (OSError, ValueError) as e:
        return {"status": "failed", "reason": f"{p.failure()}; no rows ({e})"}
    if p.rc == 0:
        return {"status": "ok", "reason": "", "data": data}
    return {"status": "failed", "reason": "a run failed or printed other results than the first (see the rows)",
            "data": data}


def section_spill(ctx, budget):
    b = ctx.args.spill_budget
    cmd = [ctx.bin("allocshim"), "run", "--quiet", "--conf", f"budget.device={b},budget.spill=host", "--",
           ctx.bin("spill_bench"), b]
    p = ctx.run("spill", cmd, budget)
    if p.rc == SKIP:
        return {"status": "skipped", "reason": p.skipped_reason()}
    data = ar.parse_spill(p.text)
    if p.error and p.error.startswith("stopped"):
        return {"status": "partial", "reason": p.error, "data": data if data["rows"] else None}
    # Exit 1 with a summary line is a missed target (a row under 95% of its bound), not a failure.
    if data["rows"] and p.rc in (0, 1) and any(l.startswith("summary:") for l in p.lines):
        return {"status": "ok", "reason": "", "data": data}
    return {"status": "failed", "reason": p.failure(), "data": data if data["rows"] else None}


def section_trace(ctx, budget):
    a = ctx.args
    deadline = time.monotonic() + budget
    left = lambda: deadline - time.monotonic()  # noqa: E731
    lib = os.path.join(ctx.build, "lib")
    # A stripped trace_bench has no RPATH: libzstd and libunwind come from BUILD/lib.
    env = {"LD_LIBRARY_PATH": lib + (":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else "")}
    p = ctx.run("trace.bench", [ctx.bin("trace_bench"), str(a.trace_events)], min(left(), budget * 0.5), env)
    parts = [("trace_bench",) + status_of(p)]
    bench = ar.parse_trace_bench(p.text) if p.rc == 0 else None
    loops, trace_bytes = {}, None
    trace_path = os.path.join(ctx.work, "alloc_loop.trace")
    n = str(a.loop_iterations)
    for key, cmd in (("native", [ctx.bin("alloc_loop"), n]),
                     ("shim", [ctx.bin("allocshim"), "run", "--quiet", "--stats",
                               os.path.join(ctx.work, "stats.alloc_loop.json"), "--", ctx.bin("alloc_loop"), n]),
                     ("traced", [ctx.bin("allocshim"), "run", "--quiet", "--stats",
                                 os.path.join(ctx.work, "stats.alloc_loop.traced.json"), "--trace", trace_path, "--",
                                 ctx.bin("alloc_loop"), n])):
        if left() < 2:
            loops[key] = {"status": "skipped", "reason": "time limit"}
            parts.append((f"alloc_loop {key}", "skipped", "time limit"))
            continue
        p = ctx.run(f"trace.alloc_loop.{key}", cmd, left())
        status, reason = status_of(p)
        loops[key] = dict(ar.parse_alloc_loop(p.text), status=status, reason=reason, seconds=p.seconds)
        parts.append((f"alloc_loop {key}", status, reason))
    if os.path.exists(trace_path):
        trace_bytes = os.path.getsize(trace_path)
    status, reason = merge(parts)
    data = ar.trace_results(bench, loops, trace_bytes)
    return {"status": status, "reason": reason, "data": data}


POLICY = 'version = 1\n\n[defaults]\nbackend = "{kind}"\nfree_sync = "device"\n'


def section_replay(ctx, budget):
    a = ctx.args
    deadline = time.monotonic() + budget
    trace = os.path.join(ctx.work, "mixed.trace")
    workload = ["--mixed", "--mixed-ops", str(a.replay_ops), "--mixed-cap", a.replay_cap]
    cmd = [ctx.bin("allocshim"), "run", "--quiet", "--backend", "native", "--trace", trace, "--stats",
           os.path.join(ctx.work, "stats.mixed.json"), "--", ctx.bin("alloc_latency")] + workload
    p = ctx.run("replay.record", cmd, budget * 0.5)
    status, reason = status_of(p)
    record = {"status": status, "reason": reason, "seconds": p.seconds, "workload": "alloc_latency " + " ".join(workload),
              "trace_bytes": os.path.getsize(trace) if os.path.exists(trace) else None}
    if status != "ok" or record["trace_bytes"] is None:
        return {"status": "failed" if status == "ok" else status, "reason": reason or "no trace written",
                "data": ar.replay_results(record, [])}
    replays = []
    for kind in a.replay_backends:
        left = deadline - time.monotonic()
        if left < 1:
            replays.append((kind, "skipped", "time limit", None))
            continue
        policy = os.path.join(ctx.work, f"replay.{kind}.toml")
        with open(policy, "w") as f:
            f.write(POLICY.format(kind=kind))
        cmd = [ctx.bin("allocshim"), "replay", trace, "--policy", policy, "--json"]
        if a.replay_simulate:
            cmd += ["--simulate", a.replay_simulate]
        p = ctx.run(f"replay.{kind}", cmd, left)
        doc = ar.parse_replay(p.text) if p.rc == 0 else None
        st, why = status_of(p, lambda p: p.rc == 0 and doc is not None)
        replays.append((kind, st, why, doc))
    status, reason = merge([(k, s, r) for k, s, r, _ in replays])
    return {"status": status, "reason": reason, "data": ar.replay_results(record, replays)}


IPC_CONFIGS = (("native (no shim)", None), ("shim, native backend", ["--backend", "native"]),
               ("shim, vmm", ["--backend", "vmm"]),
               ("shim, async_pool (ipc = true)", ["--backend", "async_pool", "--conf", "backends.async_pool.ipc=true"]))


def section_ipc(ctx, budget):
    deadline = time.monotonic() + budget
    runs = []
    for i, (config, shim) in enumerate(IPC_CONFIGS):
        left = deadline - time.monotonic()
        if left < 1:
            runs.append((config, "skipped", "time limit", None))
            continue
        cmd = [ctx.bin("ipc_bench"), str(ctx.args.ipc_iterations)]
        if shim is not None:
            cmd = [ctx.bin("allocshim"), "run", "--quiet"] + shim + ["--"] + cmd
        p = ctx.run(f"ipc.{i}", cmd, left)
        doc = ar.parse_ipc(p.text) if p.rc == 0 else None
        st, why = status_of(p, lambda p: p.rc == 0 and doc is not None)
        runs.append((config, st, why, doc))
    status, reason = merge([(c, s, r) for c, s, r, _ in runs])
    return {"status": status, "reason": reason, "data": ar.ipc_results(runs)}


RUNNERS = {"suite": section_suite, "alloc": section_alloc, "real": section_real, "spill": section_spill,
           "trace": section_trace, "replay": section_replay, "ipc": section_ipc}


# ---- time, results, main ------------------------------------------------------------------------

def budget_for(name, enabled, remaining, quick=False, caps=None):
    """Seconds for section `name` with `remaining` seconds left, or None to skip it. caps: the
    most each section may take, where --section-time sets it."""
    minimum = (lambda n: 1.0) if quick else MINIMUM.get
    cap = (caps or {}).get(name, MAXIMUM[name])
    later = [n for n in ar.SECTIONS[ar.SECTIONS.index(name) + 1:] if n in enabled]
    fair = remaining * SHARE[name] / (SHARE[name] + sum(SHARE[n] for n in later))
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


def write_outputs(results, out, png):
    """results.json, the plots, results.md (which links the plots drawn); returns the paths."""
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
        f.write("\n")
    s = results.get("sections", {})
    plots = []
    alloc = (s.get("alloc") or {}).get("data")
    if alloc:
        plots += bench_plots.plot_all(alloc, out, png=png)
    spill = (s.get("spill") or {}).get("data")
    if spill:
        plots += bench_plots.plot_bandwidth(spill, out, png=png)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(all_report.render_markdown(results, plots={os.path.basename(p) for p in plots}))
    return [os.path.join(out, "results.json"), os.path.join(out, "results.md")] + plots


def archive_logs(work, out):
    path = os.path.join(out, "logs.tar.gz")
    with tarfile.open(path + ".tmp", "w:gz") as tar:
        for root, _, files in os.walk(work):
            for name in sorted(files):
                full = os.path.join(root, name)
                if os.path.getsize(full) <= LOG_FILE_LIMIT:
                    tar.add(full, arcname=os.path.relpath(full, work))
    os.replace(path + ".tmp", path)
    return path


def from_results(args):
    with open(args.from_results) as f:
        results = json.load(f)
    out = args.build or os.path.dirname(os.path.abspath(args.from_results))
    os.makedirs(out, exist_ok=True)
    if "sections" not in results and "latency" in results:  # run_benchmarks.py's own results.json
        results = {"meta": results["meta"], "sections": {"alloc": {"status": "ok", "reason": "", "data": results}}}
    results = build_results(results.get("meta", {}), results.get("sections", {}))
    for path in write_outputs(results, out, args.png)[1:]:
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
    ap.add_argument("--time-limit", type=float, default=540, help="seconds for the whole run (default 540)")
    ap.add_argument("--skip", default="", help=f"sections to leave out, comma-separated: {','.join(ar.SECTIONS)}")
    ap.add_argument("--only", default="", help="run only these sections (comma-separated)")
    ap.add_argument("--section-time", action="append", default=[], metavar="NAME=S",
                    help="the most seconds section NAME may take (repeatable), e.g. suite=300")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter with PyTorch, CuPy and JAX (default: this one)")
    ap.add_argument("--quick", action="store_true", help="tiny workloads everywhere: a smoke run")
    ap.add_argument("--png", action="store_true", help="PNG plots too, where matplotlib imports (more files)")
    ap.add_argument("--keep-work", action="store_true", help="keep the raw outputs in OUTDIR/.work (default: a temporary "
                    "folder, archived into logs.tar.gz)")
    g = ap.add_argument_group("sections")
    g.add_argument("--suite-filter", metavar="REGEX", help="suite tests whose name matches (GPU_SUITE_FILTER)")
    g.add_argument("--suite-script", help="the suite runner (default tests/gpu/run_gpu_suite.sh; tests use another)")
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
    args.enabled = [s for s in ar.SECTIONS if s not in skip and (not only or s in only)]
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
    if not os.access(os.path.join(args.build, "bin", "allocshim"), os.X_OK):
        print(f"run_all.py: {os.path.join(args.build, 'bin', 'allocshim')} is missing: BUILD must hold bin/ and lib/",
              file=sys.stderr)
        return 2
    ctx = Context(args)
    os.makedirs(ctx.out, exist_ok=True)
    if ctx.work is None:
        import tempfile
        ctx.work = tempfile.mkdtemp(prefix="allocshim-run-all-")
    os.makedirs(os.path.join(ctx.work, "logs"), exist_ok=True)
    ctx.commit = rb.commit_of(args)
    started_wall, started = time.time(), time.monotonic()
    deadline = started + args.time_limit
    gpu, driver = rb.nvidia_smi()
    meta = {"date": datetime.datetime.fromtimestamp(started_wall, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "gpu": gpu or "?", "driver": driver or "? (nvidia-smi not available)", "commit": ctx.commit,
            "host": platform.node(), "build": ctx.build, "python": args.python, "time_limit": args.time_limit,
            "command": " ".join(["tools/bench/run_all.py"] + list(sys.argv[1:] if argv is None else argv)),
            "sections_enabled": args.enabled, "quick": args.quick}

    def finish(partial):
        meta.update(total_seconds=time.monotonic() - started, partial=partial)
        results = build_results(meta, ctx.sections)
        write_outputs(results, ctx.out, args.png)
        archive_logs(ctx.work, ctx.out)
        return results

    no_gpu = gpu_absent_reason()
    if no_gpu:
        for name in ar.SECTIONS:
            ctx.sections[name] = {"status": "skipped", "reason": f"no GPU/driver: {no_gpu}"}
        finish(False)
        if not args.keep_work:
            shutil.rmtree(ctx.work, ignore_errors=True)
        print(f"SKIPPED: no GPU/driver: {no_gpu} (nothing run; {ctx.out}/results.md says so)")
        return SKIP

    def on_signal(signum, _frame):
        raise Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    finish(True)  # a results file from the start, in case the run is killed during the suite
    print(f"allocshim GPU run: sections {', '.join(args.enabled)}; time limit {args.time_limit:.0f} s; "
          f"results in {ctx.out}", flush=True)
    stopped = None
    for name in ar.SECTIONS:
        if stopped:
            ctx.sections[name] = {"status": "skipped", "reason": f"stopped ({stopped})"}
            continue
        if name not in args.enabled:
            ctx.sections[name] = {"status": "skipped", "reason": "left out (--skip/--only)"}
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
            with open(os.path.join(ctx.work, "logs", name + ".error.log"), "w") as f:
                f.write(traceback.format_exc())
            result = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
        if ctx.stopped:
            stopped = ctx.stopped
            if result["status"] == "ok":
                result.update(status="partial", reason=f"stopped by {stopped}")
        result.update(seconds=time.monotonic() - t0, budget=budget)
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
    if not args.keep_work:
        shutil.rmtree(ctx.work, ignore_errors=True)
    print(f"\nwrote {ctx.out}: " + ", ".join(sorted(os.listdir(ctx.out))))
    print(all_report.render_short_table(results), flush=True)
    suite = (ctx.sections.get("suite") or {}).get("data") or {}
    failed = any(s.get("status") == "failed" for s in ctx.sections.values()) or suite.get("failed", 0) > 0
    return 1 if failed or stopped else 0


if __name__ == "__main__":
    sys.exit(main())
