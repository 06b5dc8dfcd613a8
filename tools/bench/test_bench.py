#!/usr/bin/env python3
"""Self-test of bench.py, with no GPU:

1. recorded output of the sections through their parsers (bench_results.py for alloc,
   all_results.py for the others): ratios against the native path, PASS/MISS, exact values; the
   time shares; a script section's summary; results.md;
2. bench.py end to end against a build of fakes (a fake `allocshim`, alloc_latency built on the
   mock CUDA runtime, programs that print what the real ones print) and a fake libcuda.so.1 for
   the GPU probe: the real run_gpu_suite.sh, run_benchmarks.py and real_programs_bench.py run on
   them; failures recorded while the others go on; a suite stopped at its time limit; no GPU
   (the host-only sections still run); --from-results.

    test_bench.py --mock-bench PATH --cc CC

Prints one line per check and "N passed, N failed" last; exit status 0 when all pass.
"""

import argparse
import inspect
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "gpu"))

import all_report  # noqa: E402
import all_results as ar  # noqa: E402
import all_sections  # noqa: E402
import bench  # noqa: E402
import bench_results as br  # noqa: E402
import run_benchmarks as rb  # noqa: E402
from harness_selftest import FAKE_LIBCUDA  # noqa: E402

RESULTS = {"passed": 0, "failed": 0}


def check(name, cond, detail=""):
    RESULTS["passed" if cond else "failed"] += 1
    print(f"{'ok  ' if cond else 'FAIL'} {name}" + (f": {detail}" if detail and not cond else ""), flush=True)


def close(a, b, tol=1e-9):
    return a is not None and b is not None and abs(a - b) <= tol * max(1.0, abs(b))


# ---- recorded output ----------------------------------------------------------------------------

SUITE_OUT = """===== [1/4] static_cudart
--- stats: served by kind: vmm 201; by api: alloc 201
PASS: static_cudart: allocs 201, frees 201, exit 0
===== [2/4] pytorch.async_pool
--- stats: served by kind: async_pool 60; by api: alloc 60
PASS: pytorch.async_pool: backend async_pool, allocs 60, frees 60, output identical to native, exit 0
===== [3/4] cupy.host
SKIPPED: cupy.host: backend host not active: allocations were served by native
===== [4/4] jax_program.managed
FAIL: jax_program.managed: output differs from the native run at line 3: 'a' vs 'b'
""".splitlines()

SPILL_OUT = """| factor | size | f_host | spilled GB/s | bound GB/s | spilled/bound | managed host GB/s | managed stripe GB/s |
|---|---|---|---|---|---|---|---|
| 1.25 | 5.00 GiB | 0.200 | 150.0 | 240.0 | 62.5% | 20.0 | 230.0 |
| 1.50 | 6.00 GiB | 0.333 | 148.5 | 150.0 | 99.0% | skipped | skipped |

B_dev 2315.0 GB/s (device buffer), B_host 51.0 GB/s (pinned host, mapped), budget 4.00 GiB
summary: spilled reads at >= 62.5% of the model bound (target 95%)
"""

TRACE_BENCH_OUT = """trace_bench: 400000 events (8 sites, 20 frames deep + main), native stacks
  unwinder                libunwind 1.6 (per-thread cache)
  per event (alloc+free)  median 5012 ns   p90 8300 ns   p99 9100 ns   mean 5400 ns
  alloc (with unwind)     median 8300 ns   p90 9000 ns
  free                    median 200 ns   p90 250 ns
  file                    145000 bytes, 0.36 bytes per event (/tmp/trace_bench.1.trace)
"""

ALLOC_LOOP_OUT = "allocations: {n}\nfrees: {n}\ntime per alloc+free pair: {pair:.2f} us\nPASS: alloc_loop\n"


def replay_json(reserved, alloc_median, failures=0):
    return json.dumps({"allocs": 20000, "frees": 19990, "failures": failures, "alloc_ns": {"median": alloc_median},
                       "free_ns": {"median": 100}, "peak_reserved": reserved, "peak_live": 1000})


def ipc_line(total):
    """ipc_bench's output, with totals of `total` us at 4 KiB and twice that at 1 MiB."""
    sizes = [{"bytes": b, "get_p50": total / 4, "open_p50": total / 2, "close_p50": total / 4,
              "total_p50": total * (k + 1)}
             for k, b in enumerate((4096, 1 << 20))]
    return "json: " + json.dumps({"unit": "us", "sizes": sizes}) + "\nallocations: 14\nfrees: 14\n"


def lat(api, size, med):
    return {"bench": "latency", "api": api, "size": size, "pair_median_ns": med, "pair_p90_ns": med * 2,
            "alloc_median_ns": med // 2, "free_median_ns": med // 2}


def stats(kind, allocs, peak=0, peak_reserved=None, error=""):
    dev = {"device": 0, "allocs": allocs, "frees": allocs, "peak": peak, "hits": allocs, "misses": 0}
    if peak_reserved is not None:
        dev["peak_reserved"] = peak_reserved
    return {"error": error, "backends": [{"name": kind, "kind": kind, "devices": [dev]}], "api": {"alloc": allocs}}


def alloc_run(workload, backend, sync, records, st=None, status="ok"):
    name = f"native.{workload}" if backend is None else f"shim.{backend}.{sync}.{workload}"
    return {"name": name, "workload": workload, "backend": backend, "free_sync": sync, "status": status,
            "reason": "", "seconds": 1.5, "records": records + [{"bench": "done", "allocations": 10, "frees": 10}],
            "stats": st}


def mixed(peak):
    return [{"bench": "mixed", "allocs": 500, "peak_live_bytes": peak, "seconds": 1.0}]


# ---- part 1 -------------------------------------------------------------------------------------

def test_alloc():
    K, M = 256, 1 << 20
    runs = [alloc_run("latency", None, None, [lat("malloc", K, 80000), lat("malloc", M, 100000)]),
            alloc_run("async", None, None, [lat("malloc_async", K, 1300), lat("malloc_async", M, 1400)]),
            alloc_run("mixed", None, None, mixed(1000)),
            alloc_run("churn", None, None, [{"bench": "churn", "threads": 1, "pairs_per_s": 10000.0,
                                             "pair_median_ns": 90000}]),
            alloc_run("latency", "vmm", "none", [lat("malloc", K, 200), lat("malloc", M, 250)], stats("vmm", 10)),
            alloc_run("latency", "vmm", "barrier", [lat("malloc", K, 2500), lat("malloc", M, 3500)], stats("vmm", 10)),
            alloc_run("latency", "async_pool", "none", [lat("malloc", K, 400), lat("malloc", M, 280)],
                      stats("async_pool", 10)),
            alloc_run("mixed", "vmm", "none", mixed(1000), stats("vmm", 500, peak=1000, peak_reserved=1040)),
            alloc_run("mixed", "vmm", "device", mixed(1000), stats("vmm", 500, peak=1000)),
            alloc_run("churn", "vmm", "none", [{"bench": "churn", "threads": 1, "pairs_per_s": 2000000.0,
                                                "pair_median_ns": 300}], stats("vmm", 100))]
    res = br.build_results({"commit": "abc"}, runs)
    lat_ = {(p["config"], p["size"]): p for p in res["latency"]}
    check("alloc: ratio to cudaMalloc and to cudaMallocAsync", close(lat_[("shim.vmm.none", K)]["ratio_vs_malloc"],
          200 / 80000) and close(lat_[("shim.vmm.none", K)]["ratio_vs_malloc_async"], 200 / 1300))
    churn = {(c["config"], c["threads"]): c for c in res["churn"]}
    check("alloc: churn throughput ratio", close(churn[("shim.vmm.none", 1)]["throughput_vs_native"], 200.0))
    frag = {f["config"]: f for f in res["fragmentation"]}
    check("alloc: fragmentation = peak reserved / program peak live", close(frag["shim.vmm.none"]["fragmentation"], 1.04)
          and frag["shim.vmm.device"]["fragmentation"] is None)
    t = {(x["config"], x["target"].split(":")[0]): x["passed"] for x in res["targets"]}
    check("alloc: targets: none PASS (vmm), MISS (async_pool); barrier MISS; not measured",
          (t[("shim.vmm.none", "pool hit, free_sync=none")], t[("shim.async_pool.none", "pool hit, free_sync=none")],
           t[("shim.vmm.barrier", "pool hit, free_sync=barrier")],
           t[("shim.async_pool.barrier", "pool hit, free_sync=barrier")]) == (True, False, False, None), t)
    ok = json.dumps({"bench": "done"}) + "\n"
    r = {"backend": "vmm", "workload": "latency"}
    cases = [((77, "SKIPPED: no GPU/driver: none\n", "", None), ("skipped", "no GPU/driver: none")),
             ((0, ok, "", None), ("failed", "no statistics written: was the shim loaded?")),
             ((0, ok, "", stats("native", 1, error="no vmm")), ("unavailable", "no vmm")),
             ((0, ok, "", stats("vmm", 1)), ("ok", ""))]
    check("alloc: judge: skipped, no statistics, a fallback, ok",
          [rb.judge(r, *a) for a, _ in cases] == [w for _, w in cases], [rb.judge(r, *a) for a, _ in cases])
    md = br.render_markdown(res).splitlines()
    check("alloc: results.md rows", "| shim vmm, free_sync=none | 0.200 (0.0025x) | 0.250 (0.0025x) |" in md, md)


def test_sections():
    s = ar.parse_suite(SUITE_OUT, None, ["static_cudart", "pytorch.async_pool", "cupy.host", "jax_program.managed",
                                         "pytorch.host"])
    by = {t["name"]: t for t in s["tests"]}
    check("suite: counts, served by kind, a name not reached NOT RUN",
          (s["passed"], s["failed"], s["skipped"], s["not_run"]) == (2, 1, 1, 1)
          and by["static_cudart"]["served"] == "vmm 201" and by["pytorch.host"]["result"] == "NOT RUN", s)
    compat = ar.compatibility(s)
    check("suite: compatibility cells", all_report.compat_cell(compat["pytorch"]["async_pool"], "async_pool")
          == "same output, counts exact" and compat["jax_program"]["managed"]["result"] == "FAIL", compat["pytorch"])

    sp = ar.parse_spill(SPILL_OUT)
    check("spill: fraction of the bound, against managed", close(sp["rows"][0]["of_bound"], 150 / 240)
          and close(sp["rows"][0]["vs_managed_host"], 7.5) and sp["rows"][1]["vs_managed_host"] is None, sp)
    check("spill: targets MISS, PASS", [x["passed"] for x in ar.spill_targets(sp)] == [False, True])

    b = ar.parse_trace_bench(TRACE_BENCH_OUT)
    check("trace_bench parsed", (b["median_ns"], b["p99_ns"], b["free_median_ns"], b["bytes_per_event"])
          == (5012, 9100, 200, 0.36), b)
    loops = {k: dict(ar.parse_alloc_loop(ALLOC_LOOP_OUT.format(n=7001, pair=pair)), status="ok", seconds=1.0)
             for k, pair in (("native", 90.0), ("shim", 1.5), ("traced", 2.5))}
    tr = ar.trace_results(b, loops, trace_bytes=42006)
    check("trace: added per event, bytes per event", close(tr["added_ns_per_event"], 500.0)
          and close(tr["loop_bytes_per_event"], 3.0) and close(tr["traced_vs_untraced_pair"], 2.5 / 1.5), tr)
    check("trace: median MISS, bytes PASS", [x["passed"] for x in ar.trace_targets(tr)] == [False, True])

    rp = ar.replay_results({}, [("native", "ok", "", ar.parse_replay("warning\n" + replay_json(1000, 80000))),
                                ("vmm", "ok", "", ar.parse_replay(replay_json(1040, 700)))])
    vmm = rp["backends"][1]
    check("replay: fragmentation, against native", close(vmm["fragmentation"], 1.04)
          and close(vmm["alloc_vs_native"], 700 / 80000) and ar.replay_targets(rp)[0]["passed"] is True, vmm)
    bad = ar.replay_results({}, [("vmm", "ok", "", ar.parse_replay(replay_json(1040, 700, failures=3)))])
    check("replay: failures make it a MISS", ar.replay_targets(bad)[0]["passed"] is False)

    ipc = ar.ipc_results([("native (no shim)", "ok", "", ar.parse_ipc(ipc_line(100.0))),
                          ("shim, vmm", "ok", "", ar.parse_ipc(ipc_line(150.0)))])
    check("ipc: total against native per size", [round(x["total_vs_native"], 6) for x in ipc["configs"][1]["sizes"]]
          == [1.5, 1.5])

    def row(name, best):
        return {"name": name, "best": best, "identical": True, "failed": False}
    real = ar.real_results({"torch": {"target_row": "(c)", "rows": [row("(a)", 10.0), row("(c)", 10.3)]},
                            "thrust": {"rows": [row("native", 2.0), row("shim", 1.98)]}})
    check("real: ratios, target PASS", close(real["torch"]["rows"][1]["ratio"], 1.03)
          and close(real["thrust"]["rows"][1]["ratio"], 0.99) and ar.real_targets(real)[0]["passed"] is True, real)

    check("records: the program's JSON lines", ar.parse_records('x\n{"bench":"core_overhead","threads":2}\n{"bench":"o"}\n',
                                                                "core_overhead") == [{"threads": 2}])
    check("script summary: headings go under the section's", ar.script_results(["# A", "| x |"])["summary"]
          == ["#### A", "| x |"] and ar.script_results(["ignored"], ["t"])["summary"] == ["t"])

    en = [s for s in ar.SECTIONS if s not in ar.BASE_SECTIONS]
    sh = bench.SHARE
    check("budget: the suite's share of the time left", close(bench.budget_for("suite", en, 1000),
                                                               1000 * sh["suite"] / sum(sh[n] for n in en)))
    later_min = sum(bench.MINIMUM[n] for n in en[1:])
    check("budget: later sections keep their minimums", close(bench.budget_for("suite", en, later_min + 45), 45))
    check("budget: a capped later section claims no more than its cap",
          close(bench.budget_for("alloc", ["alloc", "launch"], 200, caps={"launch": 25}), 200 * sh["alloc"] / (sh["alloc"] + 25)))
    check("budget: too little left: skipped", bench.budget_for("models", en, 20) is None)
    check("budget: no time limit: the section's maximum", bench.budget_for("alloc", en, float("inf"))
          == bench.MAXIMUM["alloc"])
    m = all_sections.merge
    check("merge: one failed; one left out for time: partial", m([("a", "ok", ""), ("b", "failed", "x")])[0] == "failed"
          and m([("a", "ok", ""), ("b", "skipped", "time limit")])[0] == "partial")
    return s, sp


def test_script_section(suite, sp):
    with tempfile.TemporaryDirectory() as d:
        args = argparse.Namespace(build=d, out=d, python=sys.executable, quick=False)
        ctx = all_sections.Context(args)
        os.makedirs(ctx.work)
        prog = os.path.join(d, "s.sh")
        with open(prog, "w") as f:
            f.write('echo "| a | 1 |" > "$1/table.txt"; echo noise; exit 1\n')
        r = all_sections.section_script(ctx, 10, "models", ["sh", prog, "{out}"])
        check("script section: its table.txt is the summary, exit 1 fails it",
              r["status"] == "failed" and r["data"]["summary"] == ["| a | 1 |"]
              and ctx.commands["models"] == [f"sh {prog} {ctx.work}/models"], r)
    sections = {"suite": {"status": "ok", "data": suite, "commands": ["run_gpu_suite.sh B"]},
                "spill": {"status": "ok", "data": sp}, "models": r,
                "ipc": {"status": "skipped", "reason": all_report.LEFT_OUT}}
    res = bench.build_results({"commit": "abc", "command": "tools/bench/bench.py b o", "time_limit": None}, sections)
    md = all_report.render_markdown(res).splitlines()
    for w in ["- commit: abc", "- command: `tools/bench/bench.py b o`", "- total: 0 s (no time limit)",
              "    run_gpu_suite.sh B", "| 1.25 | 5.00 | 0.200 | 150.0 | 240.0 | 62.5% | 20.0 | 7.5x | 230.0 | 95.8% |",
              "| a | 1 |", "| spill | spilled reads at factor 1.25 >= 95% of the model bound | budget.spill=host, "
              "f_host 0.200 | 62.5% of bound | MISS |"]:
        check(f"results.md has {w[:60]!r}", w in md, "\n".join(md))
    check("results.md: a section left out is not shown", not any("(`ipc`)" in l for l in md))


# ---- share_bench.sh against a fake share_bench ------------------------------------------------

# `share_bench --mode M [--rounds R] [--passes P]`: a sweep of 6 GiB read and written at 2294 GB/s
# (5.6 ms a pass); shared runs lose FAKE_CHANGE_S per turn change; the link 47 GB/s both ways.
FAKE_SHARE_BENCH = r"""
a = sys.argv[1:]
o = dict(zip(a[::2], a[1::2]))
mode, rounds, passes = o["--mode"], int(o.get("--rounds", 3)), int(o.get("--passes", 10))
if mode == "link":
    print("link: host->device 55.2 GB/s, device->host 55.0 GB/s, both at once 47.0 GB/s each way"); sys.exit(0)
turn = passes * 12 * 2**30 / 2294e9
for r in range(rounds):
    print("proc 0 round %d: idle 0.00 s, active %.3f s, 2294.0 GB/s (read+write)" % (r, turn))
turns = 2 * rounds * turn + (float(os.environ["FAKE_CHANGE_S"]) * (2 * rounds - 1) if mode == "shared" else 0)
print("share_bench %s: 2 processes x 6.0 GiB, %d rounds x %d passes: %.2f s total, turns %.2f s, exit 0"
      % (mode, rounds, passes, turns + 1.0, turns))
"""


def test_share_script():
    with tempfile.TemporaryDirectory() as d:
        bindir = os.path.join(d, "bin")
        os.makedirs(bindir)
        shebang = "#!" + sys.executable + "\n"
        programs = {"share_bench": shebang + "import os, sys\n" + FAKE_SHARE_BENCH,
                    "allocshim": "#!/bin/sh\n"
                                 'case $1 in --version) echo fake;; check) exit 0;; '
                                 'run) while [ "$1" != -- ]; do shift; done; shift; exec "$@";; esac\n'}
        for name, text in programs.items():
            path = os.path.join(bindir, name)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, 0o755)
        stats = os.path.join(d, "stats")
        env = dict(os.environ, SHARE_ROUNDS="2", FAKE_CHANGE_S="0.5",
                   SHARE_RUNS="^(long )?(sequential|shared, migrate auto(, start together)?)$")
        p = subprocess.run(["bash", os.path.join(HERE, "share_bench.sh"), d, stats], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        out = p.stdout.splitlines()
        # Long turns: 20 x (4 GiB at 47 GB/s) of compute, in whole passes of 12 GiB at 2294 GB/s.
        move = 4 * 2**30 / 47e9
        want = -(-20 * move // (12 * 2**30 / 2294e9))
        check("share_bench.sh: long turns of 20x the link time of a change, in passes",
              p.returncode == 0 and f"share_bench --rounds 2 --passes {want:.0f}" in out, p.stdout)
        check("share_bench.sh: a long run's own options follow its rounds and passes",
              f"share_bench --rounds 2 --passes {want:.0f} --start together" in out
              and "## long shared, migrate auto, start apart" not in out, p.stdout)
        check("share_bench.sh: long off only where SHARE_RUNS names it, rounds interleaved",
              "## long shared, migrate off" not in out and "## shared, migrate auto, round 2" in out
              and out.index("## shared, migrate auto, round 2") < out.index("## sequential, round 2"), p.stdout)

        def row(label):
            return next((l.split(" | ") for l in out if l.startswith(f"| {label} | ")), None)
        turn = 10 * 12 * 2**30 / 2294e9
        seq, shared = 6 * turn, 6 * turn + 5 * 0.5
        r = row("shared, migrate auto, round 2")
        check("share_bench.sh: a shared row's turn ratio and its bound at the link's rate",
              r is not None and close(float(r[4]), round(round(seq, 2) / round(shared, 2), 2))
              and close(float(r[5].rstrip(" |")), round(round(seq, 2) / (round(seq, 2) + 5 * round(move, 4)), 2)), r)
        lt = want * 12 * 2**30 / 2294e9
        r = row("long shared, migrate auto")
        check("share_bench.sh: long turns pair with the long sequential run of their round",
              r is not None and close(float(r[2]), round((4 * lt + 1) / (4 * lt + 1.5 + 1), 2), 0.02)
              and r[5].rstrip(" |") == "0.96", r)
        check("share_bench.sh: the stats folder it was given stays", os.path.isdir(stats))


# ---- part 2: end to end against fakes -----------------------------------------------------------

# `allocshim run [--quiet] [--stats F] [--trace T] [--backend B] [--conf C] -- CMD...` runs CMD with
# FAKE_UNDER_SHIM=1, FAKE_BACKEND=B and FAKE_TRACED with --trace; writes statistics with the
# program's own counts, and a trace of 3 bytes per event. `allocshim replay T --policy P --json`:
# numbers per backend of P (FAKE_REPLAY_FAIL names one that fails).
FAKE_ALLOCSHIM = r"""#!/usr/bin/env python3
import json, os, re, subprocess, sys
a = sys.argv[1:]
def opt(name):
    return a[a.index(name) + 1] if name in a[:a.index("--") if "--" in a else len(a)] else None
if a[0] == "replay":
    kind = re.search(r'backend = "(\w+)"', open(opt("--policy")).read()).group(1)
    if kind == os.environ.get("FAKE_REPLAY_FAIL"):
        print("allocshim replay: broken"); sys.exit(1)
    reserved, median = {"native": (1000, 80000), "async_pool": (1600, 1500), "vmm": (1040, 700)}[kind]
    print(json.dumps({"allocs": 400, "frees": 390, "failures": 0, "alloc_ns": {"median": median},
                      "free_ns": {"median": 50}, "peak_reserved": reserved, "peak_live": 1000}))
    sys.exit(0)
cmd = a[a.index("--") + 1:]
backend = opt("--backend") or os.environ.get("ALLOCSHIM_BACKEND") or "vmm"
env = dict(os.environ, FAKE_UNDER_SHIM="1", FAKE_BACKEND=backend, FAKE_TRACED="1" if opt("--trace") else "")
p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
sys.stdout.write(p.stdout)
n = int((re.findall(r"^allocations: (\d+)$", p.stdout, re.M) or ["0"])[-1])
peak = int((re.findall(r'"peak_live_bytes":\s*(\d+)', p.stdout) or ["0"])[-1])
dev = {"device": 0, "allocs": n, "frees": n, "peak": peak, "hits": max(n - 1, 0), "misses": 1 if n else 0,
       "peak_reserved": int(peak * 1.02)}
stats = {"error": "", "api": {"alloc": n}, "backends": [{"name": backend, "kind": backend, "devices": [dev] if n else []}]}
if opt("--stats"):
    json.dump(stats, open(opt("--stats"), "w"))
if opt("--trace"):
    open(opt("--trace"), "wb").write(b"t" * (6 * n))
sys.exit(p.returncode)
"""

FAKE_PROGRAMS = {
    "alloc_loop": """
n = int(sys.argv[1] if len(sys.argv) > 1 else 20) * 7 + 1
pair = 2.0 if os.environ.get("FAKE_TRACED") else 1.0 if os.environ.get("FAKE_UNDER_SHIM") else 90.0
print(ALLOC_LOOP_OUT.format(n=n, pair=pair), end="")
""",
    "trace_bench": "print(TRACE_BENCH_OUT, end='')",
    "spill_bench": "print(SPILL_OUT, end=''); sys.exit(1)  # a row under 95% of its bound",
    "ipc_bench": """
b = os.environ.get("FAKE_BACKEND") if os.environ.get("FAKE_UNDER_SHIM") else None
if b == "async_pool":
    print("FAIL: cudaIpcGetMemHandle returned cudaErrorInvalidValue"); sys.exit(1)
print(ipc_line({None: 100.0, "native": 101.0, "vmm": 150.0}[b]), end="")
""",
    "conformance_gpu_test": "print('[  PASSED  ] 120 tests.')",
    "thrust_sort": """
print("checksum: 42"); print("PASS: thrust_sort")
sys.stderr.write('{"seconds": %s}\\n' % ("1.9" if os.environ.get("FAKE_UNDER_SHIM") else "2.0"))
""",
    "core_overhead": """
for t in (1, 2):
    print(json.dumps({"bench": "core_overhead", "threads": t, "direct_ns_per_pair": 7.0, "core_ns_per_pair": 100.0 * t}))
""",
    "launch_overhead": 'print(json.dumps({"bench": "launch_overhead", "threads": 1, "direct_ns": 1.5, "idle_ns": 2.0}))',
    "policy_match_bench": 'print("10 ns")',
    "policy_load_bench": 'print("1 s")',
}

# A suite runner that prints one test and then hangs, with a child of its own.
HANGING_SUITE = """echo "===== [1/2] static_cudart"
echo "PASS: static_cudart: allocs 201, frees 201, exit 0"
echo "===== [2/2] pytorch"
sleep 60 &
echo $! > "$OUT/child.pid"
wait
"""


def make_build(root, mock_bench):
    build = os.path.join(root, "build")
    bindir = os.path.join(build, "bin")
    os.makedirs(bindir)
    os.makedirs(os.path.join(build, "lib"))
    open(os.path.join(build, "lib", "liballocshim.so"), "w").close()
    shebang = "#!" + sys.executable + "\n"
    canned = "".join(f"{k} = {globals()[k]!r}\n" for k in ("ALLOC_LOOP_OUT", "TRACE_BENCH_OUT", "SPILL_OUT"))
    canned += inspect.getsource(ipc_line)
    programs = {"allocshim": FAKE_ALLOCSHIM.replace("#!/usr/bin/env python3\n", shebang)}
    programs.update({k: shebang + "import json, os, sys\n" + canned + v for k, v in FAKE_PROGRAMS.items()})
    for name, text in programs.items():
        path = os.path.join(bindir, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    shutil.copy(mock_bench, os.path.join(bindir, "alloc_latency"))
    return build


def process_alive(pid):
    import time
    for _ in range(50):  # the orphan is reaped by init a moment after the kill
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return False
        except OSError:
            return False
        time.sleep(0.1)
    return True


def has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except Exception:
        return False
    return True


def run_bench(args, env, timeout=300):
    p = subprocess.run([sys.executable, os.path.join(HERE, "bench.py")] + args, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout


def test_end_to_end(mock_bench, cc):
    with tempfile.TemporaryDirectory() as root:
        build = make_build(root, mock_bench)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCSHIM_")}
        nogpu = dict(env, LD_LIBRARY_PATH=os.path.join(root, "nowhere"))
        rc, text = run_bench([build, os.path.join(root, "nogpu"), "--quick", "--commit", "c0ffee"], nogpu)
        res = json.load(open(os.path.join(root, "nogpu", "results.json")))
        st = {k: v["status"] for k, v in res["sections"].items()}
        check("no GPU: the host-only sections run, the others are skipped, exit 0",
              rc == 0 and st["core_overhead"] == "ok" and st["launch_overhead"] == "ok" and st["policy"] == "ok"
              and st["suite"] == "skipped" and res["sections"]["policy"]["data"]["summary"][2:4] == ["```", "10 ns"]
              and res["sections"]["core_overhead"]["data"]["records"][1]["core_ns_per_pair"] == 200.0, (rc, st, text))
        rc, text = run_bench([build, os.path.join(root, "nogpu2"), "--only", "suite"], nogpu)
        check("no GPU and only GPU sections: exit 77", rc == 77 and "SKIPPED: no GPU/driver" in text, text)

        libdir = os.path.join(root, "fakecuda")
        os.makedirs(libdir)
        with open(os.path.join(root, "libcuda.c"), "w") as f:
            f.write(FAKE_LIBCUDA)
        subprocess.run([cc, "-shared", "-fPIC", "-o", os.path.join(libdir, "libcuda.so.1"),
                        os.path.join(root, "libcuda.c")], check=True)
        env["LD_LIBRARY_PATH"] = libdir + os.pathsep + env.get("LD_LIBRARY_PATH", "")

        out = os.path.join(root, "out")
        rc, text = run_bench([build, out, "--commit", "feedbeef", "--quick", "--time-limit", "240",
                              "--skip", "sync,migrate,launch,models,share,hitpath",
                              "--suite-filter", "^(static_cudart|alloc_loop\\.vmm|conformance_gpu_test)$"],
                             dict(env, FAKE_REPLAY_FAIL="async_pool"))
        res = json.load(open(os.path.join(out, "results.json")))
        st = {k: v["status"] for k, v in res["sections"].items() if v["reason"] != all_report.LEFT_OUT}
        check("e2e: exit 1 (a section failed), every section ran", rc == 1 and st == {
            "suite": "ok", "alloc": "ok", "real": "ok", "spill": "ok", "trace": "ok", "replay": "failed",
            "ipc": "failed", "core_overhead": "ok", "launch_overhead": "ok", "policy": "ok"}, (rc, st, text[-3000:]))
        suite = {t["name"]: t for t in res["sections"]["suite"]["data"]["tests"]}
        check("e2e: the real suite script on fakes, conformance_gpu_test after it",
              list(suite) == ["static_cudart", "alloc_loop.vmm", "conformance_gpu_test"]
              and suite["alloc_loop.vmm"]["served"] == "vmm 141", suite)
        alloc = res["sections"]["alloc"]["data"]
        check("e2e: run_benchmarks.py on the mock alloc_latency, every size, ratios",
              alloc["meta"]["commit"] == "feedbeef" and len({p["size"] for p in alloc["latency"]}) == 7
              and all(p["ratio_vs_malloc"] is not None for p in alloc["latency"]), alloc["meta"])
        thrust = res["sections"]["real"]["data"]["thrust"]["rows"]
        check("e2e: real programs: thrust measured against native", close(thrust[1]["ratio"], 0.95), thrust)
        tr = res["sections"]["trace"]["data"]
        check("e2e: tracing ratios", close(tr["traced_vs_untraced_pair"], 2.0) and close(tr["added_ns_per_event"], 500.0),
              tr)
        rp = {r["backend"]: r["status"] for r in res["sections"]["replay"]["data"]["backends"]}
        ipc = [c["status"] for c in res["sections"]["ipc"]["data"]["configs"]]
        check("e2e: a failing replay and IPC config recorded, the others measured",
              rp == {"native": "ok", "async_pool": "failed", "vmm": "ok"} and ipc == ["ok", "ok", "ok", "failed"],
              (rp, ipc))
        check("e2e: commands recorded per section", res["sections"]["spill"]["commands"][0].endswith("spill_bench 4GiB"),
              res["sections"]["spill"]["commands"])
        plots = {"headline.png", "latency.png", "bandwidth.png"} if has_matplotlib() else set()
        check("e2e: a folder: results, plots (where matplotlib imports), logs/",
              {"results.md", "results.json", "logs"} | plots <= set(os.listdir(out))
              and os.path.exists(os.path.join(out, "logs", "suite", "gpu-suite.log"))
              and os.path.exists(os.path.join(out, "logs", "alloc", "results.json")), os.listdir(out))
        check("e2e: the short table last", text.rstrip().splitlines()[-1].startswith(("PASS", "MISS", "n/a")), text[-500:])

        md = open(os.path.join(out, "results.md")).read()
        os.remove(os.path.join(out, "results.md"))
        rc2, text2 = run_bench(["--from-results", os.path.join(out, "results.json")], env)
        check("--from-results: results.md redrawn the same", rc2 == 0 and open(os.path.join(out, "results.md")).read()
              == md, text2)

        hang = os.path.join(root, "hang")
        with open(os.path.join(root, "hang.sh"), "w") as f:
            f.write(HANGING_SUITE)
        rc, text = run_bench([build, hang, "--quick", "--only", "suite,trace", "--time-limit", "60", "--section-time",
                              "suite=3", "--suite-script", os.path.join(root, "hang.sh")], env, timeout=120)
        res = json.load(open(os.path.join(hang, "results.json")))
        s = res["sections"]["suite"]
        tests = {t["name"]: t["result"] for t in s["data"]["tests"]}
        check("time limit: suite partial, finished test kept, the next section ran, exit 0",
              s["status"] == "partial" and tests["static_cudart"] == "PASS" and tests["pytorch"] == "NOT RUN"
              and res["sections"]["trace"]["status"] == "ok" and rc == 0, (rc, s["reason"], tests))
        pid = open(os.path.join(hang, "logs", "suite", "child.pid")).read().strip()
        check("time limit: the suite's own child is gone too", not process_alive(int(pid)), pid)

        # In this process (its loader never saw the fake libcuda, so the probe is replaced): a
        # section that raises and a missing program are recorded, and the others go on.
        os.remove(os.path.join(build, "bin", "spill_bench"))
        saved = bench.RUNNERS["ipc"], bench.gpu_absent_reason
        bench.RUNNERS["ipc"], bench.gpu_absent_reason = (lambda ctx, budget: 1 / 0), (lambda: None)
        try:
            rc = bench.main([build, os.path.join(root, "broken"), "--quick", "--only", "spill,ipc,trace"])
        finally:
            bench.RUNNERS["ipc"], bench.gpu_absent_reason = saved
        sec = json.load(open(os.path.join(root, "broken", "results.json")))["sections"]
        check("a section that raises and a missing program fail their sections only",
              rc == 1 and sec["ipc"]["reason"].startswith("ZeroDivisionError") and sec["trace"]["status"] == "ok"
              and sec["spill"]["reason"].endswith("bin/spill_bench is missing (not built?)"), sec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mock-bench", required=True, help="alloc_latency built on the mock CUDA runtime")
    ap.add_argument("--cc", required=True, help="a C compiler, for the fake libcuda.so.1")
    args = ap.parse_args()
    test_alloc()
    test_script_section(*test_sections())
    test_share_script()
    test_end_to_end(args.mock_bench, args.cc)
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed")
    return 0 if RESULTS["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
