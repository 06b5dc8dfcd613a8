#!/usr/bin/env python3
"""Self-test of the benchmark scripts, with no GPU:

1. bench_results on canned input: parsing, the shim's statistics, ratios against native,
   fragmentation, the targets, the markdown and the short table, exact values and lines;
2. bench_plots: the SVG is well-formed and has one line per series;
3. run_benchmarks.py end to end against a fake `allocshim run` (writes statistics as the shim
   would, or an unimplemented backend's fallback) and alloc_latency built on a mock CUDA runtime
   (--mock-bench; a small Python stand-in otherwise): results, unavailable backends, no GPU (exit
   77), a missing shim statistics file (exit 1), missing binaries (exit 2), the time limit,
   --from-results.

    test_run_benchmarks.py [--mock-bench PATH]

Prints one line per check and "N passed, N failed" last; exit status 0 when all pass.
"""

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_plots  # noqa: E402
import bench_results as br  # noqa: E402
import run_benchmarks as rb  # noqa: E402

RESULTS = {"passed": 0, "failed": 0}


def check(name, cond, detail=""):
    RESULTS["passed" if cond else "failed"] += 1
    print(f"{'ok  ' if cond else 'FAIL'} {name}" + (f": {detail}" if detail and not cond else ""), flush=True)
    return cond


def close(a, b, tol=1e-9):
    return a is not None and b is not None and abs(a - b) <= tol * max(1.0, abs(b))


# ---- canned input ------------------------------------------------------------------------------

def lat(api, size, med, p90=None):
    return {"bench": "latency", "api": api, "size": size, "reps": 1000, "warmup": 100,
            "pair_median_ns": med, "pair_p90_ns": p90 or med * 2, "pair_min_ns": med // 2,
            "pair_mean_ns": med * 1.1, "alloc_median_ns": med // 2, "free_median_ns": med // 2}


def done(n):
    return {"bench": "done", "allocations": n, "frees": n}


def stats(kind, allocs, peak=0, peak_reserved=None, error="", hits=0, misses=0):
    dev = {"device": 0, "allocs": allocs, "frees": allocs, "failures": 0, "bytes": 1, "peak": peak, "live": 0,
           "time_ns": 1, "hits": hits, "misses": misses, "latency_log2_ns": [0] * 32}
    if peak_reserved is not None:
        dev["peak_reserved"] = peak_reserved
    return {"pid": 1, "policy": "<default>", "error": error,
            "backends": [{"name": kind, "kind": kind, "devices": [dev]}], "host": {"devices": []},
            "created": {"devices": []}, "api": {"alloc": allocs}, "unknown_frees": 0}


def run(workload, backend, free_sync, records, st=None, status="ok", reason=""):
    name = f"native.{workload}" if backend is None else f"shim.{backend}.{free_sync}.{workload}"
    return {"name": name, "workload": workload, "backend": backend, "free_sync": free_sync, "status": status,
            "reason": reason, "seconds": 1.5, "records": records, "stats": st, "cmd": ["x"], "log": name + ".log"}


def canned_runs():
    K, M = 256, 1 << 20
    info = {"bench": "info", "name": "Mock GPU", "driver_version": 13000, "runtime_version": 13000,
            "clock_overhead_ns": 20}
    return [
        run("latency", None, None, [info, lat("malloc", K, 80000), lat("malloc", M, 100000), done(10)]),
        run("async", None, None, [lat("malloc_async", K, 1300), lat("malloc_async", M, 1400),
                                  lat("malloc_async_sync", K, 4000), lat("malloc_async_sync", M, 4100), done(10)]),
        run("mixed", None, None, [{"bench": "mixed", "allocs": 500, "peak_live_bytes": 1000, "seconds": 2.0},
                                  done(500)]),
        run("churn", None, None, [{"bench": "churn", "threads": 1, "pairs": 100, "pairs_per_s": 10000.0,
                                   "pair_median_ns": 90000, "pair_p90_ns": 99000},
                                  {"bench": "churn", "threads": 16, "pairs": 100, "pairs_per_s": 8000.0,
                                   "pair_median_ns": 1500000, "pair_p90_ns": 2000000}, done(100)]),
        run("latency", "vmm", "none", [lat("malloc", K, 200), lat("malloc", M, 250), done(10)],
            stats("vmm", 10, hits=8, misses=2)),
        run("latency", "vmm", "barrier", [lat("malloc", K, 2500), lat("malloc", M, 3500), done(10)],
            stats("vmm", 10)),
        run("latency", "async_pool", "none", [lat("malloc", K, 400), lat("malloc", M, 280), done(10)],
            stats("async_pool", 10)),
        run("latency", "native", "none", [lat("malloc", K, 80800), lat("malloc", M, 101000), done(10)],
            stats("native", 9)),
        run("mixed", "vmm", "none", [{"bench": "mixed", "allocs": 500, "peak_live_bytes": 1000, "seconds": 0.5},
                                     done(500)], stats("vmm", 500, peak=1000, peak_reserved=1040)),
        run("mixed", "async_pool", "none", [{"bench": "mixed", "allocs": 500, "peak_live_bytes": 1000,
                                             "seconds": 1.0}, done(500)],
            stats("async_pool", 500, peak=1000, peak_reserved=1500)),
        run("mixed", "vmm", "device", [{"bench": "mixed", "allocs": 500, "peak_live_bytes": 1000, "seconds": 1.0},
                                       done(500)], stats("vmm", 500, peak=1000)),
        run("churn", "vmm", "none", [{"bench": "churn", "threads": 1, "pairs": 100, "pairs_per_s": 2000000.0,
                                      "pair_median_ns": 300, "pair_p90_ns": 400}, done(100)], stats("vmm", 100)),
        run("latency", "vmm", "device", [], None, status="unavailable", reason="vmm is not implemented"),
        dict(run("core_overhead", None, None, [{"bench": "core_overhead", "threads": 1, "direct_ns_per_pair": 7.4,
                                                "core_ns_per_pair": 223.17, "added_ns_per_call": 107.89}]),
             name="core_overhead"),
    ]


def test_parsing():
    text = 'hello\n{"bench":"info","name":"X"}\n{"bench":"latency", broken\n  {"bench":"done","allocations":3}\n{"x":1}\n'
    recs = br.parse_records(text)
    check("parse_records keeps the {\"bench\"} lines and skips broken ones",
          [r["bench"] for r in recs] == ["info", "done"], recs)
    s = br.stats_summary(stats("vmm", 7, peak=100, peak_reserved=150, hits=5, misses=2), "vmm")
    check("stats_summary totals a kind", (s["allocs"], s["peak"], s["peak_reserved"], s["hits"]) == (7, 100, 150, 5), s)
    check("stats_summary without peak_reserved gives None", br.stats_summary(stats("vmm", 1))["peak_reserved"] is None)
    other = dict(stats("vmm", 1), backends=[{"kind": "vmm", "devices": [{"allocs": 1, "peak_reserved_bytes": 9}]}])
    check("stats_summary reads peak_reserved_bytes too", br.stats_summary(other)["peak_reserved"] == 9)
    check("an active backend has no inactive reason", br.backend_inactive_reason(stats("vmm", 3), "vmm") is None)
    why = br.backend_inactive_reason(stats("native", 3, error="vmm: not implemented"), "vmm")
    check("a fallback is reported with the shim's error", why == "vmm: not implemented", why)
    why = br.backend_inactive_reason(stats("native", 3), "vmm")
    check("a silent fallback names who served", why == "no allocation served by vmm (served: native 3)", why)

    r = {"backend": "vmm", "workload": "latency"}
    ok = "x\n" + json.dumps(done(1)) + "\n"
    cases = [((77, "SKIPPED: no GPU/driver: none\n", "", None), ("skipped", "no GPU/driver: none")),
             ((1, "FAIL: cudaMalloc\n", "", None), ("failed", "exit 1: FAIL: cudaMalloc")),
             ((0, "no done line\n", "", stats("vmm", 1)), ("failed", 'no {"bench":"done"} line in the output')),
             ((0, ok, "", None), ("failed", "no statistics written: was the shim loaded?")),
             ((0, ok, "", stats("native", 1, error="no vmm")), ("unavailable", "no vmm")),
             ((0, ok, "", stats("vmm", 1)), ("ok", ""))]
    for args, want in cases:
        got = rb.judge(r, *args)
        check(f"judge -> {want[0]}", got == want, got)
    check("judge of a native run needs no statistics",
          rb.judge({"backend": None, "workload": "latency"}, 0, ok, "", None) == ("ok", ""))
    co = '{"bench":"core_overhead","threads":1}\n'
    check("judge of core_overhead wants its records",
          rb.judge({"backend": None, "workload": "core_overhead"}, 0, co, "", None) == ("ok", "") and
          rb.judge({"backend": None, "workload": "core_overhead"}, 0, "x\n", "", None)[0] == "failed")


def test_results():
    res = br.build_results({"date": "D", "gpu": "G", "driver": "580", "cuda_driver": "13.0", "cuda_runtime": "13.0",
                            "commit": "abc", "host": "h", "total_seconds": 12.0, "time_limit": 330,
                            "clock_overhead_ns": 20}, canned_runs())
    lat = {(p["config"], p["size"]): p for p in res["latency"]}
    p = lat[("shim.vmm.none", 256)]
    check("ratio to cudaMalloc", close(p["ratio_vs_malloc"], 200 / 80000), p["ratio_vs_malloc"])
    check("ratio to cudaMallocAsync", close(p["ratio_vs_malloc_async"], 200 / 1300), p["ratio_vs_malloc_async"])
    check("native's own ratio is 1", close(lat[("native.malloc", 1 << 20)]["ratio_vs_malloc"], 1.0))
    check("async+sync series kept", close(lat[("native.malloc_async_sync", 256)]["ratio_vs_malloc"], 4000 / 80000))
    check("unavailable runs give no series", not any(c == "shim.vmm.device" for c, _ in lat))

    churn = {(c["config"], c["threads"]): c for c in res["churn"]}
    check("churn throughput ratio", close(churn[("shim.vmm.none", 1)]["throughput_vs_native"], 200.0))
    check("churn median ratio", close(churn[("shim.vmm.none", 1)]["median_vs_native"], 300 / 90000))

    frag = {f["config"]: f for f in res["fragmentation"]}
    check("vmm fragmentation = peak reserved / program peak live", close(frag["shim.vmm.none"]["fragmentation"], 1.04))
    check("async_pool fragmentation beside it", close(frag["shim.async_pool.none"]["fragmentation"], 1.5))
    check("mixed time against native", close(frag["shim.vmm.none"]["time_vs_native"], 0.25))
    check("no peak_reserved: fragmentation None with a note",
          frag["shim.vmm.device"]["fragmentation"] is None and "note" in frag["shim.vmm.device"])

    t = {(x["config"], x["target"].split(":")[0]): x for x in res["targets"]}
    none_vmm = t[("shim.vmm.none", "pool hit, free_sync=none")]
    check("target none, vmm: worst size, PASS", (none_vmm["value"], none_vmm["at_size"], none_vmm["passed"]) ==
          (250, 1 << 20, True), none_vmm)
    none_ap = t[("shim.async_pool.none", "pool hit, free_sync=none")]
    check("target none, async_pool: MISS at 256 B", (none_ap["value"], none_ap["at_size"], none_ap["passed"]) ==
          (400, 256, False), none_ap)
    check("target barrier, vmm: MISS", t[("shim.vmm.barrier", "pool hit, free_sync=barrier")]["passed"] is False)
    check("target barrier, async_pool: not measured",
          t[("shim.async_pool.barrier", "pool hit, free_sync=barrier")]["passed"] is None)
    fr = [x for x in res["targets"] if x["config"] == "shim.vmm.none" and x["unit"] == "ratio"]
    check("target vmm fragmentation PASS", len(fr) == 1 and fr[0]["passed"] is True, fr)
    check("run entries check the shim's counts",
          [r["shim"]["counts_match"] for r in res["runs"] if r["name"] == "shim.native.none.latency"] == [False])
    json.dumps(res)  # serializable

    md = br.render_markdown(res)
    want_lines = [
        "# allocshim allocation benchmarks",
        "- GPU: G, driver 580 (CUDA driver API 13.0, runtime 13.0)",
        "- commit: abc",
        "| config | 256 B | 1 MiB |",
        "| cudaMalloc+cudaFree (native) | 80.0 (1x) | 100.0 (1x) |",
        "| cudaMallocAsync+cudaFreeAsync (native) | 1.30 (0.0163x) | 1.40 (0.014x) |",
        "| shim vmm, free_sync=none | 0.200 (0.0025x) | 0.250 (0.0025x) |",
        "| shim vmm, free_sync=barrier | 2.50 (0.0312x) | 3.50 (0.035x) |",
        "| shim native, free_sync=none | 80.8 (1.01x) | 101.0 (1.01x) |",
        "| shim vmm, free_sync=none | 0.154x | 0.179x |",
        "| pool hit, free_sync=none: pair median <= 0.3 us at every size | shim.vmm.none | 0.250 us (worst at 1 MiB) | PASS |",
        "| pool hit, free_sync=none: pair median <= 0.3 us at every size | shim.async_pool.none | 0.400 us (worst at 256 B) | MISS |",
        "| vmm fragmentation (peak reserved / peak live), mixed workload, free_sync=none <= 1.05 | shim.vmm.none | 1.0400 | PASS |",
        "| shim vmm, free_sync=none | 1000 B | 1000 B | 1.0 KiB | 1.0400 | 0.25x |  |",
        "| shim vmm, free_sync=none | 2000000 (200x), 0.300 | n/a |",
        "| native (no shim) | 10000 (1x), 90.0 | 8000 (1x), 1500 |",
        "| shim.vmm.device.latency | unavailable | 1.5 | vmm is not implemented |",
        "| shim.vmm.none.latency | ok | 1.5 | shim: 10 allocs, hits 8, misses 2 |",
        "| shim.native.none.latency | ok | 1.5 | shim: 9 allocs; program made 10: COUNTS DIFFER |",
        "| 1 | 7.4 | 223.2 | 107.9 |",
    ]
    lines = md.splitlines()
    for w in want_lines:
        check(f"markdown has {w[:70]!r}", w in lines, "\n" + md)
    check("markdown table order: natives first",
          lines.index("| cudaMalloc+cudaFree (native) | 80.0 (1x) | 100.0 (1x) |") <
          lines.index("| shim native, free_sync=none | 80.8 (1.01x) | 101.0 (1.01x) |"))

    short = br.render_short_table(res).splitlines()
    check("short table: header with sizes, churn and fragmentation",
          short[1].split() == ["config", "256", "B", "1", "MiB", "churn@16/s", "frag"], short[1])
    row = next((l for l in short if l.startswith("shim vmm, free_sync=none")), "")
    check("short table: vmm none row", row.split()[-4:] == ["0.200", "0.250", "1.040"] or
          row.split()[3:] == ["0.200", "0.250", "1.040"], row)
    check("short table: targets last", short[-1].startswith(("PASS", "MISS", "n/a")), short[-1])
    return res


def test_plots(res):
    with tempfile.TemporaryDirectory() as d:
        written = bench_plots.plot_all(res, d, png=False)
        check("plots: latency.svg and churn.svg written",
              sorted(os.path.basename(p) for p in written) == ["churn.svg", "latency.svg"], written)
        root = ET.parse(os.path.join(d, "latency.svg")).getroot()
        lines = root.findall("{http://www.w3.org/2000/svg}polyline")
        # none: cudaMalloc, cudaMallocAsync, shim native, async_pool, vmm; barrier: 2 natives + vmm;
        # device: the 2 natives.
        check("latency.svg: one polyline per series", len(lines) == 5 + 3 + 2, len(lines))
        texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
        check("latency.svg: size labels", "256 B" in texts and "1 MiB" in texts, texts)
        png = bench_plots.plot_all(res, d, png=True)
        try:
            import matplotlib  # noqa: F401
            check("plots: PNG written where matplotlib imports", any(p.endswith("latency.png") for p in png), png)
        except ImportError:
            check("plots: no PNG without matplotlib", not any(p.endswith(".png") for p in png), png)
        empty = dict(res, latency=[], churn=[])
        check("plots: nothing to draw, nothing written", bench_plots.plot_all(empty, d, png=False) == [])


# ---- end to end against fakes ------------------------------------------------------------------

# `allocshim run --stats F --backend B --conf free_sync=S -- CMD...`: runs CMD, passes its output
# through, and writes statistics as the shim would: served by B with the program's own counts, and
# for pooling backends a peak reserved of FAKE_FRAG x the program's peak live. B listed in
# FAKE_UNAVAILABLE falls back to native with an error; FAKE_NO_STATS writes nothing.
FAKE_ALLOCSHIM = r"""#!/usr/bin/env python3
import json, os, re, subprocess, sys
a = sys.argv[1:]
assert a[0] == "run", a
stats_path, backend = a[a.index("--stats") + 1], a[a.index("--backend") + 1]
cmd = a[a.index("--") + 1:]
p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
sys.stdout.write(p.stdout)
n = int((re.findall(r"^allocations: (\d+)$", p.stdout, re.M) or ["0"])[-1])
peak = int((re.findall(r'"peak_live_bytes":\s*(\d+)', p.stdout) or ["0"])[-1])
unavailable = os.environ.get("FAKE_UNAVAILABLE", "").split(",")
kind = "native" if backend in unavailable else backend
dev = {"device": 0, "allocs": n, "frees": n, "failures": 0, "bytes": n, "peak": peak, "live": 0,
       "time_ns": 1, "hits": max(n - 1, 0), "misses": 1 if n else 0}
if kind in ("vmm", "async_pool"):
    dev["peak_reserved"] = int(peak * float(os.environ.get("FAKE_FRAG_" + kind, "1.02")))
stats = {"pid": 1, "policy": "<default>", "error": f"backend {backend} is not implemented" if kind != backend else "",
         "backends": [{"name": kind, "kind": kind, "devices": [dev] if n else []}], "unknown_frees": 0}
if not os.environ.get("FAKE_NO_STATS"):
    with open(stats_path, "w") as f:
        json.dump(stats, f)
sys.exit(p.returncode)
"""

# Without --mock-bench: a stand-in for alloc_latency that prints one record of each kind.
FAKE_BENCH = r"""#!/usr/bin/env python3
import json, os, sys
if os.environ.get("MOCK_CUDA_NO_DEVICE") == "1":
    print("SKIPPED: no GPU/driver: no driver (fake)"); sys.exit(77)
if os.environ.get("FAKE_HANG"):  # hang, with a child of its own: the script must end both
    import subprocess, time
    child = subprocess.Popen(["sleep", "60"])
    with open(os.environ["FAKE_HANG"], "w") as f:
        f.write(str(child.pid))
    time.sleep(60)
a = sys.argv[1:]
print(json.dumps({"bench": "info", "name": "Fake GPU", "driver_version": 13000, "runtime_version": 13000,
                  "clock_overhead_ns": 20}))
if "--threads" in a:
    for t in a[a.index("--threads") + 1].split(","):
        print(json.dumps({"bench": "churn", "threads": int(t), "pairs": 100, "pairs_per_s": 1000.0 * int(t),
                          "pair_median_ns": 1000, "pair_p90_ns": 2000}))
elif "--mixed" in a:
    print(json.dumps({"bench": "mixed", "allocs": 50, "peak_live_bytes": 1 << 20, "seconds": 0.1}))
else:
    apis = ["malloc_async", "malloc_async_sync"] if "--async" in a else ["malloc"]
    for api in apis:
        for s in (256, 1 << 20):
            print(json.dumps({"bench": "latency", "api": api, "size": s, "reps": 10, "pair_median_ns": 500,
                              "pair_p90_ns": 600, "pair_min_ns": 400, "alloc_median_ns": 250, "free_median_ns": 250}))
print("allocations: 50"); print("frees: 50")
print(json.dumps({"bench": "done", "allocations": 50, "frees": 50}))
"""


FAKE_CORE_OVERHEAD = r"""#!/usr/bin/env python3
import json, sys
assert int(sys.argv[1]) > 0
for t in (1, 2):
    print(json.dumps({"bench": "core_overhead", "threads": t, "direct_ns_per_pair": 7.0,
                      "core_ns_per_pair": 100.0 * t, "added_ns_per_call": 46.5 * t}))
"""


def make_build(root, mock_bench):
    """A build tree with bin/allocshim (the fake) and bin/alloc_latency (mock_bench, or FAKE_BENCH)."""
    bindir = os.path.join(root, "build", "bin")
    os.makedirs(bindir)
    os.makedirs(os.path.join(root, "build", "lib"))
    shim = os.path.join(bindir, "allocshim")
    with open(shim, "w") as f:
        f.write(FAKE_ALLOCSHIM.replace("#!/usr/bin/env python3", "#!" + sys.executable, 1))
    bench = os.path.join(bindir, "alloc_latency")
    if mock_bench:
        shutil.copy(mock_bench, bench)
    else:
        with open(bench, "w") as f:
            f.write(FAKE_BENCH.replace("#!/usr/bin/env python3", "#!" + sys.executable, 1))
    core = os.path.join(bindir, "core_overhead")
    with open(core, "w") as f:
        f.write(FAKE_CORE_OVERHEAD.replace("#!/usr/bin/env python3", "#!" + sys.executable, 1))
    for p in (shim, bench, core):
        os.chmod(p, os.stat(p).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return os.path.join(root, "build")


def process_alive(pid):
    """True while pid runs (a zombie, or a process that is gone, is not running)."""
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


def script(args, env_extra=None, timeout=240):
    env = dict(os.environ)
    env.update(env_extra or {})
    p = subprocess.run([sys.executable, os.path.join(HERE, "run_benchmarks.py")] + args, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout


def test_end_to_end(mock_bench):
    with tempfile.TemporaryDirectory() as root:
        build = make_build(root, mock_bench)
        out = os.path.join(root, "out")
        rc, text = script([build, out, "--quick", "--commit", "feedbeef", "--no-png"],
                          {"FAKE_UNAVAILABLE": "async_pool", "FAKE_FRAG_vmm": "1.03"})
        check("e2e: exit 0", rc == 0, text[-3000:])
        res = json.load(open(os.path.join(out, "results.json")))
        status = {r["name"]: r["status"] for r in res["runs"]}
        check("e2e: 29 runs planned", len(status) == 29, len(status))
        check("e2e: core_overhead ran last", res["runs"][-1]["name"] == "core_overhead"
              and status["core_overhead"] == "ok" and [c["threads"] for c in res["core_overhead"]] == [1, 2],
              res["runs"][-1])
        check("e2e: native runs ok", all(status[f"native.{w}"] == "ok" for w in ("latency", "async", "mixed", "churn")),
              status)
        check("e2e: async_pool unavailable everywhere",
              all(v == "unavailable" for k, v in status.items() if ".async_pool." in k), status)
        check("e2e: vmm and native backends ok",
              all(v == "ok" for k, v in status.items() if ".vmm." in k or ".native." in k), status)
        reasons = {r["reason"] for r in res["runs"] if r["status"] == "unavailable"}
        check("e2e: the shim's error is the reason", reasons == {"backend async_pool is not implemented"}, reasons)
        frag = {f["config"]: f["fragmentation"] for f in res["fragmentation"]}
        check("e2e: vmm fragmentation from the stats and the program's peak",
              set(frag) == {"shim.vmm.device", "shim.vmm.barrier", "shim.vmm.none"}
              and all(abs(v - 1.03) < 1e-3 for v in frag.values()), frag)
        sizes = sorted({p["size"] for p in res["latency"]})
        want_sizes = [256, 4096, 65536, 1 << 20, 16 << 20, 256 << 20, 1 << 30] if mock_bench else [256, 1 << 20]
        check("e2e: latency at every size", sizes == want_sizes, sizes)
        check("e2e: every latency point has a ratio to cudaMalloc",
              all(p["ratio_vs_malloc"] is not None for p in res["latency"]))
        threads = sorted({c["threads"] for c in res["churn"]})
        check("e2e: churn 1..16 threads", threads == [1, 2, 4, 8, 16], threads)
        check("e2e: counts match the program's",
              all(r["shim"]["counts_match"] for r in res["runs"] if r.get("shim") and r["status"] == "ok"))
        check("e2e: meta", res["meta"]["commit"] == "feedbeef" and res["meta"]["cuda_driver"] == "13.0"
              and res["meta"]["total_seconds"] > 0, res["meta"])
        for f in ("results.md", "latency.svg", "churn.svg", "logs/native.latency.log",
                  "stats/shim.vmm.none.mixed.json"):
            check(f"e2e: wrote {f}", os.path.exists(os.path.join(out, f)))
        tail = text.rstrip().splitlines()
        check("e2e: targets printed last", tail[-1].startswith(("PASS", "MISS", "n/a")), tail[-1])
        check("e2e: progress lines", "[ 1/29] native.latency" in text and "elapsed" in text)

        os.remove(os.path.join(out, "results.md"))
        rc, text = script(["--from-results", os.path.join(out, "results.json"), "--no-png"])
        check("--from-results redraws results.md", rc == 0 and os.path.exists(os.path.join(out, "results.md")), text)

        if mock_bench:
            rc, text = script([build, os.path.join(root, "limit"), "--quick", "--backends", "vmm", "--free-sync",
                               "none"], {"MOCK_CUDA_FAIL_ABOVE": str(256 << 20)})
            res = json.load(open(os.path.join(root, "limit", "results.json")))
            runs = {r["name"]: r for r in res["runs"]}
            sizes = sorted(p["size"] for p in res["latency"] if p["config"] == "native.malloc")
            check("a refused size: the run goes on without it, and says so",
                  rc == 0 and runs["native.latency"]["status"] == "ok" and sizes[-1] == 256 << 20
                  and runs["native.latency"]["unmeasured"] == ["malloc 1 GiB: cudaErrorMemoryAllocation: out of memory"],
                  (rc, runs["native.latency"], sizes))
            md = open(os.path.join(root, "limit", "results.md")).read()
            check("a refused size is in results.md", "not measured: malloc 1 GiB: cudaErrorMemoryAllocation" in md, md)

        rc, text = script([build, os.path.join(root, "nogpu"), "--quick"], {"MOCK_CUDA_NO_DEVICE": "1"})
        check("no GPU: exit 77 with a message", rc == 77 and "SKIPPED: no GPU/driver" in text
              and "no GPU/driver: no GPU/driver" not in text, text)

        rc, text = script([build, os.path.join(root, "nostats"), "--quick", "--backends", "vmm",
                           "--free-sync", "none"], {"FAKE_NO_STATS": "1"})
        check("no statistics: exit 1, the runs failed", rc == 1 and "FAILED: shim.vmm.none.latency" in text, text)

        rc, text = script([build, os.path.join(root, "late"), "--quick", "--time-limit", "0.5"])
        res = json.load(open(os.path.join(root, "late", "results.json")))
        check("time limit: every run skipped, exit 0",
              rc == 0 and all(r["status"] == "skipped" and r["reason"].startswith("time limit")
                              for r in res["runs"]), text)

        hang_root = os.path.join(root, "hang")
        hang_build = make_build(hang_root, None)
        pidfile = os.path.join(hang_root, "child.pid")
        rc, text = script([hang_build, os.path.join(hang_root, "out"), "--quick", "--time-limit", "2"],
                          {"FAKE_HANG": pidfile})
        res = json.load(open(os.path.join(hang_root, "out", "results.json")))
        first = res["runs"][0]
        check("a hung run is killed at the time limit and fails", rc == 1 and first["status"] == "failed"
              and first["reason"].startswith("timed out"), (rc, first))
        check("the runs after it are skipped", all(r["status"] == "skipped" for r in res["runs"][1:]))
        check("the hung program's own child is gone too", not process_alive(int(open(pidfile).read())))

        rc, text = script([os.path.join(root, "nowhere"), os.path.join(root, "x")])
        check("missing binaries: exit 2", rc == 2 and "alloc_latency" in text, text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mock-bench", help="alloc_latency built on the mock CUDA runtime (alloc_latency_mock)")
    args = ap.parse_args()
    test_parsing()
    res = test_results()
    test_plots(res)
    test_end_to_end(args.mock_bench)
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed")
    return 0 if RESULTS["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
