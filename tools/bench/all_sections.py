"""The sections of bench.py: each runs its programs (BUILD/bin, or the scripts beside this file)
with a time budget, in a session of its own so a stop takes its children
too, every output streamed to a log, and returns {"status", "reason", "data"}: the data computed
by all_results.py from what the programs printed. A program's failure is the section's status,
never an exception. Python standard library only.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GPU_TESTS = os.path.join(REPO, "tests", "gpu")
sys.path.insert(0, HERE)

import all_results as ar  # noqa: E402
import run_benchmarks as rb  # noqa: E402

SKIP = 77


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
        self.base = os.path.abspath(args.base) if getattr(args, "base", None) else None
        self.out = os.path.abspath(args.out)
        self.work = os.path.join(self.out, "logs")  # every command's output, the programs' own files
        self.bindir = os.path.join(self.build, "bin") + os.sep
        self.bin = lambda name: self.bindir + name  # noqa: E731
        self.sections = {}
        self.stopped = None  # the signal that stopped the run, once one has
        self.commands = {}  # section -> the command lines it ran, in order

    def run(self, name, cmd, timeout, env=None, echo=None):
        """Runs cmd in a session of its own (so a stop takes its children too), output and errors
        streamed to logs/NAME.log; echo(line) says which lines to print as they come. A signal
        stops the command, and the run: the output so far is returned, with the signal as error."""
        if self.stopped:
            return Proc(None, [], [], f"not started: stopped by {self.stopped}", 0.0)
        self.commands.setdefault(name.split(".")[0], []).append(shlex.join(cmd))
        missing = [w for w in cmd if w.startswith(self.bindir) and not os.path.exists(w)]
        if missing:  # also those run by `allocshim run`, which would only say it could not start them
            return Proc(None, [], [], f"{missing[0]} is missing (not built?)", 0.0)
        log = open(os.path.join(self.work, name + ".log"), "w")
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
            if result == "PASS" and not passed and skipped:  # every case skipped: no usable device
                result = "SKIPPED"
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
           "--time-limit", f"{max(budget - 10, 5):.0f}", "--no-png"] + (["--quick"] if a.quick else []) \
        + shlex.split(a.alloc_args or "")
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
    cmd = [sys.executable, os.path.join(HERE, "real_programs_bench.py"), ctx.build, "--python", a.python,
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
    lib = os.path.join(ctx.build, "lib", "allocshim")
    # A stripped trace_bench has no RUNPATH: libzstd and libunwind come from BUILD/lib/allocshim.
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


def section_script(ctx, budget, name, cmd, env=None, echo=None):
    """A section a script of its own runs (share_bench.sh, migrate_run.sh, ...): its output folder
    is logs/NAME; its summary is the table.txt it writes there, or what it printed."""
    out = os.path.join(ctx.work, name)
    os.makedirs(out, exist_ok=True)
    cmd = [c.replace("{out}", out) for c in cmd]
    p = ctx.run(name, cmd, budget, dict({"PYTHON": ctx.args.python}, **(env or {})), echo=echo)
    table = os.path.join(out, "table.txt")
    summary = None
    if os.path.exists(table):
        with open(table) as f:
            summary = f.read().splitlines()
    status, reason = status_of(p)
    return {"status": status, "reason": reason, "data": ar.script_results(p.lines, summary)}


def script(name):
    return os.path.join(HERE, name)


def section_sync(ctx, budget):
    q = ctx.args.quick
    env = {"ROUNDS": "1", "TORCH_REPS": "1", "TORCH_STEPS": "20"} if q else {}
    base = [os.path.join(ctx.base, "lib", "liballocshim.so")] if ctx.base else []
    return section_script(ctx, budget, "sync", ["bash", script("sync_bench.sh"), ctx.build, "{out}"] + base, env)


def section_migrate(ctx, budget):
    return section_script(ctx, budget, "migrate", ["sh", script("migrate_run.sh"), ctx.build, "{out}"],
                          echo=lambda l: True)


def section_launch(ctx, budget):
    counts = ["2", "2", "2"] if ctx.args.quick else []  # race runs, PyTorch runs, launch-rate rounds
    return section_script(ctx, budget, "launch", ["sh", script("launch_run.sh"), ctx.build, "{out}"] + counts,
                          echo=lambda l: True)


def section_models(ctx, budget):
    return section_script(ctx, budget, "models", ["sh", script("models_run.sh"), ctx.build, "{out}"],
                          echo=lambda l: True)


def section_share(ctx, budget):
    return section_script(ctx, budget, "share", ["bash", script("share_bench.sh"), ctx.build, "{out}"])


def section_ahead(ctx, budget):
    counts = ["1", "1"] if ctx.args.quick else []  # rounds, runs
    return section_script(ctx, budget, "ahead", ["sh", script("ahead_run.sh"), ctx.base, ctx.build, "{out}"] + counts,
                          echo=lambda l: True)


def section_ab(ctx, budget):
    quick = ["--reps", "2", "--budget-ms", "50"] if ctx.args.quick else []
    return section_script(ctx, budget, "ab", [sys.executable, script("ab_latency.py"), ctx.base, ctx.build,
                                              "--log", "{out}/ab.log"] + quick)


def section_programs(ctx, budget, name, cmds):
    """Programs that print their own tables, one after the other: each one's output (less its JSON
    lines) is the summary, under the command that printed it."""
    deadline = time.monotonic() + budget
    parts, summary = [], []
    for label, cmd in cmds:
        left = deadline - time.monotonic()
        if left < 1:
            parts.append((label, "skipped", "time limit"))
            continue
        p = ctx.run(f"{name}.{label}", cmd, left)
        parts.append((label,) + status_of(p))
        summary += [f"`{' '.join(os.path.basename(c) if c.startswith(ctx.bindir) else c for c in cmd)}`:", "", "```"]
        summary += [l for l in p.lines if not l.startswith("{")] + ["```", ""]
    status, reason = merge(parts)
    return {"status": status, "reason": reason, "data": {"summary": summary}}


def section_hitpath(ctx, budget):
    """The pool hit taken apart: hit_path (each step on the real driver), cudart's own cost per call
    natively and under the shim, churn_core (the multi-thread churn through the core alone)."""
    quick = ["--quick"] if ctx.args.quick else []
    shim = [ctx.bin("allocshim"), "run", "--quiet", "--backend", "vmm", "--conf", "free_sync=none", "--"]
    return section_programs(ctx, budget, "hitpath", [
        ("hit_path", [ctx.bin("hit_path")] + quick), ("cudart_cost", [ctx.bin("cudart_cost")] + quick),
        ("cudart_cost.shim", shim + [ctx.bin("cudart_cost")] + quick),
        ("churn_core", [ctx.bin("churn_core")] + (["--duration-ms", "50"] if ctx.args.quick else []))])


def section_policy(ctx, budget):
    """What policy::match costs per allocation and loading per backend (host only)."""
    q = ctx.args.quick
    return section_programs(ctx, budget, "policy", [
        ("match", [ctx.bin("policy_match_bench")] + (["100000"] if q else [])),
        ("load", [ctx.bin("policy_load_bench")] + (["1024", "2048"] if q else []))])


def section_records(ctx, budget, program):
    """core_overhead or launch_overhead: host-only programs on a null driver, no GPU needed."""
    p = ctx.run(program, [ctx.bin(program)] + (["20000"] if ctx.args.quick else []), budget)
    records = ar.parse_records(p.text, program)
    status, reason = status_of(p, lambda p: p.rc == 0 and bool(records))
    # The columns in the program's order: results.json sorts the keys of each record.
    return {"status": status, "reason": reason, "data": {"columns": list(records[0]) if records else [],
                                                         "records": records}}


RUNNERS = {"suite": section_suite, "alloc": section_alloc, "real": section_real, "spill": section_spill,
           "trace": section_trace, "replay": section_replay, "ipc": section_ipc, "sync": section_sync,
           "migrate": section_migrate, "launch": section_launch, "models": section_models, "share": section_share,
           "ahead": section_ahead, "ab": section_ab, "hitpath": section_hitpath, "policy": section_policy,
           "core_overhead": lambda ctx, budget: section_records(ctx, budget, "core_overhead"),
           "launch_overhead": lambda ctx, budget: section_records(ctx, budget, "launch_overhead")}
