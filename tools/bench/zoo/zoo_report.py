"""How the model zoo's record (zoo.json, as zoo_run.py keeps it) reads: the line zoo_run.py prints
for each row as it is recorded, the Markdown tables of the loops and the held-out loops, and the
record for the results folder that `zoo_run.py --report` writes (zoo-GPU-DATE.md). Standard library
only.
"""
import os
import re
import shlex

from zoo_defs import GIB, GOAL_BOUND, GOAL_NATIVE_90, LOOPS, MIB, MODES, REPO, SETTLE, now


def fmt_ms(x):
    return "-" if x is None else f"{x:.1f}"


def fmt_x(x):
    return "-" if x is None else f"{x:.2f}x"


def fmt_bytes(n):
    return "-" if n is None else (f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB")


def progress(row):
    where = "native" if row["mode"] == "native" else f"{row['fraction']}% {row['mode']}"
    if row["status"] != "ok":
        return f"zoo: {row['loop']} {where}: {row['status']}: {row['reason']}"
    text = f"zoo: {row['loop']} {where}: settled {fmt_ms(row['settled_ms'])} ms"
    if row["mode"] == "native":
        return text + f", peak {fmt_bytes(row.get('peak_bytes'))}"
    return text + (f" ({fmt_x(row.get('x_native'))} native, {fmt_x(row.get('x_bound'))} bound), "
                   f"outputs {'same' if row.get('same') else 'DIFFERENT' if row.get('same') is False else '?'}")


GOAL_NAMES = {"ran": "ran", "bound": f"<={GOAL_BOUND}x bound", "vs_off": "<=off",
              "native_90": f"<={GOAL_NATIVE_90}x native", "same": "same outputs"}


def goal_cell(row):
    if row["status"] != "ok":
        return f"{row['status'].upper()}: {row['reason']}".replace("|", "/")
    if row["mode"] != "auto":
        return "-"
    missed = [GOAL_NAMES[k] for k, v in row["goals"].items() if v is False]
    open_ = [GOAL_NAMES[k] for k, v in row["goals"].items() if v is None]
    text = "PASS" if not missed else "MISS " + ", ".join(missed)
    return text + (f" (undecided: {', '.join(open_)})" if open_ else "")


def order(row):
    loop = LOOPS.index(row["loop"]) if row["loop"] in LOOPS else len(LOOPS)
    mode = -1 if row["mode"] == "native" else MODES.index(row["mode"]) if row["mode"] in MODES else len(MODES)
    return (loop, row["loop"], -row["fraction"], mode)


def table(rows):
    head = ("| loop | budget | mode | first 20: ms (x native) | settled: ms (x native) | on host (from) "
            "| bound ms | x bound | same | goals |\n|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in sorted(rows, key=order):
        first = f"{fmt_ms(r.get('first20_ms'))} ({fmt_x(r.get('first20_x_native'))})"
        settled = f"{fmt_ms(r.get('settled_ms'))} ({fmt_x(r.get('x_native'))})"
        if r["mode"] == "native":
            budget = f"none (peak {fmt_bytes(r.get('peak_bytes'))})"
            same = {True: "repeat same", False: "REPEAT DIFFERS"}.get(r.get("repeat_same"), "-")
            host, xb = "-", "-"
        else:
            budget = f"{r['fraction']}% = {fmt_bytes(r.get('budget_bytes'))}"
            same = {True: "same", False: "DIFFERENT"}.get(r.get("same"), "?")
            host = f"{fmt_bytes(r.get('host_bytes'))} ({r.get('host_source') or '-'})"
            xb = fmt_x(r.get("x_bound"))
        lines.append(f"| {r['loop']} | {budget} | {r['mode']} | {first} | {settled} | {host} | "
                     f"{fmt_ms(r.get('bound_ms'))} | {xb} | {same} | {goal_cell(r)} |")
    auto = [r for r in rows if r["mode"] == "auto"]
    summary = f"\n`auto` rows meeting every goal: {sum(1 for r in auto if r.get('pass'))} of {len(auto)}.\n"
    return head + "\n".join(lines) + "\n" + summary


def render(record):
    rows = list(record["rows"].values())
    main = [r for r in rows if not r.get("held_out")]
    held = [r for r in rows if r.get("held_out")]
    out = "## Loops\n\n" + (table(main) if main else "(none)\n")
    out += f"\n## Held out ({', '.join(sorted(set(record.get('held_out', []))))}: the shim is not tuned on these)\n\n"
    return out + (table(held) if held else "(none)\n") + learned(rows)


def learned(rows):
    """Per row under the shim: the step it learned (placement/step.h) and what its decisions did, from
    the stats the row kept; rows without them are left out."""
    lines = []
    for r in sorted(rows, key=order):
        st = r.get("stats") or {}
        step, d = st.get("step"), st.get("decisions")
        if r["mode"] == "native" or (not step and not d):
            continue
        if not step or not step.get("epoch"):
            what = "no step learned (no recording ended)"
        elif not step.get("repeats"):
            what = "no step: nothing repeats"
        else:
            what = (f"{step.get('submissions')} submissions, {step.get('synchronizations')} synchronizations, "
                    f"{step.get('submitted_ns', 0) / 1e6:.1f} ms a step, {step.get('match_permille', 0) / 10:.1f}% "
                    f"repeated, {step.get('allocations_named')} allocations named")
        moves = ""
        if d:
            moves = (f"{d.get('rebalances', 0)} rebalances ({fmt_bytes(d.get('rebalance_bytes'))}), "
                     f"{d.get('regrets', 0)} regrets, {d.get('trials', 0)} trials ({d.get('trials_kept', 0)} kept, "
                     f"{d.get('trials_undone', 0)} undone), {d.get('ahead', 0)} promotions ahead "
                     f"({fmt_bytes(d.get('ahead_bytes'))}), {d.get('gate_closes', 0)} gate closes")
        lines.append(f"| {r['loop']} | {r['fraction']}% | {r['mode']} | {what} | {moves or '-'} |")
    if not lines:
        return ""
    return ("\n## What the shim learned and did\n\n| loop | budget | mode | learned step | decisions |\n"
            "|---|---|---|---|---|\n" + "\n".join(lines) + "\n")


def gpu_name(record):
    names = [r.get("device") for r in record["rows"].values() if r.get("device")]
    return max(set(names), key=names.count) if names else "unknown GPU"


def gpu_slug(name):
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]*)\b", name)
    return m.group(1).lower() if m else (re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu")


def report_path(record):
    """The results folder's zoo-GPU-DATE.md, DATE the newest row's."""
    date = max((r.get("date", "") for r in record["rows"].values()), default=now())[:10]
    return os.path.join(REPO, "tools", "bench", "results", f"zoo-{gpu_slug(gpu_name(record))}-{date}.md")


def report(record):
    """The Markdown record of a zoo.json, for the results folder."""
    bw = record.get("bandwidth") or {}
    devices = sorted({r.get("device") for r in record["rows"].values() if r.get("device")})
    dates = sorted(r.get("date", "") for r in record["rows"].values())
    lines = [f"# Model zoo (issue 43): {gpu_name(record)}, {dates[-1][:10] if dates else '?'}", ""]
    mixed = " (rows from different GPUs: compare with care)" if len(devices) > 1 else ""
    lines.append(f"- GPU: {', '.join(devices) or '?'}{mixed}")
    if bw:
        lines.append(f"- Pinned copy rate (`loops.py bandwidth`, {bw.get('date', '?')}): host to device "
                     f"{bw['h2d_bytes_per_s'] / 1e9:.1f} GB/s (the bound's), device to host "
                     f"{bw['d2h_bytes_per_s'] / 1e9:.1f} GB/s")
    else:
        lines.append("- Pinned copy rate: not measured (no bounds)")
    lines += [f"- Steps before {record.get('settle', SETTLE)} are \"first 20\", the rest \"settled\" (medians). "
              "Bound: native settled step + bytes on host / host-to-device rate; on host \"stats\" is the run's "
              "peak live bytes (shim stats, summed over backends) less the budget, \"estimate\" the native peak "
              "less the budget.",
              f"- Goals of an `auto` row: settled <= {GOAL_BOUND}x bound, <= `off` at the same budget, "
              f"<= {GOAL_NATIVE_90}x native at 90%, outputs the same as native.",
              "- Calls (date, harness commit, build commit, arguments):"]
    for c in record.get("calls", []):
        argv = shlex.join(c.get("argv", []))
        lines.append(f"  - {c.get('date')}, {c.get('harness')}, {c.get('build')}: `zoo_run.py {argv}`")
    lines += ["", render(record), "## Loops' notes", ""]
    for r in sorted((r for r in record["rows"].values() if r["mode"] == "native"), key=order):
        lines.append(f"- {r['loop']}: {'; '.join(r.get('notes') or []) or r.get('reason') or '-'}")
    return "\n".join(lines) + "\n"
