"""bench.py's sections, from each section's output to results: parsers for what the programs
print, ratios against the native path measured in the same run, and the issues' targets.
No I/O and no GPU here, so test_bench.py checks it on recorded output. The allocation benchmarks'
own parsing, ratios and targets stay in bench_results.py; this module only gathers them.

A section's result is a dict: status ("ok", "failed", "skipped", "partial"), reason, seconds, and
its data (the computed form below). collect_targets() reads only that data, so `bench.py
--from-results` gets the same targets from a results file. Python standard library only.
"""

import json
import re

import bench_results as br

SECTIONS = ("suite", "alloc", "real", "spill", "trace", "replay", "ipc", "sync", "migrate", "launch", "models",
            "share", "hitpath", "ahead", "ab", "core_overhead", "launch_overhead", "policy")
TITLES = {"suite": "GPU suite", "alloc": "allocation latency, churn, fragmentation",
          "real": "real programs (PyTorch training loop, Thrust/CUB)", "spill": "spill bandwidth",
          "trace": "tracing overhead", "replay": "replayed trace per backend", "ipc": "IPC latency",
          "sync": "what a safe free costs (kernel churn, reuse race, PyTorch loop)",
          "migrate": "live migration (reuse pattern, pinning, moves, PyTorch over budget)",
          "launch": "launch-aware migration (races, weights first, launch rate)",
          "models": "real models under a budget (GPT-style training, Llama-style generation)",
          "share": "two processes sharing one budget",
          "hitpath": "a pool hit taken apart (hit_path, cudart_cost, churn_core)", "ahead": "migration: --base against BUILD",
          "ab": "allocation latency: --base against BUILD",
          "core_overhead": "the core's cost per call (null driver, no GPU)",
          "launch_overhead": "the launch hooks' cost per launch (null launch, no GPU)",
          "policy": "policy matching and loading (no GPU)"}
CPU_SECTIONS = ("core_overhead", "launch_overhead", "policy")  # run without a GPU
BASE_SECTIONS = ("ahead", "ab")  # compare two builds: need --base

# The issues' targets, beside those bench_results.py holds for the allocation benchmarks.
TARGET_TORCH_RATIO = 1.1       # issue 8: training loop without caching under the shim vs caching
TARGET_SPILL_FRACTION = 0.95   # issue 5: spilled reads against the model bound
TARGET_TRACE_NS = 2000         # issue 7: median added per traced event
TARGET_TRACE_BYTES = 24        # issue 7: bytes per event on disk

KINDS = ("native", "vmm", "async_pool", "managed", "host")


def ratio(a, b):
    return a / b if a is not None and b else None


# ---- GPU suite (tests/gpu/run_gpu_suite.sh) -----------------------------------------------------

_SUITE_HEADER = re.compile(r"^===== \[\d+/\d+\] (\S+)\s*$")
_RESULT = re.compile(r"^(PASS|FAIL|SKIPPED): (\S+): ?(.*)$")
_SERVED = re.compile(r"^--- stats: served by kind: (.*?); by api:")
_ROW = re.compile(r"^(\S.*?)\s*\| (PASS|FAIL|SKIPPED)\s*\| ?(.*)$")


def suite_names(suite_txt):
    """Test names of suite.txt, in order."""
    return [l.split()[0] for l in suite_txt.splitlines() if l.strip() and not l.lstrip().startswith("#")]


def parse_suite(lines, times=None, names=(), interrupted=None):
    """run_gpu_suite.sh's output (a list of lines) -> {"tests": [...], counts, "complete"}.

    Each test: name, result (PASS, FAIL, SKIPPED, NOT RUN), detail, served (the shim's allocations
    per backend kind, "vmm 60"), seconds (from times: when each line arrived, when given). The
    summary table, when the script got that far, is authoritative; otherwise the check_stats.py
    result lines are. names: suite.txt's, so tests never reached show as NOT RUN, with
    `interrupted` (why the suite stopped) as their detail."""
    tests, order, current, started = {}, [], None, None
    in_summary = False
    for i, line in enumerate(lines):
        t = times[i] if times else None
        if line.startswith("===== summary"):
            in_summary, current = True, None
            continue
        m = _SUITE_HEADER.match(line)
        if m and not in_summary:
            if current and tests[current]["seconds"] is None and t is not None and started is not None:
                tests[current]["seconds"] = t - started
            current, started = m.group(1), t
            if current not in tests:
                order.append(current)
            tests[current] = {"name": current, "result": None, "detail": "", "served": None, "seconds": None}
            continue
        if in_summary:
            m = _ROW.match(line)
            if m and m.group(1) != "test":
                name = m.group(1)
                if name not in tests:
                    order.append(name)
                    tests[name] = {"name": name, "served": None, "seconds": None}
                tests[name].update(result=m.group(2), detail=m.group(3).strip())
            continue
        if current is None:
            continue
        m = _SERVED.match(line)
        if m:
            tests[current]["served"] = m.group(1)
        m = _RESULT.match(line)
        if m and m.group(2) == current:
            tests[current].update(result=m.group(1), detail=m.group(3).strip())
            if t is not None and started is not None:
                tests[current]["seconds"] = t - started
    for name in order:
        if tests[name]["result"] is None:
            tests[name].update(result="NOT RUN", detail=f"stopped while running: {interrupted or 'no result line'}")
    for name in names:
        if name not in tests:
            order.append(name)
            tests[name] = {"name": name, "result": "NOT RUN", "detail": interrupted or "not reached",
                           "served": None, "seconds": None}
    out = {"tests": [tests[n] for n in order], "complete": in_summary}
    for key, result in (("passed", "PASS"), ("failed", "FAIL"), ("skipped", "SKIPPED"), ("not_run", "NOT RUN")):
        out[key] = sum(t["result"] == result for t in out["tests"])
    return out


def parse_gtest(text):
    """A googletest binary's summary -> (passed, failed, skipped, names of the failed tests)."""
    count = lambda tag: _grab(rf"^\[  {tag}\s*\] (\d+) tests?", text, int)  # noqa: E731
    failed = re.findall(r"^\[  FAILED  \] (?!\d+ tests?,)([^\s,]+)", text, re.MULTILINE)
    return count("PASSED"), count("FAILED") or 0, count("SKIPPED") or 0, list(dict.fromkeys(failed))


def add_suite_test(suite, test):
    """Appends one more test (a program run beside run_gpu_suite.sh) and recounts."""
    suite["tests"].append(test)
    for key, result in (("passed", "PASS"), ("failed", "FAIL"), ("skipped", "SKIPPED"), ("not_run", "NOT RUN")):
        suite[key] = sum(t["result"] == result for t in suite["tests"])
    return suite


# Programs of the compatibility table (README): suite test NAME is the default policy, NAME.KIND
# the program with every allocation served by that backend kind.
COMPAT_PROGRAMS = (("pytorch", "PyTorch, caching allocator off (torch_allocs.py)"),
                   ("torch_train", "PyTorch training loop, caching off (torch_train.py)"),
                   ("cupy", "CuPy, memory pool off (cupy_allocs.py)"),
                   ("jax_program", "JAX, XLA_PYTHON_CLIENT_ALLOCATOR=platform (jax_program.py)"),
                   ("thrust_sort", "Thrust/CUB, nvcc defaults (thrust_sort)"))
COMPAT_COLUMNS = ("default",) + KINDS


def compatibility(suite):
    """{program: {column: test or None}} from the suite's tests: the default-policy row and one per
    backend kind. A row whose name carries more (torch_train's free_sync) is its kind's."""
    by_name = {t["name"]: t for t in suite.get("tests", [])}
    table = {}
    for prog, _ in COMPAT_PROGRAMS:
        row = {c: None for c in COMPAT_COLUMNS}
        for name, t in by_name.items():
            parts = name.split(".")
            if parts[0] != prog:
                continue
            col = "default" if len(parts) == 1 else parts[1]
            if col in row and row[col] is None:
                row[col] = t
        table[prog] = row
    return table


# ---- allocation benchmarks (run_benchmarks.py's results.json) ------------------------------------

def alloc_targets(data):
    return [dict(t, section="alloc") for t in (data or {}).get("targets", [])]


# ---- real programs (real_programs_bench.py --json) -----------------------------------------------

def real_results(doc):
    """Each program's rows with their ratio to the first row (the native path) in the same run."""
    out = {"steps": doc.get("steps"), "reps": doc.get("reps"), "arrays": doc.get("arrays")}
    for prog in ("torch", "thrust"):
        part = doc.get(prog) or {}
        rows = part.get("rows") or []
        base = rows[0].get("best") if rows else None
        out[prog] = {"rows": [dict(r, ratio=ratio(r.get("best"), base)) for r in rows],
                     "target_row": part.get("target_row"), "not_built": part.get("not_built")}
    return out


def real_targets(data):
    out = []
    torch = (data or {}).get("torch", {})
    row = next((r for r in torch.get("rows", []) if r["name"] == torch.get("target_row")), None)
    if row is not None:
        value = row.get("ratio")
        out.append({"section": "real", "target": f"PyTorch training loop, no caching, under the shim: time <= "
                    f"{TARGET_TORCH_RATIO}x PyTorch's caching allocator", "config": row["name"],
                    "limit": TARGET_TORCH_RATIO, "unit": "x", "value": value,
                    "passed": None if value is None else value <= TARGET_TORCH_RATIO})
        out.append({"section": "real", "target": "PyTorch training loop under the shim: same losses as the "
                    "caching allocator", "config": row["name"], "unit": "same", "value": row.get("identical"),
                    "passed": row.get("identical")})
    thrust = [r for r in (data or {}).get("thrust", {}).get("rows", [])[1:] if r.get("identical") is not None]
    if thrust:
        same = all(r["identical"] for r in thrust)
        out.append({"section": "real", "target": "thrust_sort under the shim: output identical to native",
                    "config": ", ".join(r["name"] for r in thrust), "unit": "same", "value": same, "passed": same})
    return out


# ---- spill bandwidth (tools/bench/spill_bench.cu) -------------------------------------------------

_SPILL_ROW = re.compile(r"^\|\s*([0-9.]+)\s*\|\s*([0-9.]+) GiB\s*\|\s*([0-9.]+)\s*\|\s*([0-9.]+)\s*\|"
                        r"\s*([0-9.]+)\s*\|\s*[0-9.]+%\s*\|\s*(\S+)\s*\|\s*(\S+)\s*\|")
_SPILL_REF = re.compile(r"^B_dev ([0-9.]+) GB/s.*B_host ([0-9.]+) GB/s.*budget ([0-9.]+) GiB")


def _num(s):
    try:
        return float(s)
    except ValueError:
        return None  # "skipped": managed memory was not measured


def parse_spill(text):
    """spill_bench's table -> {"rows": [...], "b_dev", "b_host", "budget_gib"}. Each row's
    fraction of the bound is computed here from its two bandwidths (not the rounded percentage)."""
    rows, ref = [], {}
    for line in text.splitlines():
        m = _SPILL_ROW.match(line.strip())
        if m:
            spilled, bound = float(m.group(4)), float(m.group(5))
            mh, ms = _num(m.group(6)), _num(m.group(7))
            rows.append({"factor": float(m.group(1)), "size_gib": float(m.group(2)), "f_host": float(m.group(3)),
                         "spilled_gbps": spilled, "bound_gbps": bound, "of_bound": ratio(spilled, bound),
                         "managed_host_gbps": mh, "managed_stripe_gbps": ms,
                         "vs_managed_host": ratio(spilled, mh), "managed_stripe_of_bound": ratio(ms, bound)})
        m = _SPILL_REF.match(line.strip())
        if m:
            ref = {"b_dev": float(m.group(1)), "b_host": float(m.group(2)), "budget_gib": float(m.group(3))}
    return dict(ref, rows=rows)


def spill_targets(data):
    return [{"section": "spill", "target": f"spilled reads at factor {r['factor']:g} >= "
             f"{TARGET_SPILL_FRACTION:.0%} of the model bound", "config": f"budget.spill=host, f_host {r['f_host']:.3f}",
             "limit": TARGET_SPILL_FRACTION, "unit": "of_bound", "value": r["of_bound"],
             "passed": None if r["of_bound"] is None else r["of_bound"] >= TARGET_SPILL_FRACTION}
            for r in (data or {}).get("rows", [])]


# ---- tracing overhead (tools/bench/trace_bench.cpp, alloc_loop traced and not) ------------------

def _grab(pattern, text, cast=float):
    m = re.search(pattern, text, re.MULTILINE)
    return cast(m.group(1)) if m else None


def parse_trace_bench(text):
    """trace_bench's report -> events, the unwinder used (a fallback to glibc's backtrace measures
    something else), per-event median/p90/p99 ns, alloc and free medians, bytes per event; a field
    it does not print is None."""
    return {"events": _grab(r"^trace_bench: (\d+) events", text, int),
            "unwinder": _grab(r"^\s*unwinder\s+(\S.*?)\s*$", text, str),
            "median_ns": _grab(r"per event \(alloc\+free\)\s+median (\d+) ns", text),
            "p90_ns": _grab(r"per event \(alloc\+free\).*?p90 (\d+) ns", text),
            "p99_ns": _grab(r"per event \(alloc\+free\).*?p99 (\d+) ns", text),
            "alloc_median_ns": _grab(r"^\s*alloc \(with unwind\)\s+median (\d+) ns", text),
            "free_median_ns": _grab(r"^\s*free\s+median (\d+) ns", text),
            "bytes_per_event": _grab(r"([0-9.]+) bytes per event", text)}


def parse_alloc_loop(text):
    return {"pair_us": _grab(r"^time per alloc\+free pair: ([0-9.]+) us", text),
            "allocations": _grab(r"^allocations: (\d+)", text, int), "frees": _grab(r"^frees: (\d+)", text, int)}


def trace_results(bench, loops, trace_bytes=None):
    """bench: parse_trace_bench's dict (or None); loops: {"native", "shim", "traced"} -> each
    {"status", "seconds" (wall), parse_alloc_loop's fields}. Ratios: traced over untraced under
    the shim, the shim over native; the time added per traced event on alloc_loop (two events a
    pair) and its trace's bytes per event."""
    out = {"bench": bench, "loops": loops}
    nat, shim, traced = (loops.get(k) or {} for k in ("native", "shim", "traced"))
    out["traced_vs_untraced_pair"] = ratio(traced.get("pair_us"), shim.get("pair_us"))
    out["traced_vs_untraced_wall"] = ratio(traced.get("seconds"), shim.get("seconds"))
    out["shim_vs_native_pair"] = ratio(shim.get("pair_us"), nat.get("pair_us"))
    out["traced_vs_native_wall"] = ratio(traced.get("seconds"), nat.get("seconds"))
    if traced.get("pair_us") is not None and shim.get("pair_us") is not None:
        out["added_ns_per_event"] = (traced["pair_us"] - shim["pair_us"]) * 1000.0 / 2
    events = (traced.get("allocations") or 0) + (traced.get("frees") or 0)
    out["trace_bytes"] = trace_bytes
    out["loop_bytes_per_event"] = ratio(trace_bytes, events) if trace_bytes is not None else None
    return out


def trace_targets(data):
    b = (data or {}).get("bench") or {}
    if not b:
        return []
    med, per = b.get("median_ns"), b.get("bytes_per_event")
    config = f"{b.get('events')} events" + (f", {b['unwinder']}" if b.get("unwinder") else "")
    return [{"section": "trace", "target": f"trace_bench: median added per traced event <= {TARGET_TRACE_NS / 1000:g} us "
             "(native stacks)", "config": config, "limit": TARGET_TRACE_NS, "unit": "ns_plain",
             "value": med, "passed": None if med is None else med <= TARGET_TRACE_NS},
            {"section": "trace", "target": f"trace_bench: bytes per event on disk <= {TARGET_TRACE_BYTES}",
             "config": config, "limit": TARGET_TRACE_BYTES, "unit": "B",
             "value": per, "passed": None if per is None else per <= TARGET_TRACE_BYTES}]


# ---- replay per backend (`allocshim replay TRACE --policy FILE --json`) --------------------------

def parse_replay(text):
    """The JSON `allocshim replay --json` prints, or None."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        doc = json.loads(text[start:text.rfind("}") + 1])
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def replay_results(record, replays):
    """record: the recording run (status, events, trace_bytes, workload); replays: [(backend,
    status, reason, parse_replay's doc or None)]. Per backend: peak reserved / peak live (the
    issue's fragmentation; `allocshim replay`'s own "fragmentation" is 1 - live/reserved at the
    peak), failures, and peak reserved and alloc median against the native backend's replay."""
    rows = []
    for backend, status, reason, doc in replays:
        row = {"backend": backend, "status": status, "reason": reason}
        if doc:
            row.update(allocs=doc.get("allocs"), frees=doc.get("frees"), failures=doc.get("failures"),
                       peak_reserved=doc.get("peak_reserved"), peak_live=doc.get("peak_live"),
                       fragmentation=ratio(doc.get("peak_reserved"), doc.get("peak_live")),
                       alloc_median_ns=(doc.get("alloc_ns") or {}).get("median"),
                       free_median_ns=(doc.get("free_ns") or {}).get("median"), error=doc.get("error") or "")
        rows.append(row)
    native = next((r for r in rows if r["backend"] == "native" and r.get("peak_reserved") is not None), {})
    for r in rows:
        r["reserved_vs_native"] = ratio(r.get("peak_reserved"), native.get("peak_reserved"))
        r["alloc_vs_native"] = ratio(r.get("alloc_median_ns"), native.get("alloc_median_ns"))
    return {"record": record, "backends": rows}


def replay_targets(data):
    out = []
    for r in (data or {}).get("backends", []):
        if r["backend"] != "vmm":
            continue
        v = r.get("fragmentation")
        passed = None if v is None else v <= br.TARGET_VMM_FRAGMENTATION and not r.get("failures")
        out.append({"section": "replay", "target": f"vmm fragmentation of the replayed mixed trace (peak reserved / "
                    f"peak live) <= {br.TARGET_VMM_FRAGMENTATION}, no failures", "config": "replay, backend vmm",
                    "limit": br.TARGET_VMM_FRAGMENTATION, "unit": "ratio", "value": v, "passed": passed})
    return out


# ---- IPC (tools/bench/ipc_bench.cu: its "json:" line) ---------------------------------------------

def parse_ipc(text):
    for line in reversed(text.splitlines()):
        if line.startswith("json: "):
            try:
                return json.loads(line[len("json: "):])
            except json.JSONDecodeError:
                return None
    return None


def ipc_results(runs):
    """runs: [(config, status, reason, parse_ipc's doc or None)], the first the native path (no
    shim). Per config and size: medians of get/open/close and their sum, and that sum against
    native's at the same size."""
    native = {}
    if runs and runs[0][3]:
        native = {s["bytes"]: s for s in runs[0][3].get("sizes", [])}
    rows = []
    for config, status, reason, doc in runs:
        sizes = []
        for s in (doc or {}).get("sizes", []):
            n = native.get(s["bytes"], {})
            sizes.append(dict(s, total_vs_native=ratio(s.get("total_p50"), n.get("total_p50")),
                              open_vs_native=ratio(s.get("open_p50"), n.get("open_p50"))))
        rows.append({"config": config, "status": status, "reason": reason, "sizes": sizes})
    return {"configs": rows}


# ---- sections run by a script of their own, and the null-driver programs -------------------------

def script_results(lines, table=None):
    """A section script's summary: its table file when it writes one (run_common.sh's table.txt),
    else what it printed. Markdown headings go three levels down, under the section's own."""
    summary = table if table is not None else lines
    return {"summary": [("###" + l) if l.startswith("#") else l for l in summary]}


def parse_records(text, bench):
    """The {"bench": BENCH, ...} JSON lines a program prints (core_overhead, launch_overhead)."""
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line) if line.startswith("{") else None
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("bench") == bench:
            out.append({k: v for k, v in record.items() if k != "bench"})
    return out


# ---- all of it ----------------------------------------------------------------------------------

def collect_targets(results):
    """Every target of the run, in section order, from the sections' data."""
    s = results.get("sections", {})
    data = lambda name: (s.get(name) or {}).get("data")  # noqa: E731
    return (alloc_targets(data("alloc")) + real_targets(data("real")) + spill_targets(data("spill"))
            + trace_targets(data("trace")) + replay_targets(data("replay")))


def fmt_target_value(t):
    v, unit = t.get("value"), t.get("unit")
    if v is None:
        return "not measured"
    if unit == "ns" or unit == "ratio":
        return br.fmt_value(t)
    if unit == "ns_plain":
        return f"{v / 1000:.2f} us"
    if unit == "x":
        return f"{v:.3f}x"
    if unit == "of_bound":
        return f"{100 * v:.1f}% of bound"
    if unit == "B":
        return f"{v:.2f} B/event"
    if unit == "same":
        return "identical" if v else "DIFFERENT"
    return str(v)
