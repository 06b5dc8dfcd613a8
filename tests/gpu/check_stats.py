#!/usr/bin/env python3
"""Run one program under allocshim and check the shim's statistics against the program's own word.

    check_stats.py --build BUILD [options] -- CMD [ARGS...]

The program prints "allocations: N" (and optionally "frees: N", "bytes: N"); the shim writes its
statistics as JSON at exit. With --count the totals over every backend and device must equal the
program's counts exactly. The program's exit status must be --expect-exit (default 0). With
--compare-native the program also runs without the shim and its stdout must be identical (lines
matching --ignore-line excepted). With --require-backend the test FAILS when the allocations were
not served by a backend of that kind: the shim fell back to native (it says why in the JSON's
"error"), which the test did not expect.

In CMD, {build} is the build directory, {here} this script's folder and {python} this interpreter,
so the same command line works wherever the repository and the build tree are copied.

The last line printed is "PASS: NAME: detail", "FAIL: NAME: detail" or "SKIPPED: NAME: reason";
the exit status is 0, 1 or 77 (CTest's SKIP_RETURN_CODE). Python standard library only.
"""

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))


class Outcome(Exception):
    """Ends the test with a result line."""

    def __init__(self, status, detail):
        super().__init__(detail)
        self.status = status
        self.detail = detail


def skip(detail):
    raise Outcome("SKIPPED", detail)


def fail(detail):
    raise Outcome("FAIL", detail)


def gpu_absent_reason():
    """Why no GPU can be used here, or None. Asks the driver itself: device nodes can exist
    without a usable driver (containers) and nvidia-smi can be missing where the driver works."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return f"libcuda.so.1 cannot be loaded ({str(e).split(': ')[-1]})"
    rc = cuda.cuInit(0)
    if rc != 0:
        return f"cuInit returned {rc}"
    count = ctypes.c_int(0)
    rc = cuda.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0 or count.value == 0:
        return f"no CUDA device (cuDeviceGetCount returned {rc}, count {count.value})"
    return None


def expand(word, build):
    return word.replace("{build}", build).replace("{here}", HERE).replace("{python}", sys.executable)


def base_env(extra):
    # Inherited ALLOCSHIM_* settings would change what a test means: each test sets its own.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCSHIM_")}
    env.update(extra)
    return env


def run(cmd, env, timeout, label):
    print(f"--- {label}: {' '.join(cmd)}", flush=True)
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout, text=True, errors="replace")
    except FileNotFoundError as e:
        fail(f"{label}: cannot run {cmd[0]}: {e}")
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace")
        print(out)
        fail(f"{label}: timed out after {timeout} s")
    for line in p.stdout.splitlines():
        print(f"  | {line}")
    for line in p.stderr.splitlines():
        print(f"  ! {line}")
    print(f"--- {label}: exit {p.returncode}", flush=True)
    return p


def last_line(p):
    lines = [l for l in (p.stderr + "\n" + p.stdout).splitlines() if l.strip()]
    return lines[-1] if lines else ""


def program_skip_reason(p):
    for line in p.stdout.splitlines():
        if line.startswith("SKIPPED"):
            return line.split(":", 1)[1].strip() if ":" in line else line
    return "the program exited 77"


def last_int(text, key):
    """The value of the last "key: N" line, or None."""
    found = re.findall(rf"^{re.escape(key)}:\s*(\d+)\s*$", text, re.MULTILINE)
    return int(found[-1]) if found else None


def totals(stats):
    t = {"allocs": 0, "frees": 0, "failures": 0, "bytes": 0}
    served = {}  # backend kind -> allocations it served
    for b in stats.get("backends", []):
        for d in b.get("devices", []):
            for k in t:
                t[k] += int(d.get(k, 0))
            served[b.get("kind", "?")] = served.get(b.get("kind", "?"), 0) + int(d.get("allocs", 0))
    return t, served


def describe(stats, t, served):
    api = ", ".join(f"{k} {v}" for k, v in stats.get("api", {}).items())
    by_kind = ", ".join(f"{k} {v}" for k, v in served.items() if v) or "none"
    print(f"--- stats: policy {stats.get('policy')!r}, allocs {t['allocs']}, frees {t['frees']}, "
          f"failures {t['failures']}, bytes {t['bytes']}, unknown_frees {stats.get('unknown_frees')}")
    print(f"--- stats: served by kind: {by_kind}; by api: {api}")
    if stats.get("error"):
        print(f"--- stats: error: {stats['error']}")


def filtered(text, patterns):
    return [l for l in text.splitlines() if not any(re.search(p, l) for p in patterns)]


def check(args, cmd):
    build = os.path.abspath(args.build)
    reason = gpu_absent_reason()
    if reason:
        skip(f"no GPU/driver: {reason}")

    allocshim = args.allocshim or os.path.join(build, "bin", "allocshim")
    library = os.path.join(build, "lib", "liballocshim.so")
    for path in (allocshim, library):
        if not os.path.exists(path):
            fail(f"{path} does not exist: build the allocshim and allocshim_preload targets")
    for path in cmd[:1]:
        if os.sep in path and not os.path.exists(path):
            fail(f"{path} does not exist: build the examples (target allocshim_examples)")

    common = dict(kv.split("=", 1) for kv in args.env)
    native = None
    if args.compare_native:
        native = run(cmd, base_env(common), args.timeout, "native")
        if native.returncode == SKIP:
            skip(program_skip_reason(native))
        if native.returncode != args.expect_native_exit:
            fail(f"native run exited {native.returncode}, expected {args.expect_native_exit} "
                 f"({last_line(native)!r})")

    with tempfile.TemporaryDirectory(prefix="allocshim-gpu-") as tmp:
        stats_path = os.path.join(tmp, "stats.json")
        shim_env = dict(common)
        shim_env.update(kv.split("=", 1) for kv in args.shim_env)
        if args.via == "cli":
            shimmed = [allocshim, "run", "--quiet", "--stats", stats_path, "--"] + cmd
        else:
            shimmed = cmd
            shim_env.update(LD_PRELOAD=library, ALLOCSHIM_STATS=stats_path, ALLOCSHIM_QUIET="1")
        label = "under allocshim" + "".join(f" {kv}" for kv in args.shim_env)
        p = run(shimmed, base_env(shim_env), args.timeout, label)
        if p.returncode == SKIP:
            # The driver answered the probe above, so a program that finds no GPU under the shim
            # was broken by it: that must not hide as a skip. A missing module still skips.
            why = program_skip_reason(p)
            if native is not None or why.startswith("no GPU/driver"):
                fail(f"under the shim the program found no usable GPU, though the driver works ({why})")
            skip(why)
        if not os.path.exists(stats_path):
            fail(f"no statistics written (exit {p.returncode}; last output: {last_line(p)!r}): "
                 "was the shim loaded?")
        with open(stats_path) as f:
            text = f.read()
        try:
            stats = json.loads(text)
        except json.JSONDecodeError as e:
            fail(f"statistics are not valid JSON ({e}): {text[:200]!r}")

    t, served = totals(stats)
    describe(stats, t, served)
    details = []

    if args.require_backend:
        if not served.get(args.require_backend):
            why = stats.get("error") or "allocations were served by " + (
                ", ".join(k for k, v in served.items() if v) or "no backend")
            fail(f"backend {args.require_backend} not active (the shim fell back): {why}")
        details.append(f"backend {args.require_backend}")

    if p.returncode != args.expect_exit:
        summary = [l for l in p.stdout.splitlines() if l.startswith(("summary:", "FAIL"))]
        fail(f"exit {p.returncode}, expected {args.expect_exit} "
             f"({'; '.join(summary) if summary else repr(last_line(p))})")

    if args.count:
        want = last_int(p.stdout, "allocations")
        if want is None:
            fail("the program printed no 'allocations: N' line")
        if t["allocs"] != want:
            fail(f"shim counted {t['allocs']} allocations, the program made {want}")
        details.append(f"allocs {want}")
        frees = last_int(p.stdout, "frees")
        if frees is not None:
            if t["frees"] != frees:
                fail(f"shim counted {t['frees']} frees, the program made {frees}")
            details.append(f"frees {frees}")
        want_bytes = last_int(p.stdout, "bytes")
        # Backends may round sizes up (pitch, granularity), never down.
        if want_bytes is not None and t["bytes"] < want_bytes:
            fail(f"shim counted {t['bytes']} bytes, the program asked for {want_bytes}")
        if t["failures"]:
            fail(f"shim counted {t['failures']} failed allocations; the program saw none")
    unknown = int(stats.get("unknown_frees", 0))
    if unknown > args.max_unknown_frees:
        fail(f"{unknown} frees of pointers the shim did not allocate")

    if native is not None:
        a = filtered(native.stdout, args.ignore_line)
        b = filtered(p.stdout, args.ignore_line)
        if a != b:
            diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            x = a[diff] if diff < len(a) else "<end>"
            y = b[diff] if diff < len(b) else "<end>"
            fail(f"output differs from the native run at line {diff + 1}: {x!r} vs {y!r}")
        details.append("output identical to native")

    details += [l[len("summary:"):].strip() for l in p.stdout.splitlines() if l.startswith("summary:")]
    details.append(f"exit {p.returncode}")
    return ", ".join(details)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, help="the build directory (has bin/ and lib/)")
    ap.add_argument("--allocshim", help="the allocshim tool (default: BUILD/bin/allocshim)")
    ap.add_argument("--name", default=None, help="test name for the result line")
    ap.add_argument("--via", choices=("cli", "preload"), default="cli",
                    help="run through `allocshim run` (default) or LD_PRELOAD directly")
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="environment for both the native and the shimmed run")
    ap.add_argument("--shim-env", action="append", default=[], metavar="K=V",
                    help="environment for the shimmed run only (ALLOCSHIM_BACKEND=..., ...)")
    ap.add_argument("--count", action="store_true",
                    help="stats allocs/frees must equal the program's 'allocations:'/'frees:' lines")
    ap.add_argument("--expect-exit", type=int, default=0)
    ap.add_argument("--expect-native-exit", type=int, default=0)
    ap.add_argument("--compare-native", action="store_true",
                    help="run without the shim too; stdout must be identical")
    ap.add_argument("--ignore-line", action="append", default=[], metavar="REGEX",
                    help="lines to leave out of the native comparison (timings)")
    ap.add_argument("--require-backend", metavar="KIND",
                    help="FAIL unless a backend of this kind served allocations (no fallback to native)")
    ap.add_argument("--max-unknown-frees", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given")
    build = os.path.abspath(args.build)
    cmd = [expand(w, build) for w in cmd]
    name = args.name or os.path.basename(cmd[-1] if cmd[0] == sys.executable else cmd[0])
    try:
        detail = check(args, cmd)
        status = "PASS"
    except Outcome as o:
        status, detail = o.status, o.detail
    print(f"{status}: {name}: {detail}", flush=True)
    return {"PASS": 0, "SKIPPED": SKIP}.get(status, 1)


if __name__ == "__main__":
    sys.exit(main())
