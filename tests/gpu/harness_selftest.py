#!/usr/bin/env python3
"""Self-test of the GPU test harness, with no GPU: check_stats.py and run_gpu_suite.sh against
a fake libcuda.so.1 (cuInit and cuDeviceGetCount only, enough for the GPU probe), a fake
`allocshim run` that writes chosen statistics, and fake programs that print chosen counts.
Checks that each PASS/FAIL/SKIPPED path of the harness is taken when it should be, so a
harness bug is found here and not on the GPU machine.

    harness_selftest.py [--cc CC]

Exit status 0 when every case behaves, 1 otherwise. Python standard library plus a C compiler.
"""

import argparse
import json
import os
import stat
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

FAKE_LIBCUDA = r"""
int cuInit(unsigned int flags) { (void)flags; return 0; }
int cuDeviceGetCount(int* count) { *count = 1; return 0; }
"""

# `allocshim run [--quiet] --stats FILE -- CMD...`: runs CMD with FAKE_UNDER_SHIM=1 and writes
# FAKE_STATS (a JSON text) to FILE unless FAKE_NO_STATS is set; exits with CMD's status.
FAKE_ALLOCSHIM = r"""#!/usr/bin/env python3
import os, subprocess, sys
args = sys.argv[1:]
assert args[0] == "run", args
stats = args[args.index("--stats") + 1]
cmd = args[args.index("--") + 1:]
env = dict(os.environ, FAKE_UNDER_SHIM="1")
rc = subprocess.call(cmd, env=env)
if not os.environ.get("FAKE_NO_STATS"):
    with open(stats, "w") as f:
        f.write(os.environ["FAKE_STATS"])
sys.exit(rc)
"""

# Prints FAKE_OUT (FAKE_OUT_SHIM instead under the shim, when set), lines separated by '|', and
# exits with FAKE_RC (FAKE_RC_SHIM under the shim).
FAKE_PROGRAM = r"""#!/usr/bin/env python3
import os, sys
shim = os.environ.get("FAKE_UNDER_SHIM") == "1"
out = os.environ.get("FAKE_OUT_SHIM") if shim and "FAKE_OUT_SHIM" in os.environ else os.environ.get("FAKE_OUT", "")
print("\n".join(out.split("|")))
rc = os.environ.get("FAKE_RC_SHIM") if shim and "FAKE_RC_SHIM" in os.environ else os.environ.get("FAKE_RC", "0")
sys.exit(int(rc))
"""


def stats(kind="native", allocs=3, frees=3, failures=0, bytes_=300, unknown=0, error=""):
    return json.dumps({
        "pid": 1, "policy": "<default>", "error": error,
        "backends": [{"name": kind, "kind": kind, "devices": [
            {"device": 0, "allocs": allocs, "frees": frees, "failures": failures, "bytes": bytes_,
             "peak": bytes_, "live": 0, "time_ns": 1, "hits": 0, "misses": 0}]}],
        "api": {"alloc": allocs, "pitch": 0, "managed": 0, "async": 0, "host": 0, "create": 0},
        "unknown_frees": unknown})


COUNTS = "allocations: 3|frees: 3|bytes: 300"

# (name, extra check_stats arguments, FAKE_* environment, expected exit, text the result must hold)
CASES = [
    ("counts match", ["--count"], dict(FAKE_OUT=COUNTS, FAKE_STATS=stats()), 0, "allocs 3, frees 3"),
    ("alloc count differs", ["--count"], dict(FAKE_OUT=COUNTS, FAKE_STATS=stats(allocs=4)), 1,
     "shim counted 4 allocations, the program made 3"),
    ("free count differs", ["--count"], dict(FAKE_OUT=COUNTS, FAKE_STATS=stats(frees=2)), 1,
     "shim counted 2 frees"),
    ("fewer bytes than asked", ["--count"], dict(FAKE_OUT=COUNTS, FAKE_STATS=stats(bytes_=299)), 1,
     "bytes"),
    ("shim-side failures", ["--count"], dict(FAKE_OUT=COUNTS, FAKE_STATS=stats(failures=1)), 1,
     "failed allocations"),
    ("no count printed", ["--count"], dict(FAKE_OUT="hello", FAKE_STATS=stats()), 1,
     "no 'allocations: N' line"),
    ("unknown frees", [], dict(FAKE_OUT=COUNTS, FAKE_STATS=stats(unknown=2)), 1, "2 frees of pointers"),
    ("program fails", ["--count"], dict(FAKE_OUT=COUNTS + "|FAIL: x", FAKE_RC="1", FAKE_STATS=stats()),
     1, "exit 1, expected 0"),
    ("program skips for a missing module", ["--count"],
     dict(FAKE_OUT="SKIPPED: cupy not importable: x", FAKE_RC="77", FAKE_STATS=stats()), 77,
     "cupy not importable: x"),
    ("no GPU under the shim though the probe found one", ["--count"],
     dict(FAKE_OUT="SKIPPED: no GPU/driver: insufficient driver", FAKE_RC="77", FAKE_STATS=stats()),
     1, "under the shim the program found no usable GPU"),
    ("native runs, shim run skips", ["--compare-native"],
     dict(FAKE_OUT=COUNTS, FAKE_OUT_SHIM="SKIPPED: torch: x", FAKE_RC_SHIM="77", FAKE_STATS=stats()),
     1, "though the driver works"),
    ("no stats file", ["--count"], dict(FAKE_OUT=COUNTS, FAKE_NO_STATS="1", FAKE_STATS=""), 1,
     "no statistics written"),
    ("stats not JSON", ["--count"], dict(FAKE_OUT=COUNTS, FAKE_STATS="{"), 1, "not valid JSON"),
    ("backend fell back", ["--require-backend", "vmm", "--expect-exit", "3"],
     dict(FAKE_OUT=COUNTS, FAKE_STATS=stats(error='device 0 has no VMM')), 1,
     "backend vmm not active (the shim fell back): device 0 has no VMM"),
    ("race shown", ["--count", "--require-backend", "vmm", "--expect-exit", "3"],
     dict(FAKE_OUT=COUNTS + "|summary: aliased 3/3, corrupted 3/3", FAKE_RC="3",
          FAKE_STATS=stats(kind="vmm")), 0, "aliased 3/3, corrupted 3/3"),
    ("race not shown", ["--count", "--require-backend", "vmm", "--expect-exit", "3"],
     dict(FAKE_OUT=COUNTS + "|summary: aliased 0/3, corrupted 0/3", FAKE_STATS=stats(kind="vmm")), 1,
     "exit 0, expected 3 (summary: aliased 0/3"),
    ("same output as native", ["--count", "--compare-native"],
     dict(FAKE_OUT=COUNTS + "|result: 1.5", FAKE_STATS=stats()), 0, "output identical to native"),
    ("output differs from native", ["--count", "--compare-native"],
     dict(FAKE_OUT=COUNTS + "|result: 1.5", FAKE_OUT_SHIM=COUNTS + "|result: 1.25",
          FAKE_STATS=stats()), 1, "'result: 1.5' vs 'result: 1.25'"),
    ("ignored lines may differ", ["--compare-native", "--ignore-line", "^time"],
     dict(FAKE_OUT="time: 1|result: 2", FAKE_OUT_SHIM="time: 9|result: 2", FAKE_STATS=stats()), 0,
     "output identical"),
    ("native run skips", ["--compare-native"],
     dict(FAKE_OUT="SKIPPED: torch not importable: x", FAKE_RC="77", FAKE_STATS=stats()), 77,
     "torch not importable"),
]


def write(path, text, executable=False):
    with open(path, "w") as f:
        f.write(text)
    if executable:
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"))
    args = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory(prefix="allocshim-harness-") as tmp:
        libdir = os.path.join(tmp, "fakecuda")
        build = os.path.join(tmp, "build")
        for d in (libdir, os.path.join(build, "bin"), os.path.join(build, "lib")):
            os.makedirs(d)
        write(os.path.join(tmp, "libcuda.c"), FAKE_LIBCUDA)
        subprocess.run([args.cc, "-shared", "-fPIC", "-o", os.path.join(libdir, "libcuda.so.1"),
                        os.path.join(tmp, "libcuda.c")], check=True)
        write(os.path.join(build, "bin", "allocshim"), FAKE_ALLOCSHIM, executable=True)
        write(os.path.join(build, "lib", "liballocshim.so"), "")
        program = os.path.join(build, "bin", "alloc_loop")  # the name suite.txt's first test runs
        write(program, FAKE_PROGRAM, executable=True)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "ALLOCSHIM_"))}
        base["LD_LIBRARY_PATH"] = libdir + os.pathsep + base.get("LD_LIBRARY_PATH", "")

        for name, extra, fake_env, want_rc, want_text in CASES:
            cmd = [sys.executable, os.path.join(HERE, "check_stats.py"), "--build", build,
                   "--name", "case"] + extra + ["--", "{build}/bin/alloc_loop"]
            p = subprocess.run(cmd, env=dict(base, **fake_env), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
            result = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
            ok = p.returncode == want_rc and want_text in result
            failures += not ok
            print(f"{'ok  ' if ok else 'BAD '} {name}: exit {p.returncode} (want {want_rc}): {result}")
            if not ok:
                print(p.stdout)

        # run_gpu_suite.sh: one passing and one failing suite test, the table and the exit status.
        suite = os.path.join(HERE, "run_gpu_suite.sh")
        for label, fake_env, want_rc, want_row in [
            ("suite passes", dict(FAKE_OUT=COUNTS, FAKE_STATS=stats()), 0, "| PASS    |"),
            ("suite fails", dict(FAKE_OUT=COUNTS, FAKE_STATS=stats(allocs=7)), 1, "| FAIL    | shim counted 7"),
        ]:
            env = dict(base, **fake_env, GPU_SUITE_FILTER="^static_cudart$", OUT=tmp,
                       PYTHON=sys.executable)
            p = subprocess.run(["bash", suite, build], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
            with open(os.path.join(tmp, "gpu-suite.log")) as f:
                logged = f.read()
            rows = [l for l in p.stdout.splitlines() if l.startswith("static_cudart ")]
            ok = (p.returncode == want_rc and len(rows) == 1 and want_row in rows[0]
                  and rows[0] in logged and p.stdout.rstrip().splitlines()[-1].startswith("passed "))
            failures += not ok
            print(f"{'ok  ' if ok else 'BAD '} {label}: exit {p.returncode} (want {want_rc}): "
                  f"{rows[0] if rows else 'no table row'}")
            if not ok:
                print(p.stdout)

    print(f"{'PASS' if failures == 0 else 'FAIL'}: harness_selftest: {failures} case(s) misbehaved")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
