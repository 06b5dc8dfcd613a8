"""From finished runs to results: parse alloc_latency's JSON lines and the shim's statistics, compute
ratios against the native runs of the same session, fragmentation, the issue's targets, and render
results.md and the short table. No I/O and no GPU here, so test_bench.py checks it all on
canned input. Python standard library only.

A run is a dict: name, workload ("latency", "async", "churn", "mixed"), backend (None: no shim),
free_sync, status ("ok", "failed", "skipped", "unavailable"), reason, seconds, records (the parsed
JSON lines), stats (the shim's statistics JSON, or None).
"""

import json

BACKENDS = ("native", "async_pool", "vmm")
FREE_SYNC = ("device", "barrier", "none")
POOLS = ("async_pool", "vmm")  # the backends that keep memory, and so report reserved bytes

# The targets (issue 4, item 7).
TARGET_NONE_NS = 300
TARGET_BARRIER_NS = 3000
TARGET_VMM_FRAGMENTATION = 1.05

# Keys in the shim's per-device statistics (shim/core/summary.cpp). Peak reserved is looked up under
# each of these names, first found wins; the stats file may not carry it at all.
PEAK_RESERVED_KEYS = ("peak_reserved", "peak_reserved_bytes")

NATIVE_MALLOC = "native.malloc"
NATIVE_ASYNC = "native.malloc_async"
NATIVE_ASYNC_SYNC = "native.malloc_async_sync"


def parse_records(text):
    """The {"bench": ...} JSON lines of alloc_latency's output, in order; other lines are ignored."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith('{"bench"'):
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def records_of(run, bench):
    return [r for r in run.get("records", []) if r.get("bench") == bench]


def program_count(run, key):
    done = records_of(run, "done")
    return int(done[-1][key]) if done and key in done[-1] else None


def stats_summary(stats, kind=None):
    """Totals over the devices of every backend (or of the backends of one kind): allocs, frees,
    peak, live, hits, misses, peak_reserved (None when no device entry carries it), and
    `served`: allocations per backend kind."""
    s = {"allocs": 0, "frees": 0, "peak": 0, "live": 0, "hits": 0, "misses": 0, "peak_reserved": None,
         "served": {}, "error": (stats or {}).get("error", "")}
    for b in (stats or {}).get("backends", []):
        k = b.get("kind", "?")
        for d in b.get("devices", []):
            s["served"][k] = s["served"].get(k, 0) + int(d.get("allocs", 0))
            if kind is not None and k != kind:
                continue
            for key in ("allocs", "frees", "peak", "live", "hits", "misses"):
                s[key] += int(d.get(key, 0))
            for key in PEAK_RESERVED_KEYS:
                if key in d:
                    s["peak_reserved"] = (s["peak_reserved"] or 0) + int(d[key])
                    break
    return s


def backend_inactive_reason(stats, kind):
    """Why the shim did not serve from `kind` (not implemented: it fell back and says so in
    "error"), or None when that backend served allocations."""
    s = stats_summary(stats)
    if s["served"].get(kind, 0) > 0:
        return None
    if s["error"]:
        return s["error"]
    others = ", ".join(f"{k} {v}" for k, v in s["served"].items() if v) or "nothing"
    return f"no allocation served by {kind} (served: {others})"


def config_label(name):
    if name == NATIVE_MALLOC:
        return "cudaMalloc+cudaFree (native)"
    if name == NATIVE_ASYNC:
        return "cudaMallocAsync+cudaFreeAsync (native)"
    if name == NATIVE_ASYNC_SYNC:
        return "cudaMallocAsync+cudaFreeAsync+sync (native)"
    if name == "native":
        return "native (no shim)"
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "shim":
        return f"shim {parts[1]}, free_sync={parts[2]}"
    return name


def shim_config(backend, free_sync):
    return f"shim.{backend}.{free_sync}"


def ratio(a, b):
    return a / b if a is not None and b else None


# ---- results -----------------------------------------------------------------------------------

def build_results(meta, runs):
    """The results document (results.json) from the finished runs."""
    by = {(r["workload"], r.get("backend"), r.get("free_sync")): r for r in runs}
    ok = lambda r: r is not None and r.get("status") == "ok"  # noqa: E731

    # Latency: one series per configuration, keyed by size.
    series = {}
    native = by.get(("latency", None, None))
    if ok(native):
        series[NATIVE_MALLOC] = latency_points(native, "malloc")
    native_async = by.get(("async", None, None))
    if ok(native_async):
        series[NATIVE_ASYNC] = latency_points(native_async, "malloc_async")
        series[NATIVE_ASYNC_SYNC] = latency_points(native_async, "malloc_async_sync")
    for b in BACKENDS:
        for s in FREE_SYNC:
            r = by.get(("latency", b, s))
            if ok(r):
                series[shim_config(b, s)] = latency_points(r, "malloc")
    base = series.get(NATIVE_MALLOC, {})
    base_async = series.get(NATIVE_ASYNC, {})
    latency = []
    for name, points in series.items():
        for size in sorted(points):
            p = dict(points[size], config=name, size=size)
            p["ratio_vs_malloc"] = ratio(p["pair_median_ns"], base.get(size, {}).get("pair_median_ns"))
            p["ratio_vs_malloc_async"] = ratio(p["pair_median_ns"],
                                               base_async.get(size, {}).get("pair_median_ns"))
            latency.append(p)

    # Churn: pairs/s per thread count, against native's at the same count.
    churn_series = {}
    r = by.get(("churn", None, None))
    if ok(r):
        churn_series["native"] = {c["threads"]: c for c in records_of(r, "churn")}
    for b in BACKENDS:
        for s in FREE_SYNC:
            r = by.get(("churn", b, s))
            if ok(r):
                churn_series[shim_config(b, s)] = {c["threads"]: c for c in records_of(r, "churn")}
    churn = []
    for name, points in churn_series.items():
        for t in sorted(points):
            c = points[t]
            nat = churn_series.get("native", {}).get(t, {})
            churn.append({"config": name, "threads": t, "pairs": c.get("pairs"),
                          "pairs_per_s": c.get("pairs_per_s"), "pair_median_ns": c.get("pair_median_ns"),
                          "pair_p90_ns": c.get("pair_p90_ns"),
                          "throughput_vs_native": ratio(c.get("pairs_per_s"), nat.get("pairs_per_s")),
                          "median_vs_native": ratio(c.get("pair_median_ns"), nat.get("pair_median_ns"))})

    # Fragmentation on the mixed workload: the shim's peak reserved over the program's peak live.
    fragmentation = []
    native_mixed = by.get(("mixed", None, None))
    native_seconds = records_of(native_mixed, "mixed")[-1].get("seconds") if ok(native_mixed) and \
        records_of(native_mixed, "mixed") else None
    for b in POOLS:
        for s in FREE_SYNC:
            r = by.get(("mixed", b, s))
            if not ok(r) or not records_of(r, "mixed"):
                continue
            m = records_of(r, "mixed")[-1]
            st = stats_summary(r.get("stats"), b)
            program_peak = m.get("peak_live_bytes")
            entry = {"config": shim_config(b, s), "backend": b, "free_sync": s,
                     "program_peak_live": program_peak, "shim_peak_live": st["peak"],
                     "peak_reserved": st["peak_reserved"],
                     "fragmentation": ratio(st["peak_reserved"], program_peak),
                     "seconds": m.get("seconds"), "time_vs_native": ratio(m.get("seconds"), native_seconds)}
            if st["peak_reserved"] is None:
                entry["note"] = "the statistics carry no peak reserved bytes"
            fragmentation.append(entry)

    results = {"meta": meta, "latency": latency, "churn": churn, "fragmentation": fragmentation,
               "runs": [run_entry(r) for r in runs]}
    if ok(native_mixed) and records_of(native_mixed, "mixed"):
        results["mixed_native"] = records_of(native_mixed, "mixed")[-1]
    co = by.get(("core_overhead", None, None))
    results["core_overhead"] = records_of(co, "core_overhead") if ok(co) else []
    results["targets"] = evaluate_targets(results)
    return results


def latency_points(run, api):
    points = {}
    for rec in records_of(run, "latency"):
        if rec.get("api") != api or "skipped" in rec or "error" in rec:
            continue
        points[int(rec["size"])] = {k: rec.get(k) for k in ("pair_median_ns", "pair_p90_ns", "pair_min_ns",
                                                          "alloc_median_ns", "free_median_ns", "reps")}
    return points


def run_entry(r):
    e = {k: r.get(k) for k in ("name", "workload", "backend", "free_sync", "status", "reason", "seconds",
                               "cmd", "log")}
    # Sizes the program could not measure (too little free memory, or the allocation was refused).
    unmeasured = [f"{rec.get('api')} {human_size(int(rec.get('size', 0)))}: {rec.get('error') or rec.get('skipped')}"
                  for rec in records_of(r, "latency") if "error" in rec or "skipped" in rec]
    if unmeasured:
        e["unmeasured"] = unmeasured
    if r.get("stats") is not None:
        s = stats_summary(r["stats"], r.get("backend"))
        e["shim"] = {k: s[k] for k in ("allocs", "frees", "peak", "hits", "misses", "peak_reserved",
                                       "served", "error")}
        want = program_count(r, "allocations")
        total = stats_summary(r["stats"])["allocs"]
        if want is not None:
            e["shim"]["program_allocations"] = want
            e["shim"]["counts_match"] = total == want
    return e


def evaluate_targets(results):
    out = []
    lat = {}
    for p in results["latency"]:
        lat.setdefault(p["config"], []).append(p)
    for s, limit in (("none", TARGET_NONE_NS), ("barrier", TARGET_BARRIER_NS)):
        for b in POOLS:
            pts = lat.get(shim_config(b, s), [])
            t = {"target": f"pool hit, free_sync={s}: pair median <= {limit / 1000:g} us at every size",
                 "config": shim_config(b, s), "limit": limit, "unit": "ns"}
            if pts:
                worst = max(pts, key=lambda p: p["pair_median_ns"])
                t.update(value=worst["pair_median_ns"], at_size=worst["size"],
                         passed=worst["pair_median_ns"] <= limit)
            else:
                t.update(value=None, passed=None)
            out.append(t)
    for f in results["fragmentation"]:
        if f["backend"] != "vmm":
            continue
        out.append({"target": f"vmm fragmentation (peak reserved / peak live), mixed workload, "
                              f"free_sync={f['free_sync']} <= {TARGET_VMM_FRAGMENTATION}",
                    "config": f["config"], "limit": TARGET_VMM_FRAGMENTATION, "unit": "ratio",
                    "value": f["fragmentation"],
                    "passed": None if f["fragmentation"] is None
                    else f["fragmentation"] <= TARGET_VMM_FRAGMENTATION})
    return out


# ---- formatting --------------------------------------------------------------------------------

def human_size(b):
    for unit, n in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n and b % n == 0:
            return f"{b // n} {unit}"
    return f"{b} B"


def human_bytes(b):
    if b is None:
        return "n/a"
    v, unit = float(b), "B"
    for u in ("KiB", "MiB", "GiB", "TiB"):
        if v < 1024:
            break
        v, unit = v / 1024, u
    return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"


def fmt_us(ns):
    if ns is None:
        return "n/a"
    us = ns / 1000.0
    if us < 1:
        return f"{us:.3f}"
    if us < 10:
        return f"{us:.2f}"
    if us < 1000:
        return f"{us:.1f}"
    return f"{us:.0f}"


def fmt_ratio(r):
    if r is None:
        return "n/a"
    if r >= 100:
        return f"{r:.0f}x"
    if r >= 10:
        return f"{r:.1f}x"
    return f"{r:.3g}x"


def fmt_value(t):
    if t.get("value") is None:
        return "not measured"
    if t["unit"] == "ns":
        return f"{fmt_us(t['value'])} us (worst at {human_size(t['at_size'])})"
    return f"{t['value']:.4f}"


def fmt_passed(p):
    return {True: "PASS", False: "MISS", None: "n/a"}[p]


def config_order(names):
    fixed = [NATIVE_MALLOC, NATIVE_ASYNC, NATIVE_ASYNC_SYNC, "native"]
    rest = [shim_config(b, s) for b in BACKENDS for s in FREE_SYNC]
    order = {n: i for i, n in enumerate(fixed + rest)}
    return sorted(names, key=lambda n: (order.get(n, len(order)), n))


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(results):
    m = results["meta"]
    out = ["# allocshim allocation benchmarks", ""]
    out += [f"- date: {m.get('date', '?')}",
            f"- GPU: {m.get('gpu', '?')}, driver {m.get('driver', '?')} (CUDA driver API "
            f"{m.get('cuda_driver', '?')}, runtime {m.get('cuda_runtime', '?')})",
            f"- commit: {m.get('commit', 'unknown')}",
            f"- host: {m.get('host', '?')}",
            f"- total run time: {m.get('total_seconds', 0):.1f} s ({'limit %.0f s' % m['time_limit'] if m.get('time_limit') else 'no time limit'})",
            f"- clock read: {m.get('clock_overhead_ns', '?')} ns, included once in every pair time",
            "", "Times are medians of host time per alloc+free pair; `x` is the ratio to native "
            "cudaMalloc+cudaFree at the same size, measured in the same session (below 1: faster).", ""]

    out += ["## Targets", ""]
    out += table(["target", "config", "measured", "result"],
                 [[t["target"], t["config"], fmt_value(t), fmt_passed(t.get("passed"))]
                  for t in results["targets"]])
    out.append("")

    lat = {}
    for p in results["latency"]:
        lat.setdefault(p["config"], {})[p["size"]] = p
    sizes = sorted({p["size"] for p in results["latency"]})
    if lat:
        out += ["## Latency: alloc+free pair, median us (ratio to cudaMalloc)", ""]
        rows = []
        for name in config_order(lat):
            cells = []
            for size in sizes:
                p = lat[name].get(size)
                cells.append("n/a" if p is None else
                             f"{fmt_us(p['pair_median_ns'])} ({fmt_ratio(p['ratio_vs_malloc'])})")
            rows.append([config_label(name)] + cells)
        out += table(["config"] + [human_size(s) for s in sizes], rows)
        if any(p["ratio_vs_malloc_async"] is not None for p in results["latency"]):
            out += ["", "## Latency: ratio to cudaMallocAsync+cudaFreeAsync (warm default pool)", ""]
            rows = [[config_label(name)] + [
                "n/a" if lat[name].get(s) is None else fmt_ratio(lat[name][s]["ratio_vs_malloc_async"])
                for s in sizes] for name in config_order(lat)]
            out += table(["config"] + [human_size(s) for s in sizes], rows)
        out += ["", "## Latency: p90 us / alloc median us / free median us", ""]
        rows = []
        for name in config_order(lat):
            rows.append([config_label(name)] + [
                "n/a" if lat[name].get(s) is None else
                f"{fmt_us(lat[name][s]['pair_p90_ns'])} / {fmt_us(lat[name][s]['alloc_median_ns'])} / "
                f"{fmt_us(lat[name][s]['free_median_ns'])}" for s in sizes])
        out += table(["config"] + [human_size(s) for s in sizes], rows)
        out.append("")

    churn = {}
    for c in results["churn"]:
        churn.setdefault(c["config"], {})[c["threads"]] = c
    threads = sorted({c["threads"] for c in results["churn"]})
    if churn:
        out += ["## Churn: pairs/s over all threads (throughput ratio to native), median pair us", ""]
        rows = []
        for name in config_order(churn):
            rows.append([config_label(name)] + [
                "n/a" if churn[name].get(t) is None else
                f"{churn[name][t]['pairs_per_s']:.0f} ({fmt_ratio(churn[name][t]['throughput_vs_native'])}), "
                f"{fmt_us(churn[name][t]['pair_median_ns'])}" for t in threads])
        out += table(["config"] + [f"{t} thread{'s' if t > 1 else ''}" for t in threads], rows)
        out.append("")

    if results["fragmentation"] or results.get("mixed_native"):
        out += ["## Fragmentation: mixed workload (peak reserved / peak live)", ""]
        nm = results.get("mixed_native")
        if nm:
            out += [f"Native: {nm.get('allocs')} allocations, peak live {human_bytes(nm.get('peak_live_bytes'))}, "
                    f"{nm.get('seconds', 0):.3f} s.", ""]
        rows = [[config_label(f["config"]), human_bytes(f["program_peak_live"]), human_bytes(f["shim_peak_live"]),
                 human_bytes(f["peak_reserved"]),
                 "n/a" if f["fragmentation"] is None else f"{f['fragmentation']:.4f}",
                 fmt_ratio(f["time_vs_native"]), f.get("note", "")] for f in results["fragmentation"]]
        out += table(["config", "program peak live", "shim peak live", "peak reserved", "fragmentation",
                      "time vs native", "note"], rows)
        out.append("")

    if results.get("core_overhead"):
        out += ["## Core overhead: the shim's core on a null driver (core_overhead)", "",
                "The same alloc+free pairs straight on a driver table that costs a few ns, and through the "
                "core with the native backend; half the difference is what the core adds to one hooked call.", ""]
        out += table(["threads", "direct ns/pair", "core ns/pair", "added ns/call"],
                     [[c.get("threads"), f"{c.get('direct_ns_per_pair', 0):.1f}", f"{c.get('core_ns_per_pair', 0):.1f}",
                       f"{c.get('added_ns_per_call', 0):.1f}"] for c in results["core_overhead"]])
        out.append("")

    out += ["## Runs", ""]
    rows = []
    for r in results["runs"]:
        note = r.get("reason") or ""
        shim = r.get("shim")
        if shim:
            extra = f"shim: {shim['allocs']} allocs"
            if shim.get("hits") or shim.get("misses"):
                extra += f", hits {shim['hits']}, misses {shim['misses']}"
            if shim.get("counts_match") is False:
                extra += f"; program made {shim['program_allocations']}: COUNTS DIFFER"
            note = f"{note}; {extra}" if note else extra
        if r.get("unmeasured"):
            note = "; ".join(([note] if note else []) + ["not measured: " + ", ".join(r["unmeasured"])])
        rows.append([r["name"], r["status"], f"{r.get('seconds') or 0:.1f}", note])
    out += table(["run", "status", "seconds", "note"], rows)
    out.append("")
    return "\n".join(out)


def render_short_table(results):
    """The last lines printed: pair medians per size, churn at the most threads, fragmentation,
    targets."""
    lat = {}
    for p in results["latency"]:
        lat.setdefault(p["config"], {})[p["size"]] = p
    sizes = sorted({p["size"] for p in results["latency"]})
    churn = {}
    for c in results["churn"]:
        churn.setdefault(c["config"], {})[c["threads"]] = c
    top = max((c["threads"] for c in results["churn"]), default=None)
    frag = {f["config"]: f["fragmentation"] for f in results["fragmentation"]}
    names = set(lat) | (set(churn) - {"native"}) | ({NATIVE_MALLOC} if "native" in churn else set())
    names = config_order(names)
    head = f"{'config':<34}" + "".join(f"{human_size(s):>9}" for s in sizes)
    head += f"{f'churn@{top}/s' if top else '':>14}{'frag':>8}"
    lines = ["pair median us (alloc+free), churn pairs/s, fragmentation:", head]
    for name in names:
        row = f"{config_label(name)[:33]:<34}"
        row += "".join(f"{fmt_us(lat.get(name, {}).get(s, {}).get('pair_median_ns')):>9}" for s in sizes)
        c = churn.get(name if name != NATIVE_MALLOC else "native", {}).get(top)
        row += f"{c['pairs_per_s']:>14.0f}" if c else f"{'':>14}"
        row += f"{frag[name]:>8.3f}" if frag.get(name) is not None else f"{'':>8}"
        lines.append(row)
    for t in results["targets"]:
        lines.append(f"{fmt_passed(t.get('passed')):<5} {t['config']}: {t['target']}: {fmt_value(t)}")
    return "\n".join(lines)
