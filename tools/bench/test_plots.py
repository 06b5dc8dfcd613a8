#!/usr/bin/env python3
"""bench.py draws its plots from a results.json: a small one in, a PNG out for each plot.

usage: test_plots.py      (exit 0 passed, 1 failed, 77 skipped: matplotlib does not import here)

Runs `bench.py --from-results` on a results.json of two sizes, two thread counts and two spill
factors, then checks each PNG (headline.png, the README's plot, among them) and that results.md
shows it. Then the same with matplotlib hidden: one line says the plots were skipped, and
results.md is written without them.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SKIP = 77


def latency(config, size, us):
    ns = round(us * 1000)
    return {"config": config, "size": size, "pair_median_ns": ns, "pair_min_ns": ns, "pair_p90_ns": ns,
            "alloc_median_ns": ns // 2, "free_median_ns": ns // 2, "reps": 100, "ratio_vs_malloc": us / 60.0,
            "ratio_vs_malloc_async": us}


def churn(config, threads, rate):
    return {"config": config, "threads": threads, "pairs_per_s": rate, "pairs": int(rate), "pair_median_ns": 1000,
            "pair_p90_ns": 2000, "median_vs_native": 1.0, "throughput_vs_native": 1.0}


RESULTS = {
    "meta": {"gpu": "a test GPU", "commit": "feedbeef", "command": "tools/bench/bench.py BUILD OUT"},
    "sections": {
        "alloc": {"status": "ok", "reason": "", "data": {
            "meta": {},
            "latency": [latency(c, size, us) for c, us in (("native.malloc", 60.0), ("native.malloc_async", 1.0),
                                                           ("shim.vmm.device", 0.6), ("shim.vmm.none", 0.2))
                        for size in (256, 1 << 20)],
            "churn": [churn(c, t, rate * t) for c, rate in (("native", 2e4), ("shim.vmm.none", 1e6)) for t in (1, 16)],
            "fragmentation": [], "runs": [], "targets": []}},
        "spill": {"status": "ok", "reason": "", "data": {
            "b_dev": 3000.0, "b_host": 50.0, "budget_gib": 4.0,
            "rows": [{"factor": f, "size_gib": 4.0 * f, "f_host": 1 - 1 / f, "spilled_gbps": gbps,
                      "bound_gbps": gbps * 0.98, "of_bound": 1.02, "managed_host_gbps": 40.0,
                      "vs_managed_host": gbps / 40.0, "managed_stripe_gbps": None,
                      "managed_stripe_of_bound": None} for f, gbps in ((1.25, 250.0), (2.0, 100.0))]}},
    },
}

RESULTS_COUNT = {"passed": 0, "failed": 0}


def check(name, ok, detail=""):
    RESULTS_COUNT["passed" if ok else "failed"] += 1
    print(("ok    " if ok else "FAIL  ") + name + ("" if ok else f": {detail}"))


def redraw(folder, env=None):
    path = os.path.join(folder, "results.json")
    with open(path, "w") as f:
        json.dump(RESULTS, f)
    p = subprocess.run([sys.executable, os.path.join(HERE, "bench.py"), "--from-results", path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=120)
    return p.returncode, p.stdout


def main():
    try:
        import matplotlib  # noqa: F401
    except Exception as e:
        print(f"SKIPPED: matplotlib does not import ({e.__class__.__name__}): install python3-matplotlib")
        return SKIP
    with tempfile.TemporaryDirectory() as root:
        drawn = os.path.join(root, "drawn")
        os.mkdir(drawn)
        rc, out = redraw(drawn)
        check("--from-results exits 0", rc == 0, out)
        for name in ("headline.png", "latency.png", "churn.png", "bandwidth.png"):
            path = os.path.join(drawn, name)
            head = open(path, "rb").read(8) if os.path.exists(path) else b""
            check(f"{name} is a PNG", head == PNG_MAGIC and os.path.getsize(path) > 1000, (os.listdir(drawn), out))
        md = open(os.path.join(drawn, "results.md")).read()
        check("results.md shows the headline plot", "](headline.png)" in md, md[:800])

        # matplotlib hidden: a package of that name that fails to import comes first on the path.
        hidden = os.path.join(root, "hidden")
        os.makedirs(os.path.join(hidden, "matplotlib"))
        with open(os.path.join(hidden, "matplotlib", "__init__.py"), "w") as f:
            f.write("raise ImportError('hidden by test_plots.py')\n")
        bare = os.path.join(root, "bare")
        os.mkdir(bare)
        env = dict(os.environ, PYTHONPATH=hidden + os.pathsep + os.environ.get("PYTHONPATH", ""))
        rc, out = redraw(bare, env)
        said = [l for l in out.splitlines() if l.startswith("plots skipped")]
        check("without matplotlib: exit 0, one line says the plots were skipped, no PNG, results.md written",
              rc == 0 and len(said) == 1 and not [n for n in os.listdir(bare) if n.endswith(".png")]
              and os.path.exists(os.path.join(bare, "results.md")), (rc, out, os.listdir(bare)))
    print(f"{RESULTS_COUNT['passed']} passed, {RESULTS_COUNT['failed']} failed")
    return 0 if RESULTS_COUNT["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
