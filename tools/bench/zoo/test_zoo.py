#!/usr/bin/env python3
"""Self-test of the model zoo's runner (zoo_run.py) and its report (zoo_report.py), with no GPU
and no torch:

1. the pieces: budget rounding, the shim configuration per mode, first-20/settled medians, what
   the stats JSON gives, the host bytes and the bound, the goals, merging two records;
2. whole calls of zoo_run.py against a fake loop (--loop-cmd) that prints what loops.py prints and
   writes a stats JSON as the shim would: rows, failures recorded while the others go on, a run
   past its timeout, a missing stats file, two calls accumulating in one zoo.json (the native
   row and the copy rate reused), --merge, the call's time limit, the tables and --report.

    python3 tools/bench/zoo/test_zoo.py        (ctest: bench.zoo_selftest)

Prints one line per check and "N passed, N failed" last; exit status 0 when all pass.
"""
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import zoo_report as zr  # noqa: E402
import zoo_run as z  # noqa: E402

RESULTS = {"passed": 0, "failed": 0}
GIB, MIB = 1 << 30, 1 << 20


def check(name, cond, detail=""):
    RESULTS["passed" if cond else "failed"] += 1
    print(f"{'ok  ' if cond else 'FAIL'} {name}" + (f": {detail}" if detail and not cond else ""), flush=True)


def close(a, b, tol=1e-9):
    return a is not None and b is not None and abs(a - b) <= tol * max(1.0, abs(b))


# A stand-in for loops.py. Native: 100 ms a step. Under the shim each GiB past the budget costs
# 50 ms (auto), 150 ms (off) or 300 ms (managed) a settled step, and the first 20 steps take twice
# the settled time. Its stats say a quarter GiB more than the native peak was live. FAKE_FAIL,
# FAKE_HANG, FAKE_SKIP, FAKE_DIFF and FAKE_NOSTATS name runs as LOOP:MODE:FRACTION (';' between).
FAKE = r'''
import json, os, sys, time
loop = sys.argv[1]
steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 40
conf = os.environ.get("ALLOCSHIM_CONF", "")
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(f"{loop} {conf or 'native'} {os.environ.get('LD_PRELOAD', '-')}\n")
if loop == "bandwidth":
    print("zoo_result: " + json.dumps({"loop": "bandwidth", "h2d_bytes_per_s": 2**30 / 0.1,
                                       "d2h_bytes_per_s": 2**30 / 0.2, "device": "NVIDIA H100 80GB HBM3"}))
    sys.exit(0)
PEAK = {"gpt": 10, "unet": 4, "bert": 6}[loop] * 2**30
kv = dict(x.split("=") for x in conf.split(",")) if conf else {}
mode = kv.get("budget.migrate", "managed") if conf else "native"
budget = int(kv["budget.device"][:-3]) * 2**20 if conf else PEAK
tag = f"{loop}:{mode}:{round(100 * budget / PEAK)}"
named = lambda var: tag in os.environ.get(var, "").split(";")
if named("FAKE_FAIL"):
    print("Traceback (most recent call last):\nRuntimeError: fake failure", file=sys.stderr)
    sys.exit(1)
if named("FAKE_SKIP"):
    print("SKIPPED: torch not importable: fake")
    sys.exit(77)
host = max(0, PEAK - budget)

def write_stats():
    if os.environ.get("ALLOCSHIM_STATS") and not named("FAKE_NOSTATS"):
        stats = {"error": "", "backends": [{"kind": "vmm", "devices": [{"device": 0, "peak": budget}]},
                                           {"kind": "host", "devices": [{"device": 0, "peak": host + 2**28}]}],
                 "created": {"devices": []},
                 "budget": [{"device": 0, "limit": budget, "peak_backed": budget, "spilled_bytes": host}]}
        with open(os.environ["ALLOCSHIM_STATS"], "w") as f:
            json.dump(stats, f)

if named("FAKE_HANG"):
    for i in range(3):
        print(f"zoo_step: {i} 100.000 {10 - i * 0.1:.9g}", flush=True)
    try:
        time.sleep(120)
    except KeyboardInterrupt:  # the runner's SIGINT: exit as the shim would, stats written
        write_stats()
        sys.exit(130)
settled = 100.0 + {"native": 0, "auto": 50, "off": 150, "managed": 300}[mode] * host / 2**30
times = [2 * settled] * min(steps, 20) + [settled] * max(0, steps - 20)
outputs = [f"{10 - i * 0.1:.9g}" for i in range(steps)]
if named("FAKE_DIFF"):
    outputs[-1] = "0"
for i, (t, o) in enumerate(zip(times, outputs)):
    print(f"zoo_step: {i} {t:.3f} {o}")
write_stats()
print("zoo_result: " + json.dumps({"loop": loop, "steps": steps, "step_ms": times, "outputs": outputs,
                                   "outputs_digest": str(hash(tuple(outputs))), "peak_bytes": PEAK,
                                   "peak_used": PEAK - 2**20, "device": "NVIDIA H100 80GB HBM3",
                                   "notes": [f"fake {loop}"]}))
'''


def test_pieces():
    check("budget: 90% of 10 GiB", z.budget_mib(10 * GIB, 90) == 9216)
    check("budget: rounded down to MiB", z.budget_mib(1000 * MIB - 1, 50) == 499)
    check("budget: 70% of 10 GiB + 123 bytes", z.budget_mib(10 * GIB + 123, 70) == 7168)
    check("conf: auto", z.shim_conf(9216, "auto") == "budget.device=9216MiB,budget.spill=host,budget.migrate=auto")
    check("conf: off", z.shim_conf(1, "off") == "budget.device=1MiB,budget.spill=host,budget.migrate=off")
    check("conf: managed has no migrate key", z.shim_conf(512, "managed") == "budget.device=512MiB,budget.spill=managed")
    first, settled = z.split_times([9.0] * 19 + [1.0] + [2.0, 3.0, 4.0])
    check("medians: first 20 and settled", first == 9.0 and settled == 3.0, f"{first} {settled}")
    check("medians: no settled step before step 20", z.split_times([5.0] * 20) == (5.0, None))

    stats = {"error": "", "backends": [
        {"kind": "vmm", "devices": [{"device": 0, "peak": 3 * GIB}, {"device": 1, "peak": GIB}]},
        {"kind": "host", "devices": [{"device": 0, "peak": 2 * GIB}]}],
        "created": {"devices": [{"device": 0, "peak": 512 * MIB}]},
        "budget": [{"device": 0, "limit": 4 * GIB, "spilled_bytes": 7, "demoted_bytes": 5}],
        "migration": {"allocations": [[0, 1, 10, 20, 0], [1, 2, 10, 99, 0], [0, 3, 0, 30, 1]]}}
    s = z.stats_summary(stats)
    check("stats: peak live summed over backends and created, device 0", s["peak_live_sum"] == 5 * GIB + 512 * MIB)
    check("stats: budget entry", s["limit"] == 4 * GIB and s["spilled_bytes"] == 7 and s["demoted_bytes"] == 5)
    check("stats: host bytes at exit of device 0's movable allocations", s["host_at_exit"] == 50)
    check("stats: no migration, no host_at_exit", "host_at_exit" not in z.stats_summary({"backends": []}))
    stats["migration"]["step"] = {"epoch": 30, "repeats": True, "submissions": 812, "synchronizations": 1,
                                  "submitted_ns": 64_000_000, "match_permille": 997, "allocations_named": 41}
    stats["migration"]["rebalances"] = 3
    s2 = z.stats_summary(stats)
    check("stats: the learned step and the decisions kept", s2["step"]["submissions"] == 812
          and s2["decisions"]["rebalances"] == 3 and s2["decisions"]["trials"] == 0)
    text = zr.learned([{"loop": "gpt", "fraction": 70, "mode": "auto", "stats": s2},
                       {"loop": "gpt", "fraction": 70, "mode": "off", "stats": {"decisions": {"rebalances": 0}}},
                       {"loop": "gpt", "fraction": 100, "mode": "native", "stats": s2}])
    check("report: what the shim learned, per row under the shim",
          "| gpt | 70% | auto | 812 submissions, 1 synchronizations, 64.0 ms a step, 99.7% repeated, "
          "41 allocations named | 3 rebalances" in text and "| native |" not in text, text)
    check("report: a row with no step says so", "| gpt | 70% | off | no step learned" in text, text)
    check("report: nothing learned, no section", zr.learned([{"loop": "gpt", "fraction": 70, "mode": "auto"}]) == "")

    row = {"stats": s, "native_peak": 5 * GIB, "budget_bytes": 4 * GIB}
    check("host bytes: from the stats", z.host_bytes(row) == (GIB + 512 * MIB, "stats"))
    check("host bytes: estimate without stats", z.host_bytes(dict(row, stats=None)) == (GIB, "estimate"))
    check("host bytes: never negative", z.host_bytes({"native_peak": GIB, "budget_bytes": 2 * GIB}) == (0, "estimate"))
    check("host bytes: unknown", z.host_bytes({}) == (None, None))
    check("bound: native + host bytes over the link", close(z.bound_ms(100.0, 2 * GIB, GIB / 0.1), 300.0))
    check("bound: nothing on host is native", close(z.bound_ms(80.0, 0, 1e9), 80.0))
    check("bound: no copy rate, no bound", z.bound_ms(100.0, GIB, None) is None)

    def auto(fraction=70, settled=150.0, x_bound=1.0, x_native=1.5, same=True, status="ok"):
        return {"fraction": fraction, "settled_ms": settled, "x_bound": x_bound, "x_native": x_native,
                "same": same, "status": status}
    off = {"status": "ok", "settled_ms": 200.0}
    g = z.goals(auto(), off, 0.02)
    check("goals: all met", g == {"bound": True, "vs_off": True, "same": True}, g)
    g = z.goals(auto(x_bound=1.31), off, 0.02)
    check("goals: past 1.3x the bound", g["bound"] is False)
    check("goals: 1.3x the bound exactly passes", z.goals(auto(x_bound=1.3), off, 0.02)["bound"] is True)
    check("goals: slower than off", z.goals(auto(settled=205.0), off, 0.02)["vs_off"] is False)
    check("goals: within the slack of off", z.goals(auto(settled=203.0), off, 0.02)["vs_off"] is True)
    check("goals: off timed out", z.goals(auto(), {"status": "timeout", "settled_ms": None}, 0.02)["vs_off"] is True)
    check("goals: off failed: undecided", z.goals(auto(), {"status": "failed"}, 0.02)["vs_off"] is None)
    check("goals: no off row: undecided", z.goals(auto(), None, 0.02)["vs_off"] is None)
    g = z.goals(auto(fraction=90, x_native=1.12), off, 0.02)
    check("goals: 90% past 1.1x native", g["native_90"] is False)
    check("goals: 90% within 1.1x native", z.goals(auto(fraction=90, x_native=1.05), off, 0.02)["native_90"] is True)
    check("goals: only 90% checks native", "native_90" not in z.goals(auto(fraction=50), off, 0.02))
    check("goals: different outputs", z.goals(auto(same=False), off, 0.02)["same"] is False)
    check("goals: a failed run", z.goals(auto(status="timeout"), off, 0.02) == {"ran": False})
    check("goals: no bound: undecided", z.goals(auto(x_bound=None), off, 0.02)["bound"] is None)

    a = z.new_record()
    a["rows"] = {"gpt/native/100": {"loop": "gpt", "date": "2026-01-01T00:00:00", "v": 1},
                 "gpt/auto/70": {"loop": "gpt", "date": "2026-01-01T00:00:00", "v": 1}}
    a["calls"] = [{"date": "2026-01-01T00:00:00", "argv": ["x"]}]
    a["bandwidth"] = {"h2d_bytes_per_s": 1.0, "date": "2026-01-01T00:00:00"}
    b = z.new_record()
    b["rows"] = {"gpt/auto/70": {"loop": "gpt", "date": "2026-01-02T00:00:00", "v": 2},
                 "gpt/native/100": {"loop": "gpt", "date": "2025-12-31T00:00:00", "v": 0}}
    b["calls"] = [{"date": "2026-01-02T00:00:00", "argv": ["y"]}, {"date": "2026-01-01T00:00:00", "argv": ["x"]}]
    b["bandwidth"] = {"h2d_bytes_per_s": 2.0, "date": "2026-01-02T00:00:00"}
    m = z.merge(z.merge(z.new_record(), a), b)
    check("merge: the newer row of a key", m["rows"]["gpt/auto/70"]["v"] == 2)
    check("merge: an older row does not replace a newer", m["rows"]["gpt/native/100"]["v"] == 1)
    check("merge: calls once each, by date", [c["argv"] for c in m["calls"]] == [["x"], ["y"]])
    check("merge: the newer copy rate", m["bandwidth"]["h2d_bytes_per_s"] == 2.0)
    check("gpu slug", zr.gpu_slug("NVIDIA H100 80GB HBM3") == "h100" and zr.gpu_slug("NVIDIA H200") == "h200"
          and zr.gpu_slug("Some Card") == "some-card")


def zoo(args, env, timeout=120):
    p = subprocess.run([sys.executable, os.path.join(HERE, "zoo_run.py")] + args, env=env, capture_output=True,
                       text=True, timeout=timeout)
    if p.returncode != 0:
        print(p.stdout + p.stderr)
    return p


def rows_of(out):
    with open(os.path.join(out, "zoo.json")) as f:
        return json.load(f)


def log_lines(path):
    with open(path) as f:
        return f.read().splitlines()


def test_calls(tmp):
    fake = os.path.join(tmp, "fake_loop.py")
    with open(fake, "w") as f:
        f.write(FAKE)
    build = os.path.join(tmp, "build")
    os.makedirs(os.path.join(build, "lib"))
    # An empty file: the loader says it cannot preload it and goes on; the fake only reads the path.
    open(os.path.join(build, "lib", "liballocshim.so"), "w").close()
    with open(os.path.join(build, "COMMIT"), "w") as f:
        f.write("abc1234\n")
    log = os.path.join(tmp, "fake.log")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALLOCSHIM_", "FAKE_"))}
    env.update(FAKE_LOG=log, FAKE_FAIL="unet:off:50", FAKE_DIFF="gpt:off:90")
    loop_cmd = f"{sys.executable} {fake}"
    out = os.path.join(tmp, "out")

    p = zoo([build, out, "--models", "gpt,unet", "--fractions", "90,50", "--modes", "off,auto", "--steps", "30",
             "--loop-cmd", loop_cmd], env)
    check("call 1: exit 0 with a failed row", p.returncode == 0, p.stderr[-500:])
    rec = rows_of(out)
    rows = rec["rows"]
    check("call 1: 2 native rows and 8 under the shim", len(rows) == 10, sorted(rows))
    check("call 1: the copy rate", close(rec["bandwidth"]["h2d_bytes_per_s"], GIB / 0.1))
    r = rows["gpt/auto/50"]
    check("gpt 50% auto: ran", r["status"] == "ok", r.get("reason"))
    check("gpt 50% auto: the shim's configuration",
          r["conf"] == "budget.device=5120MiB,budget.spill=host,budget.migrate=auto" and r["budget_bytes"] == 5 * GIB)
    check("gpt 50% auto: first 20 and settled medians", r["first20_ms"] == 700.0 and r["settled_ms"] == 350.0,
          f"{r['first20_ms']} {r['settled_ms']}")
    check("gpt 50% auto: x native", close(r["x_native"], 3.5) and close(r["first20_x_native"], 3.5))
    check("gpt 50% auto: host bytes from the stats", r["host_source"] == "stats" and r["host_bytes"] == 5 * GIB + GIB // 4)
    check("gpt 50% auto: bound", close(r["bound_ms"], 625.0) and close(r["x_bound"], 350 / 625), r.get("bound_ms"))
    check("gpt 50% auto: every goal", r["pass"] is True and r["goals"] == {"bound": True, "vs_off": True, "same": True},
          r.get("goals"))
    check("gpt 50% off: no goals of its own, slower than the bound", "goals" not in rows["gpt/off/50"]
          and close(rows["gpt/off/50"]["x_bound"], 850 / 625))
    r = rows["gpt/auto/90"]
    check("gpt 90% auto: 1.5x native misses the 90% goal", r["goals"]["native_90"] is False and r["pass"] is False)
    check("gpt 90% off: different outputs found", rows["gpt/off/90"]["same"] is False)
    check("gpt native: peak and notes", rows["gpt/native/100"]["peak_bytes"] == 10 * GIB
          and rows["gpt/native/100"]["notes"] == ["fake gpt"])
    r = rows["unet/off/50"]
    check("unet 50% off: failure recorded with its reason", r["status"] == "failed" and "fake failure" in r["reason"],
          r.get("reason"))
    check("unet 50% auto: ran after the failure, vs off undecided",
          rows["unet/auto/50"]["status"] == "ok" and rows["unet/auto/50"]["goals"]["vs_off"] is None)
    check("held out: unet yes, gpt no", rows["unet/auto/50"]["held_out"] and not rows["gpt/auto/50"]["held_out"])
    check("logs: stdout, stderr and stats in OUT/logs",
          all(os.path.exists(os.path.join(out, "logs", n)) for n in ("gpt.native.out", "gpt.50.auto.err",
                                                                       "gpt.50.auto.stats.json")))
    lines = log_lines(log)
    check("call 1: native without the shim, shim rows with it",
          any(l.startswith("gpt native -") for l in lines)
          and all(l.endswith(os.path.join(build, "lib", "liballocshim.so")) for l in lines if "budget" in l))
    check("call 1: the copy rate measured once", sum(l.startswith("bandwidth") for l in lines) == 1)
    held_at = p.stdout.find("## Held out")
    check("table: loops first, held out apart", 0 < p.stdout.find("| gpt |") < held_at < p.stdout.find("| unet |"),
          p.stdout[:300])
    check("table: a failure's reason", "FAILED: exit 1: RuntimeError: fake failure" in p.stdout)
    check("table: the bound's source and the 90% miss", "5.25 GiB (stats)" in p.stdout
          and f"MISS <={z.GOAL_NATIVE_90}x native" in p.stdout)

    # Call 2 into the same OUT: other rows, the native row and the copy rate reused.
    before = len(log_lines(log))
    env2 = dict(env, FAKE_SKIP="gpt:managed:70")
    p = zoo([build, out, "--models", "gpt", "--fractions", "70", "--modes", "auto,managed", "--steps", "30",
             "--reuse-native", "--loop-cmd", loop_cmd], env2)
    rec = rows_of(out)
    new = log_lines(log)[before:]
    check("call 2: rows accumulate", len(rec["rows"]) == 12 and "gpt/auto/90" in rec["rows"], sorted(rec["rows"]))
    check("call 2: native and copy rate reused", not any(l.startswith(("gpt native", "bandwidth")) for l in new), new)
    check("call 2: a skipped run", rec["rows"]["gpt/managed/70"]["status"] == "skipped"
          and "torch not importable" in rec["rows"]["gpt/managed/70"]["reason"])
    check("call 2: two calls recorded", len(rec["calls"]) == 2 and rec["calls"][0]["build"] == "abc1234")

    # --resume with the record merged from elsewhere: only the rows it lacks run, in a fresh OUT.
    before = len(log_lines(log))
    out_r = os.path.join(tmp, "out_resume")
    p = zoo([build, out_r, "--merge", os.path.join(out, "zoo.json"), "--merge", os.path.join(tmp, "none.json"),
             "--resume", "--models", "gpt,unet", "--fractions", "90,70,50", "--modes", "auto", "--steps", "30",
             "--loop-cmd", loop_cmd], env)
    new = log_lines(log)[before:]
    check("resume: only the missing row ran", [l.split()[0] + " " + l.split()[1] for l in new]
          == ["unet budget.device=2867MiB,budget.spill=host,budget.migrate=auto"], new)
    check("resume: a missing --merge file is said and skipped", "none.json: no such file" in p.stdout)
    check("resume: the new record has the merged rows and the new one", len(rows_of(out_r)["rows"]) == 13)

    # Another OUT: a run past its timeout, a run without stats; then merged into the first.
    out2 = os.path.join(tmp, "out2")
    env3 = dict(env, FAKE_HANG="bert:auto:50", FAKE_NOSTATS="bert:managed:50")
    p = zoo([build, out2, "--models", "bert", "--fractions", "50", "--modes", "auto,managed", "--steps", "30",
             "--row-timeout", "3", "--loop-cmd", loop_cmd], env3)
    r = rows_of(out2)["rows"]["bert/auto/50"]
    check("timeout: recorded with the steps it did", r["status"] == "timeout" and len(r["step_ms"]) == 3
          and "3 steps done" in r["reason"], r.get("reason"))
    check("timeout: its outputs so far match native's", r["same"] is True and r["pass"] is False)
    check("timeout: stopped with SIGINT, so the stats were written", r["exit"] == 130 and r["host_source"] == "stats",
          f"{r.get('exit')} {r.get('host_source')}")
    r = rows_of(out2)["rows"]["bert/managed/50"]
    check("no stats: the row fails", r["status"] == "failed" and "no stats JSON" in r["reason"], r.get("reason"))
    p = zoo([build, out, "--models", "gpt", "--fractions", "", "--reuse-native", "--merge",
             os.path.join(out2, "zoo.json"), "--loop-cmd", loop_cmd], env)
    rec = rows_of(out)
    check("merge: both calls' rows in one record", len(rec["rows"]) == 15 and "bert/auto/50" in rec["rows"])

    # The call's time limit: what it cut is not recorded, and nothing starts without time left.
    out3 = os.path.join(tmp, "out3")
    old, z.MIN_START_S = z.MIN_START_S, 0.5
    os.environ.update(FAKE_LOG=log, FAKE_HANG="gpt:native:100")
    try:
        with contextlib.redirect_stdout(io.StringIO()) as text:
            z.main([build, out3, "--models", "gpt,unet", "--fractions", "90", "--modes", "auto", "--time-limit", "2",
                    "--loop-cmd", loop_cmd])
    finally:
        z.MIN_START_S = old
        del os.environ["FAKE_HANG"], os.environ["FAKE_LOG"]
    rec = rows_of(out3)
    check("time limit: the run it cut and those after it not recorded", rec["rows"] == {}, sorted(rec["rows"]))
    check("time limit: said so", "not run (the call's time limit): gpt native, unet native" in text.getvalue(),
          text.getvalue()[-300:])

    # --report: the Markdown record.
    md = os.path.join(tmp, "zoo.md")
    p = zoo(["--report", os.path.join(out, "zoo.json"), "--report-out", md], env)
    with open(md) as f:
        text = f.read()
    check("report: written", p.returncode == 0 and text.startswith("# Model zoo (issue 43): NVIDIA H100 80GB HBM3"))
    check("report: copy rate, calls, both tables, notes",
          "host to device 10.7 GB/s" in text and "abc1234" in text and "## Held out (jax_mlp, unet" in text
          and "| bert |" in text and "- gpt: fake gpt" in text)
    check("report: default file name", os.path.basename(zr.report_path(rec_with_device())) == "zoo-h100-2026-03-04.md")
    check("report: results folder", zr.report_path(rec_with_device()).endswith(os.path.join("tools", "bench", "results",
                                                                                                "zoo-h100-2026-03-04.md")))


def rec_with_device():
    r = z.new_record()
    r["rows"] = {"gpt/native/100": {"loop": "gpt", "mode": "native", "fraction": 100, "device": "NVIDIA H100 80GB HBM3",
                                    "date": "2026-03-04T10:00:00+00:00"}}
    return r


def main():
    test_pieces()
    with tempfile.TemporaryDirectory(prefix="zoo-test-") as tmp:
        test_calls(tmp)
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed")
    return 0 if RESULTS["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
