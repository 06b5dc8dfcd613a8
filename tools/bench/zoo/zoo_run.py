#!/usr/bin/env python3
"""The model zoo benchmark of issue 43: each loop of loops.py natively, then under allocshim at
fractions of its native peak with migrate = "off" and "auto" (spill = "host") and spill =
"managed"; per row the first-20-step and settled step times, their ratios to native, the bound
from what had to live on the host, whether the outputs match native, and the issue's goals.

    zoo_run.py BUILD OUT [--models LIST] [--fractions 90,70,50] [--modes off,auto,managed]
               [--steps 40] [--reuse-native | --resume] [--repeat-native] [--merge FILE]...
               [--held-out LIST] [--time-limit S] [--row-timeout S] [--batch LOOP=B,...]
               [--loop-cmd CMD]
    zoo_run.py --report ZOO.json [MORE.json...] [--report-out FILE]

BUILD has lib/liballocshim.so. OUT gets zoo.json (every row, merged with the zoo.json already
there and with each --merge file, newest row of each loop/mode/fraction kept) and logs/ (each
run's stdout, stderr and stats JSON: raw, never committed); zoo.json is rewritten after every
row, so a call stopped from outside keeps what it finished; --resume runs only the rows the
record lacks, so one command repeated (its last zoo.json merged) goes on where it stopped. Prints
a Markdown table of the merged record. --report renders records (zoo_report.py) to the results
folder as zoo-GPU-DATE.md (README.md beside this file: columns, bound, goals). Standard library
only; test_zoo.py tests it with a fake loop (--loop-cmd). Exit status 0, even when rows fail (they
are recorded with the reason).
"""
import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time

from zoo_defs import GOAL_BOUND, GOAL_NATIVE_90, HELD_OUT, LOOPS, MIB, MODES, REPO, SETTLE, now
from zoo_report import progress, render, report, report_path

HERE = os.path.dirname(os.path.abspath(__file__))
MIN_START_S = 20  # a run is not started with less of the call's time left
STOP_GRACE_S = 15  # a run past its time gets this long to exit after SIGINT


def key(loop, mode, fraction):
    return f"{loop}/{mode}/{fraction}"


def budget_mib(peak_bytes, fraction):
    """fraction% of the native peak, rounded down to whole MiB."""
    return peak_bytes * fraction // (100 * MIB)


def shim_conf(mib, mode):
    if mode == "managed":
        return f"budget.device={mib}MiB,budget.spill=managed"
    return f"budget.device={mib}MiB,budget.spill=host,budget.migrate={mode}"


def split_times(step_ms, settle=SETTLE):
    """(median of the first `settle` steps, median of the steps after them), None where none."""
    first, settled = step_ms[:settle], step_ms[settle:]
    return (statistics.median(first) if first else None, statistics.median(settled) if settled else None)


def ratio(a, b):
    return a / b if a is not None and b else None


def stats_summary(stats, device=0):
    """What the bound and the table use of the shim's stats JSON (shim/core/summary.cpp): the
    budget entry of `device`, and the peak of live bytes summed over the backends (each one's own
    peak, so at least the peak of their sum) plus the program's own cuMemCreate memory."""
    entry = next((b for b in stats.get("budget", []) if b.get("device") == device), {})
    peak = 0
    for section in stats.get("backends", []) + [stats.get("created", {})]:
        peak += sum(int(d.get("peak", 0)) for d in section.get("devices", []) if d.get("device") == device)
    out = {k: int(entry.get(k, 0)) for k in ("limit", "peak_backed", "spilled_allocs", "spilled_bytes",
                                             "promoted_bytes", "demoted_bytes", "migrate_ns", "refused")}
    out["peak_live_sum"] = peak
    moved = stats.get("migration", {}).get("allocations")
    if moved is not None:  # [device, base, device bytes, host bytes, ...] per movable allocation
        out["host_at_exit"] = sum(int(a[3]) for a in moved if a and a[0] == device)
    migration = stats.get("migration", {})
    if migration.get("step"):  # what the shim learned of the loop's step (placement/step.h)
        out["step"] = migration["step"]
    out["decisions"] = {k: int(migration.get(k, 0)) for k in (
        "rebalances", "rebalance_bytes", "regrets", "ahead", "ahead_bytes", "trials",
        "trials_kept", "trials_undone", "gate_closes")}
    out["error"] = stats.get("error") or ""
    return out


def host_bytes(row):
    """The bytes that could not fit under the budget, and where the figure came from: the shim's
    own count of the run (peak live bytes over its backends less the limit) when its stats have
    both, else the native peak less the budget."""
    s = row.get("stats") or {}
    if s.get("limit") and s.get("peak_live_sum"):
        return max(0, s["peak_live_sum"] - s["limit"]), "stats"
    if row.get("native_peak") is not None and row.get("budget_bytes") is not None:
        return max(0, row["native_peak"] - row["budget_bytes"]), "estimate"
    return None, None


def bound_ms(native_settled_ms, host, bytes_per_s):
    """Native settled step plus the host bytes read once over the link, not overlapped."""
    if native_settled_ms is None or host is None or not bytes_per_s:
        return None
    return native_settled_ms + host / bytes_per_s * 1000


def same_outputs(row, native):
    """True/False: the outputs equal native's (a run cut short: its prefix); None: unknown."""
    if not native or native.get("status") != "ok":
        return None
    a, b = row.get("outputs"), native.get("outputs")
    if a and b:
        return a == b[:len(a)] if row.get("status") != "ok" else a == b
    if row.get("outputs_digest") and native.get("outputs_digest") and row.get("status") == "ok":
        return row["outputs_digest"] == native["outputs_digest"]
    return None


def goals(row, off, slack):
    """The issue's goals for an `auto` row: settled within GOAL_BOUND of the bound, not slower than
    `off` (`slack`: run-to-run noise), within GOAL_NATIVE_90 of native at 90%, same outputs.
    None: not decidable (no bound, no `off` row)."""
    if row["status"] != "ok":
        return {"ran": False}
    settled = row.get("settled_ms")
    g = {"bound": None if row.get("x_bound") is None else row["x_bound"] <= GOAL_BOUND}
    if settled is None or not off:
        g["vs_off"] = None
    elif off.get("status") == "ok" and off.get("settled_ms") is not None:
        g["vs_off"] = settled <= off["settled_ms"] * (1 + slack)
    elif off.get("status") == "timeout":
        # off did not finish its steps within the row timeout, auto did: auto was not slower.
        g["vs_off"] = True
    else:
        g["vs_off"] = None
    if row["fraction"] == 90:
        g["native_90"] = None if row.get("x_native") is None else row["x_native"] <= GOAL_NATIVE_90
    g["same"] = row.get("same") is True
    return g


def finalize(record, slack):
    """Recomputes every row's derived fields from the merged record (so rows of several calls
    use the native row, the off row and the bandwidth kept now)."""
    rows = record["rows"]
    bw = (record.get("bandwidth") or {}).get("h2d_bytes_per_s")
    held = set(record.get("held_out", HELD_OUT))
    for r in rows.values():
        r["held_out"] = r["loop"] in held
        r["first20_ms"], r["settled_ms"] = split_times(r.get("step_ms") or [])
    for r in rows.values():
        native = rows.get(key(r["loop"], "native", 100))
        nf, ns = (native["first20_ms"], native["settled_ms"]) if native and native["status"] == "ok" else (None, None)
        r["first20_x_native"], r["x_native"] = ratio(r["first20_ms"], nf), ratio(r["settled_ms"], ns)
        if r["mode"] == "native":
            r["bound_ms"] = ns
            continue
        r["same"] = same_outputs(r, native)
        r["host_bytes"], r["host_source"] = host_bytes(r)
        r["bound_ms"] = bound_ms(ns, r["host_bytes"], bw)
        r["x_bound"] = ratio(r["settled_ms"], r["bound_ms"])
        if r["mode"] == "auto":
            r["goals"] = goals(r, rows.get(key(r["loop"], "off", r["fraction"])), slack)
            r["pass"] = all(v for v in r["goals"].values() if v is not None)
    return record


def new_record():
    return {"version": 1, "settle": SETTLE, "calls": [], "bandwidth": None, "held_out": list(HELD_OUT), "rows": {}}


def merge(into, other):
    """Rows, calls and the bandwidth of `other` into `into`; of two rows with one key, the newer."""
    for k, r in other.get("rows", {}).items():
        if k not in into["rows"] or r.get("date", "") >= into["rows"][k].get("date", ""):
            into["rows"][k] = r
    seen = {json.dumps(c, sort_keys=True) for c in into["calls"]}
    into["calls"] += [c for c in other.get("calls", []) if json.dumps(c, sort_keys=True) not in seen]
    into["calls"].sort(key=lambda c: c.get("date", ""))
    bw = other.get("bandwidth")
    if bw and (not into.get("bandwidth") or bw.get("date", "") >= into["bandwidth"].get("date", "")):
        into["bandwidth"] = bw
    if other.get("held_out") is not None:
        into["held_out"] = other["held_out"]
    return into


def load(path):
    with open(path) as f:
        return merge(new_record(), json.load(f))


def save(record, path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, path)


# ---- running --------------------------------------------------------------------------------------

def parse_output(text):
    """The zoo_step lines (time, output) and the zoo_result object of a loop's stdout."""
    steps, result, skipped = [], None, None
    for line in text.splitlines():
        if line.startswith("zoo_step: "):
            parts = line[len("zoo_step: "):].split(" ", 2)
            if len(parts) >= 2:
                steps.append((float(parts[1]), parts[2] if len(parts) > 2 else ""))
        elif line.startswith("zoo_result: "):
            try:
                result = json.loads(line[len("zoo_result: "):])
            except ValueError:
                pass
        elif line.startswith("SKIPPED"):
            skipped = line.split(":", 1)[-1].strip()
    return steps, result, skipped


def last_line(path):
    try:
        with open(path, errors="replace") as f:
            lines = [l.strip() for l in f.read().splitlines() if l.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


class Runner:
    def __init__(self, args):
        self.args = args
        self.logs = os.path.join(args.out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.loop_cmd = shlex.split(args.loop_cmd) if args.loop_cmd else [sys.executable, os.path.join(HERE, "loops.py")]
        self.deadline = time.time() + args.time_limit if args.time_limit else None
        self.shim = os.path.abspath(os.path.join(args.build, "lib", "liballocshim.so"))

    def timeout(self):
        """Seconds the next run may take, whether the call's time limit is what bounds it; None
        when too little is left to start one."""
        if self.deadline is None:
            return self.args.row_timeout, False
        left = self.deadline - time.time()
        if left < MIN_START_S:
            return None, True
        return min(self.args.row_timeout, left), left < self.args.row_timeout

    def run(self, loop, label, extra_env, argv):
        """One process of the loop: a row's raw fields, or None when the call's time ran out."""
        limit, by_call = self.timeout()
        if limit is None:
            return None
        out, err = (os.path.join(self.logs, f"{label}.{s}") for s in ("out", "err"))
        # Inherited ALLOCSHIM_* or LD_PRELOAD settings would change what the row means.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCSHIM_") and k != "LD_PRELOAD"}
        env.update(extra_env)
        cmd = self.loop_cmd + [loop] + argv
        print(f"zoo: {label}: {extra_env.get('ALLOCSHIM_CONF', 'native')} (up to {limit:.0f} s)", flush=True)
        start, timed_out = time.time(), False
        with open(out, "w") as fo, open(err, "w") as fe:
            try:
                p = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env, start_new_session=True)
            except OSError as e:
                return {"status": "failed", "reason": f"cannot run {cmd[0]}: {e}", "seconds": 0.0}
            try:
                rc = p.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                rc, timed_out = stop(p), True
        seconds = round(time.time() - start, 1)
        if timed_out and by_call:
            return None
        with open(out, errors="replace") as f:
            steps, result, skipped = parse_output(f.read())
        row = {"seconds": seconds, "log": os.path.relpath(out, self.args.out), "exit": rc}
        if result and rc == 0:
            row.update(status="ok", reason=None)
            row.update({k: result.get(k) for k in ("step_ms", "outputs", "outputs_digest", "peak_bytes",
                                                   "peak_used", "device", "notes")})
            return row
        row.update(step_ms=[t for t, _ in steps], outputs=[o for _, o in steps])
        if timed_out:
            row.update(status="timeout", reason=f"timed out after {limit:.0f} s ({len(steps)} steps done)")
        elif rc == 77 or skipped:
            row.update(status="skipped", reason=skipped or "exit 77")
        else:
            row.update(status="failed", reason=f"exit {rc}: {last_line(err) or last_line(out)}")
        return row


def stop(p):
    """Ends a run past its time: SIGINT first, so Python unwinds (the log shows where it was) and
    the shim writes its stats at exit; SIGKILL to the process group if that takes too long."""
    try:
        os.killpg(p.pid, signal.SIGINT)
        return p.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        return p.wait()
    except ProcessLookupError:
        return p.wait()


def loop_argv(args, loop, steps):
    argv = ["--steps", str(steps)]
    if args.batch.get(loop):
        argv += ["--batch", str(args.batch[loop])]
    return argv


def run_zoo(args, record, path):
    runner = Runner(args)
    call = {"date": now(), "argv": sys.argv[1:], "harness": git_commit(), "build": build_commit(args.build)}
    record["calls"].append(call)
    record["held_out"] = args.held_out
    not_run, bandwidth_tried = [], False

    def put(row):
        record["rows"][key(row["loop"], row["mode"], row["fraction"])] = row
        finalize(record, args.vs_off_slack)
        save(record, path)
        print(progress(row), flush=True)

    for loop in args.models:
        argv = loop_argv(args, loop, args.steps)
        native = record["rows"].get(key(loop, "native", 100))
        reuse = ((args.reuse_native or args.resume) and native and native["status"] == "ok"
                 and native.get("argv") == argv)
        if not reuse:
            raw = runner.run(loop, f"{loop}.native", {}, argv)
            if raw is None:
                not_run.append(f"{loop} native")
                continue
            native = dict(raw, loop=loop, mode="native", fraction=100, argv=argv, date=now())
            if args.repeat_native and raw["status"] == "ok":
                again = runner.run(loop, f"{loop}.native2", {}, argv)
                if again is not None:
                    native["repeat_same"] = again.get("outputs") == raw.get("outputs")
                    native["repeat_settled_ms"] = split_times(again.get("step_ms") or [])[1]
            put(native)
        work = [(f, m) for f in args.fractions for m in args.modes
                if not (args.resume and ran(record["rows"].get(key(loop, m, f)), argv))]
        if work and not bandwidth_tried and not ((args.reuse_native or args.resume) and record.get("bandwidth")):
            bandwidth_tried = True  # once per call, whatever came of it
            bw = runner.run("bandwidth", "bandwidth", {}, ["--steps", "10"])
            if bw is not None and bw["status"] == "ok":
                with open(os.path.join(runner.logs, "bandwidth.out")) as f:
                    record["bandwidth"] = dict(parse_output(f.read())[1], date=now())
            elif bw is not None:
                print(f"zoo: bandwidth {bw['status']}: {bw['reason']} (no new bounds)", flush=True)
        for fraction, mode in work:
            row = {"loop": loop, "mode": mode, "fraction": fraction, "argv": argv, "date": now()}
            if native["status"] != "ok":
                put(dict(row, status="skipped" if native["status"] == "skipped" else "failed",
                         reason=f"no native peak to size the budget from (native {native['status']}: {native['reason']})"))
                continue
            mib = budget_mib(native["peak_bytes"], fraction)
            conf = shim_conf(mib, mode)
            row.update(budget_bytes=mib * MIB, native_peak=native["peak_bytes"], conf=conf)
            if not os.path.exists(runner.shim):
                put(dict(row, status="failed", reason=f"{runner.shim} not found"))
                continue
            label = f"{loop}.{fraction}.{mode}"
            stats_path = os.path.join(runner.logs, f"{label}.stats.json")
            if os.path.exists(stats_path):
                os.remove(stats_path)
            raw = runner.run(loop, label, {"LD_PRELOAD": runner.shim, "ALLOCSHIM_CONF": conf,
                                           "ALLOCSHIM_STATS": stats_path}, argv)
            if raw is None:
                not_run.append(f"{loop} {fraction}% {mode}")
                continue
            row.update(raw)
            try:
                with open(stats_path) as f:
                    row["stats"] = stats_summary(json.load(f))
            except (OSError, ValueError) as e:
                if row["status"] == "ok":
                    row.update(status="failed", reason=f"no stats JSON from the shim (was it loaded?): {e}")
            if row.get("stats", {}).get("error") and row["status"] == "ok":
                row.update(status="failed", reason=f"the shim served natively: {row['stats']['error']}")
            put(row)
    if not_run:
        print("zoo: not run (the call's time limit): " + ", ".join(not_run), flush=True)
    return record


def ran(row, argv):
    """Whether --resume keeps this recorded row: its loop ran (whatever came of it) with these
    arguments. Rows recorded without a run (no native peak, no shim) are tried again."""
    return bool(row) and row.get("argv") == argv and (row["status"] == "ok" or "exit" in row)


def git_commit():
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def build_commit(build):
    try:
        with open(os.path.join(build, "COMMIT")) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def parse_list(text, allowed=None, kind=str):
    items = [kind(x) for x in text.split(",") if x.strip()] if text else []
    bad = [x for x in items if allowed is not None and x not in allowed]
    if bad:
        known = "1-100" if isinstance(allowed, range) else ", ".join(allowed)
        raise argparse.ArgumentTypeError(f"unknown: {', '.join(map(str, bad))} (known: {known})")
    return items


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", nargs="?", help="build with lib/liballocshim.so")
    ap.add_argument("out", nargs="?", help="folder for zoo.json and logs/")
    ap.add_argument("--models", type=lambda s: parse_list(s, LOOPS), default=list(LOOPS))
    ap.add_argument("--fractions", type=lambda s: parse_list(s, range(1, 101), int), default=[90, 70, 50])
    ap.add_argument("--modes", type=lambda s: parse_list(s, MODES), default=list(MODES))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=lambda s: {k: int(v) for k, v in (i.split("=") for i in parse_list(s))},
                    default={}, help="LOOP=B,...: another batch for these loops")
    ap.add_argument("--held-out", type=lambda s: parse_list(s), default=list(HELD_OUT))
    ap.add_argument("--reuse-native", action="store_true",
                    help="keep the recorded native row (same arguments) and copy rate instead of measuring them again")
    ap.add_argument("--resume", action="store_true",
                    help="run only the rows the record (OUT/zoo.json, --merge) does not have yet; as --reuse-native")
    ap.add_argument("--repeat-native", action="store_true", help="run native twice: are its outputs deterministic?")
    ap.add_argument("--merge", action="append", default=[], metavar="FILE", help="a zoo.json of an earlier call")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds for the whole call")
    ap.add_argument("--row-timeout", type=float, default=300)
    ap.add_argument("--vs-off-slack", type=float, default=0.02, help="auto within this fraction of off counts as not slower")
    ap.add_argument("--loop-cmd", help="command instead of `python3 loops.py` (tests)")
    ap.add_argument("--report", nargs="+", metavar="ZOO_JSON", help="render these records (merged) and exit")
    ap.add_argument("--report-out", help="file for --report (default: the results folder, zoo-GPU-DATE.md)")
    args = ap.parse_args(argv)
    if args.report:
        record = new_record()
        for p in args.report:
            merge(record, load(p))
        finalize(record, args.vs_off_slack)
        text = report(record)
        dest = args.report_out or report_path(record)
        with open(dest, "w") as f:
            f.write(text)
        print(text)
        print(f"zoo: report written to {dest}")
        return 0
    if not args.build or not args.out:
        ap.error("BUILD and OUT are needed (or --report)")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "zoo.json")
    record = load(path) if os.path.exists(path) else new_record()
    for p in args.merge:
        if os.path.exists(p):
            merge(record, load(p))
        else:
            print(f"zoo: --merge {p}: no such file, nothing merged", flush=True)
    run_zoo(args, record, path)
    finalize(record, args.vs_off_slack)
    save(record, path)
    print(render(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
