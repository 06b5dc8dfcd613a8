"""results.md and the short table of a bench.py run, from the results document
all_results.py computes. The allocation benchmarks' tables are bench_results.py's, one heading
level down. No I/O. Python standard library only.
"""

import all_results as ar
import bench_results as br

COMPAT_HEADINGS = {"default": "default policy (served by)", "native": "native", "vmm": "vmm",
                   "async_pool": "async_pool", "managed": "managed", "host": "host"}


def _f(v, spec, none="n/a"):
    return none if v is None else format(v, spec)


def _x(v):
    return br.fmt_ratio(v)


def compat_cell(t, column):
    """One cell of the compatibility table: what the suite test said, briefly."""
    if t is None:
        return "not in the suite"
    r = t["result"]
    if r == "PASS":
        text = "same output" if "identical to native" in t["detail"] else "PASS"
        if "allocs " in t["detail"]:
            text += ", counts exact"
        if column == "default" and t.get("served"):
            text += f" ({t['served']})"
        return text
    if r == "NOT RUN":
        return "not run yet"
    detail = t["detail"] if len(t["detail"]) <= 90 else t["detail"][:87] + "..."
    return f"{'FAIL' if r == 'FAIL' else 'skipped'}: {detail}".replace("|", "/")


def render_compatibility(results):
    table = results.get("compatibility") or {}
    if not table:
        return []
    out = ["## Compatibility: programs not written for allocshim, under each backend", "",
           "Each cell is a GPU suite test (tests/gpu/suite.txt): the program natively and under the shim with "
           "every allocation served by that backend; \"same output\" means its stdout was identical to the native "
           "run's, \"counts exact\" that the shim saw exactly the allocations the program made.", ""]
    rows = [[label] + [compat_cell(table.get(prog, {}).get(c), c) for c in ar.COMPAT_COLUMNS]
            for prog, label in ar.COMPAT_PROGRAMS]
    out += br.table(["program"] + [COMPAT_HEADINGS[c] for c in ar.COMPAT_COLUMNS], rows)
    return out + [""]


def render_suite(s):
    out = [f"GPU suite (tests/gpu/run_gpu_suite.sh): passed {s['passed']}, failed {s['failed']}, skipped "
           f"{s['skipped']}, not run {s['not_run']} of {len(s['tests'])}"
           + ("" if s.get("complete") else " (the suite did not finish: see NOT RUN)") + ".", ""]
    out += br.table(["test", "result", "seconds", "served by (allocations)", "detail"],
                    [[t["name"], t["result"], _f(t.get("seconds"), ".1f", ""), t.get("served") or "",
                      (t.get("detail") or "").replace("|", "/")] for t in s["tests"]])
    return out + [""]


def render_alloc(data, plots):
    # Its title is this section's heading; date, GPU, commit and host are the run's, at the top.
    lines = [l for l in br.render_markdown(data).splitlines()[1:]
             if not l.startswith(("- date:", "- GPU:", "- commit:", "- host:"))]
    while lines and not lines[0].strip():
        lines.pop(0)
    if "## Targets" in lines:  # they are in the run's targets table, at the top
        start = lines.index("## Targets")
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("#")), len(lines))
        del lines[start:end]
    out = ["#" + l if l.startswith("#") else l for l in lines] + [""]
    for stem, what in (("latency", "alloc+free latency per size per backend"), ("churn", "churn throughput")):
        if stem + ".png" in plots:
            out += [f"![{what}]({stem}.png)", ""]
    return out


def _real_table(part, target_row=None):
    rows = []
    for r in part.get("rows", []):
        ratio = _x(r.get("ratio"))
        if r["name"] == target_row and r.get("ratio") is not None:
            ratio += f" (target <= {ar.TARGET_TORCH_RATIO}x: {'PASS' if r['ratio'] <= ar.TARGET_TORCH_RATIO else 'MISS'})"
        st = r.get("stats")
        shim = "-" if not st else f"{st.get('allocs')} (" + ", ".join(f"{k} {v}" for k, v in st.get("served", {}).items()) + ")"
        rows.append([r["name"], _f(r.get("best"), ".3f", "-"), ", ".join(f"{t:.3f}" for t in r.get("times", [])) or "-",
                     ratio, {None: "n/a", True: "yes", False: "**NO**"}[r.get("identical")], shim,
                     (r.get("detail") or "").replace("|", "/")])
    return br.table(["run", "best s", "runs (s)", "ratio to the first", "output identical to the first",
                     "shim allocations (by backend)", "note"], rows)


def render_real(d):
    out = []
    torch = d.get("torch", {})
    if torch.get("rows"):
        out += [f"PyTorch training loop (tests/gpu/torch_train.py, {d.get('steps')} steps timed after warm-up, "
                f"best of {d.get('reps')}); the first row, PyTorch's own caching allocator, is the native path:", ""]
        out += _real_table(torch, torch.get("target_row")) + [""]
    thrust = d.get("thrust", {})
    if thrust.get("rows"):
        out += [f"thrust_sort ({d.get('arrays')} arrays, total time, best of {d.get('reps')}), natively first:", ""]
        out += _real_table(thrust) + [""]
    elif thrust.get("not_built"):
        out += [f"thrust_sort: not built ({thrust['not_built']}).", ""]
    return out


def render_spill(d, plots):
    out = []
    if d.get("b_dev") is not None:
        out += [f"Model bound 1/(f_dev/B_dev + f_host/B_host) from B_dev {d['b_dev']:.1f} GB/s (a device buffer) and "
                f"B_host {d['b_host']:.1f} GB/s (pinned host memory mapped), measured in the same run; "
                f"budget {d['budget_gib']:g} GiB.", ""]
    out += br.table(["factor", "size GiB", "f_host", "spilled GB/s", "model bound GB/s", "spilled / bound",
                     "managed host GB/s", "spilled / managed host", "managed stripe GB/s", "stripe / bound"],
                    [[f"{r['factor']:g}", f"{r['size_gib']:.2f}", f"{r['f_host']:.3f}", f"{r['spilled_gbps']:.1f}",
                      f"{r['bound_gbps']:.1f}", _f(r["of_bound"], ".1%"), _f(r["managed_host_gbps"], ".1f", "skipped"),
                      _x(r["vs_managed_host"]), _f(r["managed_stripe_gbps"], ".1f", "skipped"),
                      _f(r["managed_stripe_of_bound"], ".1%")] for r in d.get("rows", [])])
    if "bandwidth.png" in plots:
        out += ["", "![read bandwidth against the oversubscription factor](bandwidth.png)"]
    return out + [""]


def render_trace(d):
    out = []
    b = d.get("bench")
    if b:
        out += ["trace_bench (tools/bench/trace_bench.cpp: repeated call sites, native stacks; without tracing the "
                "recorder is not called, so this is the added cost):", ""]
        out += br.table(["events", "unwinder", "median ns", "p90 ns", "p99 ns", "alloc median ns", "free median ns",
                         "bytes/event"],
                        [[b.get("events"), b.get("unwinder") or "?", _f(b.get("median_ns"), ".0f"), _f(b.get("p90_ns"), ".0f"),
                          _f(b.get("p99_ns"), ".0f"), _f(b.get("alloc_median_ns"), ".0f"),
                          _f(b.get("free_median_ns"), ".0f"), _f(b.get("bytes_per_event"), ".2f")]]) + [""]
    loops = d.get("loops") or {}
    if loops:
        out += ["alloc_loop (a real CUDA program) natively, under the shim (default policy) and under the shim with "
                "`--trace`:", ""]
        labels = {"native": "native (no shim)", "shim": "shim, not traced", "traced": "shim, traced"}
        out += br.table(["run", "status", "pair us", "wall s", "note"],
                        [[labels[k], loops[k].get("status"), _f(loops[k].get("pair_us"), ".2f"),
                          _f(loops[k].get("seconds"), ".2f"), (loops[k].get("reason") or "").replace("|", "/")]
                         for k in ("native", "shim", "traced") if k in loops])
        out += ["", f"Traced over untraced: pair {_x(d.get('traced_vs_untraced_pair'))}, wall "
                f"{_x(d.get('traced_vs_untraced_wall'))}; added per traced event "
                f"{_f(d.get('added_ns_per_event'), '.0f')} ns; trace {_f(d.get('loop_bytes_per_event'), '.2f')} "
                f"bytes per event. Shim over native: pair {_x(d.get('shim_vs_native_pair'))}.", ""]
    return out


def render_replay(d):
    out = []
    rec = d.get("record") or {}
    if rec:
        out += [f"Recorded once: `{rec.get('workload', '?')}` under `allocshim run --backend native --trace` "
                f"({rec.get('status')}{', ' + rec['reason'] if rec.get('reason') else ''}; trace "
                f"{br.human_bytes(rec.get('trace_bytes'))}), then `allocshim replay TRACE --policy P --json` with "
                "each backend as the default; ratios against the native backend's replay.", ""]
    rows = []
    for r in d.get("backends", []):
        rows.append([r["backend"], r["status"], _f(r.get("allocs"), "d"), _f(r.get("failures"), "d"),
                     br.human_bytes(r.get("peak_live")), br.human_bytes(r.get("peak_reserved")),
                     _f(r.get("fragmentation"), ".4f"), _x(r.get("reserved_vs_native")),
                     br.fmt_us(r.get("alloc_median_ns")), _x(r.get("alloc_vs_native")),
                     "; ".join(x for x in (r.get("reason"), r.get("error")) if x).replace("|", "/")])
    if rows:
        out += br.table(["backend", "status", "allocs", "failures", "peak live", "peak reserved",
                         "peak reserved / peak live", "reserved vs native", "alloc median us", "alloc vs native",
                         "note"], rows) + [""]
    return out


def render_ipc(d):
    configs = d.get("configs", [])
    sizes = sorted({s["bytes"] for c in configs for s in c["sizes"]})
    if not configs:
        return []
    out = ["export + open + close, sum of the medians in us (ratio to native IPC of cudaMalloc memory); "
           "tools/bench/ipc_bench.cu:", ""]
    rows = []
    for c in configs:
        by = {s["bytes"]: s for s in c["sizes"]}
        cells = [f"{by[b]['total_p50']:.1f} ({_x(by[b].get('total_vs_native'))})" if b in by else "n/a" for b in sizes]
        rows.append([c["config"], c["status"]] + cells + [(c.get("reason") or "").replace("|", "/")])
    out += br.table(["config", "status"] + [br.human_size(b) for b in sizes] + ["note"], rows)
    rows = []
    for c in configs:
        by = {s["bytes"]: s for s in c["sizes"]}
        rows.append([c["config"]] + [f"{by[b]['get_p50']:.1f} / {by[b]['open_p50']:.1f} / {by[b]['close_p50']:.1f}"
                                     if b in by else "n/a" for b in sizes])
    out += ["", "get / open / close medians, us:", ""]
    out += br.table(["config"] + [br.human_size(b) for b in sizes], rows)
    return out + [""]


def render_script(d):
    return d.get("summary") or ["(no summary)"]


def render_records(d):
    """core_overhead / launch_overhead: one row per thread count, the program's own fields."""
    rows = d.get("records") or []
    if not rows:
        return ["(no records)", ""]
    keys = d.get("columns") or list(rows[0])
    return br.table(keys, [[_f(r.get(k), ".1f") if isinstance(r.get(k), float) else r.get(k) for k in keys]
                           for r in rows]) + [""]


def _limit(m):
    return f"limit {m['time_limit']:.0f} s" if m.get("time_limit") else "no time limit"


def _shown(sec):
    return sec.get("reason") != LEFT_OUT


LEFT_OUT = "left out (--skip/--only)"


def render_markdown(results, plots=()):
    m = results.get("meta", {})
    sections = results.get("sections", {})
    alloc_meta = ((sections.get("alloc") or {}).get("data") or {}).get("meta", {})
    out = ["# allocshim benchmarks", "",
           f"- date: {m.get('date', '?')}",
           f"- GPU: {m.get('gpu', '?')}, driver {m.get('driver', '?')}"
           + (f" (CUDA driver API {alloc_meta['cuda_driver']}, runtime {alloc_meta['cuda_runtime']})"
              if alloc_meta.get("cuda_driver") else ""),
           f"- commit: {m.get('commit', 'unknown')}",
           f"- host: {m.get('host', '?')}, python {m.get('python', '?')}",
           f"- total: {m.get('total_seconds', 0):.0f} s ({_limit(m)})"
           + (" — stopped early, partial results" if m.get("partial") else ""),
           f"- command: `{m.get('command', '?')}`", "",
           "Every benchmark is compared with the native path measured in the same run (ratios: `x`).", ""]
    if "headline.png" in plots:
        out += ["![alloc+free pair latency of cudaMalloc, a warm cudaMallocAsync pool and the default policy; "
                "spilled read bandwidth against its bound](headline.png)", ""]
    out += ["## Summary", ""]
    s = (sections.get("suite") or {}).get("data")
    if s:
        out += [f"GPU suite: passed {s['passed']}, failed {s['failed']}, skipped {s['skipped']}, "
                f"not run {s['not_run']}.", ""]
    out += br.table(["section", "what", "status", "seconds", "note"],
                    [[name, ar.TITLES[name], (sections.get(name) or {}).get("status", "not run"),
                      _f((sections.get(name) or {}).get("seconds"), ".1f", ""),
                      ((sections.get(name) or {}).get("reason") or "").replace("|", "/")] for name in ar.SECTIONS
                     if _shown(sections.get(name) or {})])
    out += ["", "### Targets", ""]
    out += br.table(["section", "target", "config", "measured", "result"],
                    [[t["section"], t["target"], t["config"], ar.fmt_target_value(t), br.fmt_passed(t.get("passed"))]
                     for t in results.get("targets", [])])
    out.append("")

    renderers = {"suite": lambda d: render_suite(d), "alloc": lambda d: render_alloc(d, plots),
                 "real": render_real, "spill": lambda d: render_spill(d, plots), "trace": render_trace,
                 "replay": render_replay, "ipc": render_ipc, "core_overhead": render_records,
                 "launch_overhead": render_records}
    for name in ar.SECTIONS:
        sec = sections.get(name) or {}
        if not _shown(sec) or (sec.get("status") == "skipped" and not sec.get("data")):
            continue  # the summary table says why
        out += [f"## {ar.TITLES[name][0].upper()}{ar.TITLES[name][1:]} (`{name}`)", ""]
        if sec.get("commands"):
            out += ["Commands:", ""] + [f"    {c}" for c in sec["commands"]] + [""]
        if sec.get("data"):
            out += renderers.get(name, render_script)(sec["data"]) + [""]
        if sec.get("status") != "ok":
            out += [f"Section {sec.get('status', 'not run')}" + (f": {sec['reason']}" if sec.get("reason") else "")
                    + ".", ""]
        if name == "suite":
            out += render_compatibility(results)
    return "\n".join(out)


def render_short_table(results):
    """The last lines printed: each section's status, the suite's counts, every target."""
    m = results.get("meta", {})
    sections = results.get("sections", {})
    lines = [f"allocshim bench: {m.get('gpu', '?')}, commit {m.get('commit', '?')}, "
             f"{m.get('total_seconds', 0):.0f} s ({_limit(m)})"
             + (" (partial)" if m.get("partial") else "")]
    for name in ar.SECTIONS:
        sec = sections.get(name) or {}
        if not _shown(sec):
            continue
        lines.append(f"  {name:<15} {sec.get('status', 'not run'):<8} {_f(sec.get('seconds'), '6.1f', '      ')} s  "
                     + (sec.get("reason") or "")[:100])
    s = (sections.get("suite") or {}).get("data")
    if s:
        lines.append(f"GPU suite: passed {s['passed']}, failed {s['failed']}, skipped {s['skipped']}, "
                     f"not run {s['not_run']}")
        failed = [t["name"] for t in s["tests"] if t["result"] == "FAIL"]
        if failed:
            lines.append("  FAIL: " + ", ".join(failed))
    for t in results.get("targets", []):
        lines.append(f"{br.fmt_passed(t.get('passed')):<5} {t['section']:<6} {t['target']}: {ar.fmt_target_value(t)}"
                     + (f" [{t['config']}]" if t["section"] == "alloc" else ""))
    return "\n".join(lines)
