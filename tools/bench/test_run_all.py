#!/usr/bin/env python3
"""Self-test of run_all.py (the whole GPU run), with no GPU:

1. recorded output of every section (run_gpu_suite.sh, spill_bench, trace_bench, alloc_loop,
   `allocshim replay --json`, ipc_bench, real_programs_bench.py --json) through all_results.py:
   parsing, ratios against the native path, PASS/MISS, exact values; the compatibility table; the
   time budget per section; results.md, the short table and the bandwidth plot;
2. run_all.py end to end against a build of fakes (an `allocshim` that runs programs and replays,
   programs that print what the real ones print) and a fake libcuda.so.1 for the GPU probe (built
   with --cc): the real run_gpu_suite.sh, run_benchmarks.py and real_programs_bench.py run on them;
   a failing section recorded while the others go on, a section that raises, a suite stopped at
   its time limit (partial results), --skip/--only, --from-results, no GPU (exit 77).

    test_run_all.py [--cc CC]      (without a C compiler, only the no-GPU run of part 2)

Prints one line per check and "N passed, N failed" last; exit status 0 when all pass.
"""

import argparse
import inspect
import json
import os
import stat
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "gpu"))

import all_report  # noqa: E402
import all_sections  # noqa: E402
import all_results as ar  # noqa: E402
import bench_plots  # noqa: E402
import run_all  # noqa: E402
from harness_selftest import FAKE_LIBCUDA  # noqa: E402
from test_run_benchmarks import FAKE_BENCH, FAKE_CORE_OVERHEAD, RESULTS, check, close, process_alive  # noqa: E402

# ---- recorded output ----------------------------------------------------------------------------

SUITE_OUT = """
===== machine
date:   2026-11-22 11:20:00 UTC
===== [1/5] static_cudart
--- under allocshim: /b/bin/allocshim run --quiet --stats /tmp/x/stats.json -- /b/bin/alloc_loop
  | PASS: alloc_loop
--- stats: policy '<default>', allocs 201, frees 201, failures 0, bytes 1, unknown_frees 0
--- stats: served by kind: vmm 201; by api: alloc 201
PASS: static_cudart: allocs 201, frees 201, exit 0
===== [2/5] pytorch.async_pool
--- stats: served by kind: async_pool 60; by api: alloc 60
PASS: pytorch.async_pool: backend async_pool, allocs 60, frees 60, output identical to native, exit 0
===== [3/5] cupy.host
SKIPPED: cupy.host: backend host not active: allocations were served by native
===== [4/5] jax_program
--- stats: served by kind: vmm 1234; by api: alloc 1234
PASS: jax_program: output identical to native, exit 0
===== [5/5] jax_program.managed
--- stats: served by kind: managed 1234; by api: alloc 1234
FAIL: jax_program.managed: output differs from the native run at line 3: 'a' vs 'b'

===== summary (log: /tmp/gpu-suite.log)
test                | result  | detail
---------------------------------------------
static_cudart       | PASS    | allocs 201, frees 201, exit 0
pytorch.async_pool  | PASS    | backend async_pool, allocs 60, frees 60, output identical to native, exit 0
cupy.host           | SKIPPED | backend host not active: allocations were served by native
jax_program         | PASS    | output identical to native, exit 0
jax_program.managed | FAIL    | output differs from the native run at line 3: 'a' vs 'b'
ctest:bench.x       | FAIL    | no result from ctest
passed 3, failed 2, skipped 1
""".strip("\n").splitlines()

SPILL_OUT = """| factor | size | f_host | spilled GB/s | bound GB/s | spilled/bound | managed host GB/s | managed stripe GB/s |
|---|---|---|---|---|---|---|---|
| 1.25 | 5.00 GiB | 0.200 | 150.0 | 240.0 | 62.5% | 20.0 | 230.0 |
| 1.50 | 6.00 GiB | 0.333 | 148.5 | 150.0 | 99.0% | skipped | skipped |
| 2.00 | 8.00 GiB | 0.500 | 36.0 | 100.0 | 36.0% | 18.0 | 99.0 |

B_dev 2315.0 GB/s (device buffer), B_host 51.0 GB/s (pinned host, mapped), budget 4.00 GiB
summary: spilled reads at >= 36.0% of the model bound (target 95%)
"""

TRACE_BENCH_OUT = """trace_bench: 400000 events (8 sites, 20 frames deep + main), native stacks
  unwinder                libunwind 1.6 (per-thread cache)
  per event (alloc+free)  median 5012 ns   p90 8300 ns   p99 9100 ns   mean 5400 ns
  alloc (with unwind)     median 8300 ns   p90 9000 ns
  free                    median 200 ns   p90 250 ns
  wall per event          5600 ns (timing calls included)
  file                    145000 bytes, 0.36 bytes per event (/tmp/trace_bench.1.trace)
"""

ALLOC_LOOP_OUT = """iterations: 1000 (7 sizes, 256 to 16777216 bytes)
allocations: {n}
frees: {n}
bytes: 123
mismatches: 0
checksum: 0x1 (expected 0x1)
time per alloc+free pair: {pair:.2f} us
PASS: alloc_loop
"""


def replay_json(reserved, alloc_median, failures=0):
    return json.dumps({"policy": "p.toml", "error": "", "allocs": 20000, "frees": 19990, "failures": failures,
                       "trace_failures": 0, "recovered": 0, "alloc_ns": {"median": alloc_median, "p99": 1, "mean": 1},
                       "free_ns": {"median": 100, "p99": 1, "mean": 1}, "peak_reserved": reserved,
                       "peak_live": 1000, "fragmentation": 0.1, "wall_ns": 5}, indent=1)


def ipc_line(total):
    """ipc_bench's output, with totals of `total` us at 4 KiB and twice that at 1 MiB."""
    sizes = [{"bytes": b, "iterations": 5, "get_p50": total / 4, "get_p90": 1, "get_again_p50": 1,
              "open_p50": total / 2, "open_p90": 1, "close_p50": total / 4, "close_p90": 1, "reopen_p50": 1,
              "total_p50": total * (k + 1)} for k, b in enumerate((4096, 1 << 20))]
    return "size iters | ...\njson: " + json.dumps({"unit": "us", "sizes": sizes}) + "\nallocations: 14\nfrees: 14\n"


def real_doc():
    def row(name, best, identical, stats=None):
        return {"name": name, "best": best, "times": [best], "identical": identical, "stats": stats, "detail": "",
                "failed": identical is False}
    return {"steps": 200, "reps": 1, "arrays": 300, "failed": False,
            "torch": {"target_row": "(c) shim default policy, no caching", "target": 1.1,
                      "rows": [row("(a) native, caching allocator", 10.0, True),
                               row("(b) native, no caching", 13.8, True),
                               row("(c) shim default policy, no caching", 10.3, True,
                                   {"allocs": 5000, "served": {"vmm": 5000}, "error": ""}),
                               row("(d) shim async_pool free_sync=barrier, no caching", 11.5, True)]},
            "thrust": {"rows": [row("native", 2.0, True), row("shim default policy", 1.98, True),
                                row("shim async_pool free_sync=barrier", 2.2, False)]}}


# ---- part 1: parsing, ratios, targets, rendering ------------------------------------------------

def test_suite():
    names = ["static_cudart", "pytorch.async_pool", "cupy.host", "jax_program", "jax_program.managed", "pytorch.host"]
    times = [float(i) for i in range(len(SUITE_OUT))]
    s = ar.parse_suite(SUITE_OUT, times, names)
    by = {t["name"]: t for t in s["tests"]}
    check("suite: counts from the table, ctest rows and names never reached included",
          (s["passed"], s["failed"], s["skipped"], s["not_run"], s["complete"]) == (3, 2, 1, 1, True), s)
    check("suite: served by kind", by["static_cudart"]["served"] == "vmm 201" and by["cupy.host"]["served"] is None)
    check("suite: seconds from header to result line", close(by["static_cudart"]["seconds"], 5.0),
          by["static_cudart"]["seconds"])
    check("suite: the table's result wins", by["ctest:bench.x"]["result"] == "FAIL")
    check("suite: a name not reached is NOT RUN", by["pytorch.host"]["result"] == "NOT RUN" and
          by["pytorch.host"]["detail"] == "not reached")
    check("suite: a program's own PASS line is not a result", by["static_cudart"]["detail"] == "allocs 201, frees 201, exit 0")

    cut = SUITE_OUT[:SUITE_OUT.index("===== [4/5] jax_program") + 2]  # killed while jax_program ran
    p = ar.parse_suite(cut, None, names, interrupted="stopped at its time limit (30 s)")
    by = {t["name"]: t for t in p["tests"]}
    check("suite, stopped: finished tests kept", (p["passed"], p["skipped"], p["complete"]) == (2, 1, False), p)
    check("suite, stopped: the test running is NOT RUN, saying why",
          by["jax_program"]["result"] == "NOT RUN" and "time limit" in by["jax_program"]["detail"], by["jax_program"])
    check("suite, stopped: the rest NOT RUN", by["jax_program.managed"]["result"] == "NOT RUN" and p["not_run"] == 3)
    check("suite_names: suite.txt's names in order",
          ar.suite_names("# c\n\nstatic_cudart  --count -- x\n  # d\npytorch --x\n") == ["static_cudart", "pytorch"])

    gtest = ("[==========] 165 tests ran.\n[  PASSED  ] 120 tests.\n[  SKIPPED ] 43 tests, listed below:\n"
             "[  SKIPPED ] Vmm/Conformance.OomRetry/0\n[  FAILED  ] 2 tests, listed below:\n"
             "[  FAILED  ] Vmm/Conformance.Growth/1, where GetParam() = 4\n[  FAILED  ] Pool/Conformance.Churn/0\n")
    check("gtest summary", ar.parse_gtest(gtest) == (120, 2, 43, ["Vmm/Conformance.Growth/1", "Pool/Conformance.Churn/0"]),
          ar.parse_gtest(gtest))
    check("gtest summary, all passed", ar.parse_gtest("[  PASSED  ] 1 test.\n") == (1, 0, 0, []))
    extra = ar.add_suite_test(json.loads(json.dumps(s)), {"name": "conformance_gpu_test", "result": "FAIL",
                                                          "detail": "x", "served": None, "seconds": 1.0})
    check("a test beside the suite is counted", (extra["failed"], len(extra["tests"])) == (3, 8), extra["failed"])

    compat = ar.compatibility(s)
    check("compatibility: default and per-backend cells",
          compat["jax_program"]["default"]["result"] == "PASS" and compat["jax_program"]["managed"]["result"] == "FAIL"
          and compat["jax_program"]["vmm"] is None and compat["pytorch"]["async_pool"]["result"] == "PASS", compat)
    cells = [all_report.compat_cell(compat["jax_program"]["default"], "default"),
             all_report.compat_cell(compat["pytorch"]["async_pool"], "async_pool"),
             all_report.compat_cell(compat["cupy"]["host"], "host"),
             all_report.compat_cell(compat["jax_program"]["vmm"], "vmm"),
             all_report.compat_cell(compat["pytorch"]["host"], "host")]
    check("compatibility: cell texts", cells == [
        "same output (vmm 1234)", "same output, counts exact",
        "skipped: backend host not active: allocations were served by native", "not in the suite", "not run yet"],
        cells)
    return s


def test_sections():
    sp = ar.parse_spill(SPILL_OUT)
    check("spill: three rows, references", len(sp["rows"]) == 3 and (sp["b_dev"], sp["b_host"], sp["budget_gib"])
          == (2315.0, 51.0, 4.0), sp)
    r = sp["rows"][0]
    check("spill: fraction of the bound from the bandwidths", close(r["of_bound"], 150 / 240), r)
    check("spill: against managed host", close(r["vs_managed_host"], 7.5) and close(r["managed_stripe_of_bound"], 230 / 240))
    check("spill: managed not measured is None", sp["rows"][1]["managed_host_gbps"] is None
          and sp["rows"][1]["vs_managed_host"] is None)
    t = ar.spill_targets(sp)
    check("spill: targets MISS, PASS, MISS", [x["passed"] for x in t] == [False, True, False], t)
    check("spill: target value", ar.fmt_target_value(t[0]) == "62.5% of bound", ar.fmt_target_value(t[0]))

    b = ar.parse_trace_bench(TRACE_BENCH_OUT)
    check("trace_bench: the unwinder", b["unwinder"] == "libunwind 1.6 (per-thread cache)", b)
    check("trace_bench parsed", (b["events"], b["median_ns"], b["p90_ns"], b["p99_ns"], b["alloc_median_ns"],
                                 b["free_median_ns"], b["bytes_per_event"]) == (400000, 5012, 8300, 9100, 8300, 200, 0.36), b)
    check("trace_bench: an unknown format gives None, not an error",
          set(ar.parse_trace_bench("something else").values()) == {None})
    loops = {k: dict(ar.parse_alloc_loop(ALLOC_LOOP_OUT.format(n=7001, pair=pair)), status="ok", seconds=sec)
             for k, pair, sec in (("native", 90.0, 2.0), ("shim", 1.5, 1.0), ("traced", 2.5, 1.2))}
    tr = ar.trace_results(b, loops, trace_bytes=42006)
    check("trace: traced over untraced", close(tr["traced_vs_untraced_pair"], 2.5 / 1.5)
          and close(tr["traced_vs_untraced_wall"], 1.2), tr)
    check("trace: added per event, half a pair's difference", close(tr["added_ns_per_event"], 500.0), tr)
    check("trace: shim over native", close(tr["shim_vs_native_pair"], 1.5 / 90))
    check("trace: bytes per event of the traced run", close(tr["loop_bytes_per_event"], 3.0), tr)
    t = ar.trace_targets(tr)
    check("trace: median MISS, bytes PASS", [x["passed"] for x in t] == [False, True], t)
    check("trace: value shown in us", ar.fmt_target_value(t[0]) == "5.01 us", ar.fmt_target_value(t[0]))

    check("replay: JSON found after other lines", ar.parse_replay("warning\n" + replay_json(1, 2))["allocs"] == 20000)
    check("replay: garbage is None", ar.parse_replay("{ nope") is None and ar.parse_replay("") is None)
    rp = ar.replay_results({"status": "ok"}, [("native", "ok", "", ar.parse_replay(replay_json(1000, 80000))),
                                              ("async_pool", "ok", "", ar.parse_replay(replay_json(1600, 1500))),
                                              ("vmm", "ok", "", ar.parse_replay(replay_json(1040, 700)))])
    by = {r["backend"]: r for r in rp["backends"]}
    check("replay: peak reserved / peak live", close(by["vmm"]["fragmentation"], 1.04)
          and close(by["async_pool"]["fragmentation"], 1.6))
    check("replay: against the native backend's replay", close(by["async_pool"]["reserved_vs_native"], 1.6)
          and close(by["vmm"]["alloc_vs_native"], 700 / 80000))
    t = ar.replay_targets(rp)
    check("replay: vmm target PASS", len(t) == 1 and t[0]["passed"] is True, t)
    bad = ar.replay_results({}, [("vmm", "ok", "", ar.parse_replay(replay_json(1040, 700, failures=3)))])
    check("replay: failures make it a MISS", ar.replay_targets(bad)[0]["passed"] is False)
    none = ar.replay_results({}, [("vmm", "failed", "exit 1", None)])
    check("replay: a failed replay is not measured", ar.replay_targets(none)[0]["passed"] is None)

    ipc = ar.ipc_results([("native (no shim)", "ok", "", ar.parse_ipc(ipc_line(100.0))),
                          ("shim, vmm", "ok", "", ar.parse_ipc(ipc_line(150.0))),
                          ("shim, async_pool", "failed", "exit 1: FAIL", ar.parse_ipc("FAIL: x\n"))])
    v = ipc["configs"][1]["sizes"]
    check("ipc: total against native per size", close(v[0]["total_vs_native"], 1.5) and close(v[1]["total_vs_native"], 1.5)
          and close(v[0]["open_vs_native"], 1.5), v)
    check("ipc: a failed config has no sizes", ipc["configs"][2]["sizes"] == [] and ipc["configs"][2]["status"] == "failed")

    real = ar.real_results(real_doc())
    rows = {r["name"]: r for r in real["torch"]["rows"]}
    check("real: ratio to the caching allocator", close(rows["(c) shim default policy, no caching"]["ratio"], 1.03)
          and close(rows["(b) native, no caching"]["ratio"], 1.38))
    check("real: thrust ratio to native", close(real["thrust"]["rows"][1]["ratio"], 0.99))
    t = ar.real_targets(real)
    check("real: torch time PASS, losses PASS, thrust output MISS", [x["passed"] for x in t] == [True, True, False], t)
    check("real: torch value", ar.fmt_target_value(t[0]) == "1.030x", ar.fmt_target_value(t[0]))
    slow = real_doc()
    slow["torch"]["rows"][2]["best"] = 11.5
    check("real: 1.15x is a MISS", ar.real_targets(ar.real_results(slow))[0]["passed"] is False)
    check("real: no rows, no targets", ar.real_targets(ar.real_results({"torch": {"rows": []}})) == [])
    return sp, tr, rp, ipc, real


def test_budget():
    en = list(ar.SECTIONS)
    b = run_all.budget_for("suite", en, 535)
    check("budget: the suite's share of 535 s", close(b, 535 * 280 / sum(run_all.SHARE.values())), b)
    b = run_all.budget_for("alloc", en, 300)
    sh = run_all.SHARE
    want = 300 * sh["alloc"] / sum(sh[n] for n in ar.SECTIONS[1:])
    check("budget: the time left shared among the sections left", close(b, want), b)
    b = run_all.budget_for("suite", en, 150)
    check("budget: the later sections keep their minimums", close(b, 150 - (25 + 30 + 15 + 8 + 8 + 8)), b)
    b = run_all.budget_for("alloc", en, 40)
    check("budget: less than the minimums left: the first gets its own", close(b, 25), b)
    check("budget: too little left for its minimum: skipped", run_all.budget_for("real", en, 20) is None)
    check("budget: capped at the section's maximum", run_all.budget_for("ipc", ["ipc"], 500) == run_all.MAXIMUM["ipc"])
    check("budget: a left-out section takes no share", close(run_all.budget_for("spill", ["spill", "ipc"], 150),
                                                            150 * sh["spill"] / (sh["spill"] + sh["ipc"])))


def test_merge():
    m = all_sections.merge
    check("merge: all ok", m([("a", "ok", ""), ("b", "ok", "")]) == ("ok", ""))
    check("merge: one failed", m([("a", "ok", ""), ("b", "failed", "exit 1")]) == ("failed", "b: failed (exit 1)"))
    check("merge: all skipped", m([("a", "skipped", "no GPU"), ("b", "skipped", "no GPU")])[0] == "skipped")
    check("merge: one left out for time: partial", m([("a", "ok", ""), ("b", "skipped", "time limit")])
          == ("partial", "b: skipped (time limit)"))
    check("merge: one stopped: partial", m([("a", "partial", "stopped at its time limit (3 s)")])[0] == "partial")
    check("merge: one skipped for its own reason: ok, saying so",
          m([("a", "ok", ""), ("b", "skipped", "no torch")]) == ("ok", "b: skipped (no torch)"))


def canned_results(suite, sp, tr, rp, ipc, real):
    alloc = {"meta": {"cuda_driver": "13.0", "cuda_runtime": "13.0"}, "latency": [], "churn": [], "fragmentation": [],
             "runs": [], "core_overhead": [],
             "targets": [{"target": "pool hit, free_sync=none: pair median <= 0.3 us at every size",
                          "config": "shim.vmm.none", "limit": 300, "unit": "ns", "value": 530, "at_size": 256,
                          "passed": False}]}
    sections = {"suite": {"status": "ok", "reason": "", "seconds": 200.0, "data": suite},
                "alloc": {"status": "ok", "reason": "", "seconds": 60.0, "data": alloc},
                "real": {"status": "ok", "reason": "", "seconds": 80.0, "data": real},
                "spill": {"status": "ok", "reason": "", "seconds": 30.0, "data": sp},
                "trace": {"status": "ok", "reason": "", "seconds": 20.0, "data": tr},
                "replay": {"status": "ok", "reason": "", "seconds": 10.0, "data": rp},
                "ipc": {"status": "failed", "reason": "shim, async_pool: failed (exit 1: FAIL)", "seconds": 5.0,
                        "data": ipc}}
    meta = {"date": "D", "gpu": "G", "driver": "580", "commit": "abc", "host": "h", "python": "py",
            "time_limit": 540, "total_seconds": 400.0, "command": "tools/bench/run_all.py b o", "partial": True}
    return run_all.build_results(meta, sections)


def test_report(res):
    names = [t["section"] for t in res["targets"]]
    check("targets: every section's, in section order",
          names == ["alloc", "real", "real", "real", "spill", "spill", "spill", "trace", "trace", "replay"], names)
    md = all_report.render_markdown(res, plots={"bandwidth.svg"})
    lines = md.splitlines()
    want = ["- GPU: G, driver 580 (CUDA driver API 13.0, runtime 13.0)",
            "- total: 400 s (limit 540 s) — stopped early, partial results",
            "GPU suite: passed 3, failed 2, skipped 1, not run 1.",
            "| ipc | IPC latency | failed | 5.0 | shim, async_pool: failed (exit 1: FAIL) |",
            "| alloc | pool hit, free_sync=none: pair median <= 0.3 us at every size | shim.vmm.none | 0.530 us (worst at 256 B) | MISS |",
            "| spill | spilled reads at factor 1.25 >= 95% of the model bound | budget.spill=host, f_host 0.200 | 62.5% of bound | MISS |",
            "| replay | vmm fragmentation of the replayed mixed trace (peak reserved / peak live) <= 1.05, no failures | replay, backend vmm | 1.0400 | PASS |",
            "| 1.25 | 5.00 | 0.200 | 150.0 | 240.0 | 62.5% | 20.0 | 7.5x | 230.0 | 95.8% |",
            "![read bandwidth against the oversubscription factor](bandwidth.svg)",
            "| vmm | ok | 20000 | 0 | 1000 B | 1.0 KiB | 1.0400 | 1.04x | 0.700 | 0.00875x |  |",
            "| shim, vmm | ok | 150.0 (1.5x) | 300.0 (1.5x) |  |",
            "| (c) shim default policy, no caching | 10.300 | 10.300 | 1.03x (target <= 1.1x: PASS) | yes | 5000 (vmm 5000) |  |",
            "| JAX, XLA_PYTHON_CLIENT_ALLOCATOR=platform (jax_program.py) | same output (vmm 1234) | not in the suite | "
            "not in the suite | not in the suite | FAIL: output differs from the native run at line 3: 'a' vs 'b' | not in the suite |",
            "| static_cudart | PASS | 5.0 | vmm 201 | allocs 201, frees 201, exit 0 |",
            "Section failed: shim, async_pool: failed (exit 1: FAIL).",
            "| shim, async_pool | failed | n/a | n/a | exit 1: FAIL |",
            "### Targets"]
    for w in want:
        check(f"results.md has {w[:70]!r}", w in lines, "\n" + md)
    check("results.md: the allocation tables one level down, their targets only at the top",
          lines.count("### Targets") == 1 and "# allocshim allocation benchmarks" not in lines
          and "### Runs" in lines, md)
    short = all_report.render_short_table(res).splitlines()
    check("short table: sections, suite counts, targets last",
          short[0].startswith("allocshim GPU run: G, commit abc") and short[0].endswith("(partial)")
          and any(l.startswith("  ipc     failed      5.0 s  shim, async_pool") for l in short)
          and "GPU suite: passed 3, failed 2, skipped 1, not run 1" in short
          and "  FAIL: jax_program.managed, ctest:bench.x" in short
          and short[-1] == "PASS  replay vmm fragmentation of the replayed mixed trace (peak reserved / peak live) "
                           "<= 1.05, no failures: 1.0400", short)
    check("short table: alloc targets name their config",
          any(l.startswith("MISS  alloc ") and l.endswith("[shim.vmm.none]") for l in short), short)
    json.dumps(res)

    with tempfile.TemporaryDirectory() as d:
        written = bench_plots.plot_bandwidth(res["sections"]["spill"]["data"], d, png=False)
        check("bandwidth plot written", [os.path.basename(p) for p in written] == ["bandwidth.svg"], written)
        root = ET.parse(written[0]).getroot()
        polylines = root.findall("{http://www.w3.org/2000/svg}polyline")
        check("bandwidth.svg: spilled, bound, managed host, managed stripe", len(polylines) == 4, len(polylines))
        texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
        check("bandwidth.svg: factors and the bound's label", "1.25x" in texts and "2x" in texts
              and "model bound 1/(f_dev/B_dev + f_host/B_host)" in texts, texts)
        check("no spill rows, no plot", bench_plots.plot_bandwidth({"rows": []}, d) == [])


# ---- part 2: end to end against fakes -----------------------------------------------------------

# `allocshim run [--quiet] [--stats F] [--trace T] [--backend B] [--conf C] -- CMD...` runs CMD with
# FAKE_UNDER_SHIM=1, FAKE_BACKEND=B (--backend, else ALLOCSHIM_BACKEND, else vmm) and FAKE_TRACED
# with --trace; writes statistics with the program's own counts (as the real shim would), and a
# trace of 3 bytes per event. `allocshim replay T --policy P --json`: numbers per backend of P.
FAKE_ALLOCSHIM = r"""#!/usr/bin/env python3
import json, os, re, subprocess, sys
a = sys.argv[1:]
def opt(name):
    return a[a.index(name) + 1] if name in a[:a.index("--") if "--" in a else len(a)] else None
if a[0] == "replay":
    kind = re.search(r'backend = "(\w+)"', open(opt("--policy")).read()).group(1)
    assert os.path.exists(a[1]) and "--json" in a, a
    if kind == os.environ.get("FAKE_REPLAY_FAIL"):
        print("allocshim replay: broken"); sys.exit(1)
    reserved, median = {"native": (1000, 80000), "async_pool": (1600, 1500), "vmm": (1040, 700)}[kind]
    print(json.dumps({"policy": "p", "error": "", "allocs": 400, "frees": 390, "failures": 0, "trace_failures": 0,
                      "recovered": 0, "alloc_ns": {"median": median}, "free_ns": {"median": 50},
                      "peak_reserved": reserved, "peak_live": 1000, "fragmentation": 0.0, "wall_ns": 1}))
    sys.exit(0)
assert a[0] == "run", a
cmd = a[a.index("--") + 1:]
backend = opt("--backend") or os.environ.get("ALLOCSHIM_BACKEND") or "vmm"
env = dict(os.environ, FAKE_UNDER_SHIM="1", FAKE_BACKEND=backend)
if opt("--trace"):
    env["FAKE_TRACED"] = "1"
p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
sys.stdout.write(p.stdout)
n = int((re.findall(r"^allocations: (\d+)$", p.stdout, re.M) or ["0"])[-1])
f = int((re.findall(r"^frees: (\d+)$", p.stdout, re.M) or [str(n)])[-1])
peak = int((re.findall(r'"peak_live_bytes":\s*(\d+)', p.stdout) or ["0"])[-1])
dev = {"device": 0, "allocs": n, "frees": f, "failures": 0, "bytes": 10 ** 9, "peak": peak, "live": 0,
       "hits": max(n - 1, 0), "misses": 1 if n else 0}
if backend in ("vmm", "async_pool"):
    dev["peak_reserved"] = int(peak * 1.02)
stats = {"pid": 1, "policy": "<default>", "error": "", "unknown_frees": 0, "api": {"alloc": n},
         "backends": [{"name": backend, "kind": backend, "devices": [dev] if n else []}]}
if opt("--stats"):
    with open(opt("--stats"), "w") as fh:
        json.dump(stats, fh)
if opt("--trace"):
    with open(opt("--trace"), "wb") as fh:
        fh.write(b"t" * (3 * (n + f)))
sys.exit(p.returncode)
"""

FAKE_PROGRAMS = {
    "alloc_loop": r"""
import os, sys
n = int(sys.argv[1] if len(sys.argv) > 1 else 20) * 7 + 1
pair = 2.0 if os.environ.get("FAKE_TRACED") else 1.0 if os.environ.get("FAKE_UNDER_SHIM") else 90.0
print(ALLOC_LOOP_OUT.format(n=n, pair=pair), end="")
""",
    "trace_bench": r"""
import os, sys
assert os.environ["LD_LIBRARY_PATH"].split(":")[0].endswith("/lib/allocshim"), os.environ["LD_LIBRARY_PATH"]
print(TRACE_BENCH_OUT, end="")
""",
    "spill_bench": r"""
import os, sys
assert os.environ.get("FAKE_UNDER_SHIM") and sys.argv[1] == "4GiB", sys.argv
print(SPILL_OUT, end="")
sys.exit(1)  # a row under 95% of its bound
""",
    "ipc_bench": r"""
import os, sys
b = os.environ.get("FAKE_BACKEND") if os.environ.get("FAKE_UNDER_SHIM") else None
if b == "async_pool":
    print("FAIL: cudaIpcGetMemHandle(&mem, block) returned cudaErrorInvalidValue"); sys.exit(1)
print(ipc_line({None: 100.0, "native": 101.0, "vmm": 150.0}[b]), end="")
""",
    "conformance_gpu_test": r"""
print("[==========] 163 tests from 4 test suites ran. (900 ms total)")
print("[  PASSED  ] 120 tests.")
print("[  SKIPPED ] 43 tests, listed below:")
""",
    "thrust_sort": r"""
import os, sys
print("arrays: " + sys.argv[1]); print("checksum: 42"); print("PASS: thrust_sort")
sys.stderr.write('{"seconds": %s}\n' % ("1.9" if os.environ.get("FAKE_UNDER_SHIM") else "2.0"))
""",
}


def write(path, text, executable=False):
    with open(path, "w") as f:
        f.write(text)
    if executable:
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def make_build(root):
    build = os.path.join(root, "build")
    os.makedirs(os.path.join(build, "bin"))
    os.makedirs(os.path.join(build, "lib"))
    write(os.path.join(build, "lib", "liballocshim.so"), "")
    shebang = "#!" + sys.executable + "\n"
    write(os.path.join(build, "bin", "allocshim"), FAKE_ALLOCSHIM.replace("#!/usr/bin/env python3\n", shebang), True)
    write(os.path.join(build, "bin", "alloc_latency"), FAKE_BENCH.replace("#!/usr/bin/env python3\n", shebang), True)
    write(os.path.join(build, "bin", "core_overhead"), FAKE_CORE_OVERHEAD.replace("#!/usr/bin/env python3\n", shebang),
          True)
    # The fake programs print the recorded output above: the same text part 1 checks.
    canned = "".join(f"{k} = {globals()[k]!r}\n" for k in ("ALLOC_LOOP_OUT", "TRACE_BENCH_OUT", "SPILL_OUT"))
    canned += inspect.getsource(ipc_line)
    for name, body in FAKE_PROGRAMS.items():
        write(os.path.join(build, "bin", name), shebang + "import json\n" + canned + body, True)
    return build

# A suite runner that prints one test and then hangs, with a child of its own.
HANGING_SUITE = r"""#!/usr/bin/env bash
echo "===== [1/2] static_cudart"
echo "PASS: static_cudart: allocs 201, frees 201, exit 0"
echo "===== [2/2] pytorch"
sleep 60 &
echo $! > "$OUT/child.pid"
wait
"""


def script(args, env, timeout=300):
    p = subprocess.run([sys.executable, os.path.join(HERE, "run_all.py")] + args, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout


def test_end_to_end(cc):
    with tempfile.TemporaryDirectory() as root:
        build = make_build(root)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCSHIM_")}

        rc, text = script([build, os.path.join(root, "nogpu"), "--commit", "c0ffee"],
                          dict(env, LD_LIBRARY_PATH=os.path.join(root, "nowhere")))
        res = json.load(open(os.path.join(root, "nogpu", "results.json")))
        check("no GPU: exit 77, nothing run, results say why", rc == 77 and "SKIPPED: no GPU/driver" in text and
              all(s["status"] == "skipped" and s["reason"].startswith("no GPU/driver")
                  for s in res["sections"].values()), text)
        if not cc:
            print("(no --cc: the runs against a fake libcuda.so.1 are left out)")
            return
        libdir = os.path.join(root, "fakecuda")
        os.makedirs(libdir)
        write(os.path.join(root, "libcuda.c"), FAKE_LIBCUDA)
        subprocess.run([cc, "-shared", "-fPIC", "-o", os.path.join(libdir, "libcuda.so.1"),
                        os.path.join(root, "libcuda.c")], check=True)
        env["LD_LIBRARY_PATH"] = libdir + os.pathsep + env.get("LD_LIBRARY_PATH", "")

        out = os.path.join(root, "out")
        rc, text = script([build, out, "--commit", "feedbeef", "--quick", "--time-limit", "240",
                           "--suite-filter", "^(static_cudart|alloc_loop\\.vmm|pytorch\\.async_pool|conformance_gpu_test)$"],
                          dict(env, FAKE_REPLAY_FAIL="async_pool"))
        res = json.load(open(os.path.join(out, "results.json")))
        st = {k: v["status"] for k, v in res["sections"].items()}
        check("e2e: exit 1 (a section failed), every section ran", rc == 1 and st == {
            "suite": "ok", "alloc": "ok", "real": "ok", "spill": "ok", "trace": "ok", "replay": "failed",
            "ipc": "failed"}, (rc, st, text[-3000:]))
        suite = {t["name"]: t for t in res["sections"]["suite"]["data"]["tests"]}
        check("e2e: the real suite script on fakes, conformance_gpu_test after it",
              list(suite) == ["static_cudart", "alloc_loop.vmm", "pytorch.async_pool", "conformance_gpu_test"]
              and suite["conformance_gpu_test"]["detail"] == "120 passed, 0 failed, 43 skipped"
              and suite["static_cudart"]["result"] == "PASS" and suite["alloc_loop.vmm"]["served"] == "vmm 141"
              and suite["pytorch.async_pool"]["result"] == "SKIPPED", suite)
        check("e2e: suite result lines echoed as they come", "  PASS: static_cudart: allocs 141" in text, text[:2000])
        alloc = res["sections"]["alloc"]["data"]
        check("e2e: run_benchmarks.py's results inside, with its commit", alloc["meta"]["commit"] == "feedbeef"
              and len(alloc["runs"]) == 29 and alloc["latency"], alloc["meta"])
        real = res["sections"]["real"]["data"]
        check("e2e: real programs: torch skipped (no torch here), thrust measured",
              all(r["detail"].startswith("skipped") for r in real["torch"]["rows"])
              and close(real["thrust"]["rows"][1]["ratio"], 0.95)
              and all(r["identical"] for r in real["thrust"]["rows"]), real)
        sp = res["sections"]["spill"]["data"]
        check("e2e: spill parsed, exit 1 is a MISS not a failure", len(sp["rows"]) == 3, sp)
        tr = res["sections"]["trace"]["data"]
        check("e2e: tracing: ratios, added ns, bytes per event", close(tr["traced_vs_untraced_pair"], 2.0)
              and close(tr["added_ns_per_event"], 500.0) and close(tr["loop_bytes_per_event"], 3.0)
              and tr["bench"]["median_ns"] == 5012, tr)
        rp = {r["backend"]: r for r in res["sections"]["replay"]["data"]["backends"]}
        check("e2e: replay per backend, a failing one recorded",
              close(rp["vmm"]["fragmentation"], 1.04) and rp["async_pool"]["status"] == "failed"
              and close(rp["vmm"]["alloc_vs_native"], 700 / 80000)
              and res["sections"]["replay"]["data"]["record"]["trace_bytes"] > 0, rp)
        ipc = res["sections"]["ipc"]["data"]["configs"]
        check("e2e: ipc against native, async_pool's failure recorded",
              [c["status"] for c in ipc] == ["ok", "ok", "ok", "failed"]
              and close(ipc[2]["sizes"][0]["total_vs_native"], 1.5) and "cudaErrorInvalidValue" in ipc[3]["reason"], ipc)
        targets = {(t["section"], t["target"][:20]): t["passed"] for t in res["targets"]}
        check("e2e: targets from every section", {s for s, _ in targets} == {"alloc", "real", "spill", "trace", "replay"}
              and targets[("replay", "vmm fragmentation of")] is True, targets)
        files = sorted(os.listdir(out))
        check("e2e: the listed files, no folders", files == ["bandwidth.svg", "churn.svg", "latency.svg", "logs.tar.gz",
                                                             "results.json", "results.md"], files)
        import tarfile
        names = tarfile.open(os.path.join(out, "logs.tar.gz")).getnames()
        check("e2e: logs archived", "logs/suite.log" in names and "suite/gpu-suite.log" in names
              and "alloc/results.json" in names and "logs/replay.vmm.log" in names, names)
        tail = text.rstrip().splitlines()
        check("e2e: the short table last", tail[-1].startswith(("PASS", "MISS", "n/a")) and
              any(l.startswith("GPU suite: passed 3, failed 0, skipped 1") for l in tail), tail[-30:])
        check("e2e: meta", res["meta"]["commit"] == "feedbeef" and res["meta"]["partial"] is False
              and res["meta"]["command"].startswith("tools/bench/run_all.py "), res["meta"])

        md = open(os.path.join(out, "results.md")).read()
        for f in ("results.md", "latency.svg", "bandwidth.svg"):
            os.remove(os.path.join(out, f))
        rc2, text2 = script(["--from-results", os.path.join(out, "results.json")], env)
        check("--from-results: results.md and plots redrawn the same",
              rc2 == 0 and open(os.path.join(out, "results.md")).read() == md
              and os.path.exists(os.path.join(out, "bandwidth.svg")), text2)

        # run_benchmarks.py's own results.json: drawn as the allocation section.
        alone = os.path.join(root, "alone")
        os.makedirs(alone)
        with open(os.path.join(alone, "results.json"), "w") as f:
            json.dump(res["sections"]["alloc"]["data"], f)
        rc2, text2 = script(["--from-results", os.path.join(alone, "results.json")], env)
        md = open(os.path.join(alone, "results.md")).read()
        check("--from-results of run_benchmarks.py's results: the allocation section",
              rc2 == 0 and "![alloc+free latency per size per backend](latency.svg)" in md
              and "| alloc | allocation latency, churn, fragmentation | ok |" in md, text2)

        # A suite that hangs at its time limit: what finished counts, the rest is NOT RUN, the run goes on.
        hang = os.path.join(root, "hang")
        os.makedirs(hang)
        write(os.path.join(root, "hang.sh"), HANGING_SUITE, True)
        rc, text = script([build, hang, "--quick", "--only", "suite,trace", "--time-limit", "60",
                           "--section-time", "suite=3", "--suite-script", os.path.join(root, "hang.sh")],
                          env, timeout=120)
        res = json.load(open(os.path.join(hang, "results.json")))
        s = res["sections"]["suite"]
        tests = {t["name"]: t["result"] for t in s["data"]["tests"]}
        check("time limit: suite partial, finished test kept, the rest NOT RUN",
              s["status"] == "partial" and "time limit" in s["reason"] and tests["static_cudart"] == "PASS"
              and tests["pytorch"] == "NOT RUN" and s["data"]["not_run"] == len(tests) - 1, (s["reason"], tests))
        check("time limit: the next section still ran, partial flagged, exit 0",
              res["sections"]["trace"]["status"] == "ok" and res["meta"]["partial"] is True
              and res["sections"]["alloc"]["reason"] == "left out (--skip/--only)" and rc == 0, (rc, text[-2000:]))
        import tarfile
        pid = tarfile.open(os.path.join(hang, "logs.tar.gz")).extractfile("suite/child.pid").read().decode().strip()
        check("time limit: the suite's own child is gone too", pid and not process_alive(int(pid)), pid)

        # A missing program and a section that raises: recorded, and the others go on.
        # In this process: its loader never saw the fake libcuda's LD_LIBRARY_PATH, so the probe is replaced.
        os.remove(os.path.join(build, "bin", "spill_bench"))
        boom = lambda ctx, budget: 1 / 0  # noqa: E731
        saved = run_all.RUNNERS["ipc"], run_all.gpu_absent_reason
        run_all.RUNNERS["ipc"], run_all.gpu_absent_reason = boom, lambda: None
        try:
            rc = run_all.main([build, os.path.join(root, "broken"), "--quick", "--only", "spill,ipc,trace"])
        finally:
            run_all.RUNNERS["ipc"], run_all.gpu_absent_reason = saved
        res = json.load(open(os.path.join(root, "broken", "results.json")))
        sec = res["sections"]
        check("a missing program fails its section only", sec["spill"]["status"] == "failed"
              and sec["spill"]["reason"].endswith("bin/spill_bench is missing (not built?)")
              and sec["trace"]["status"] == "ok", sec["spill"])
        check("a section that raises is recorded", sec["ipc"]["status"] == "failed"
              and sec["ipc"]["reason"].startswith("ZeroDivisionError") and rc == 1, sec["ipc"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cc", help="a C compiler, for the fake libcuda.so.1 of the end-to-end runs")
    args = ap.parse_args()
    suite = test_suite()
    parts = test_sections()
    test_budget()
    test_merge()
    test_report(canned_results(suite, *parts))
    test_end_to_end(args.cc)
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed")
    return 0 if RESULTS["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
