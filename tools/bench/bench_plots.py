"""Plots drawn from results.json: alloc+free latency per size per backend, and churn throughput per
thread count; one panel per free_sync mode, with the native baselines in every panel. SVG is always
written (standard library only); PNG too when matplotlib imports. Also the spill read bandwidth
against the oversubscription factor, with the model bound (bench.py's spill section).
"""

import math
from xml.sax.saxutils import escape

from bench_results import (BACKENDS, FREE_SYNC, NATIVE_ASYNC, NATIVE_MALLOC, config_label, human_size,
                           shim_config)

COLORS = ("#000000", "#7f7f7f", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def latency_panels(results):
    lat = {}
    for p in results["latency"]:
        lat.setdefault(p["config"], []).append((p["size"], p["pair_median_ns"] / 1000.0))
    panels = []
    for s in FREE_SYNC:
        series = [(config_label(n), sorted(lat[n])) for n in (NATIVE_MALLOC, NATIVE_ASYNC) if n in lat]
        series += [(f"shim {b}", sorted(lat[shim_config(b, s)])) for b in BACKENDS
                   if shim_config(b, s) in lat]
        panels.append((f"free_sync={s}", series))
    return panels if any(series for _, series in panels) else []


def churn_panels(results):
    ch = {}
    for c in results["churn"]:
        if c.get("pairs_per_s"):
            ch.setdefault(c["config"], []).append((c["threads"], c["pairs_per_s"]))
    panels = []
    for s in FREE_SYNC:
        series = [("cudaMalloc+cudaFree (native)", sorted(ch["native"]))] if "native" in ch else []
        series += [(f"shim {b}", sorted(ch[shim_config(b, s)])) for b in BACKENDS if shim_config(b, s) in ch]
        panels.append((f"free_sync={s}", series))
    return panels if any(series for _, series in panels) else []


def _log_range(values, base):
    lo = math.floor(math.log(min(values), base))
    hi = math.ceil(math.log(max(values), base))
    return lo, hi if hi > lo else lo + 1


def write_svg(path, title, panels, xlabel, ylabel, xfmt):
    w, h, left, right, top, bottom = 430, 300, 70, 20, 50, 60
    xs = [x for _, series in panels for _, pts in series for x, _ in pts]
    ys = [y for _, series in panels for _, pts in series for _, y in pts if y > 0]
    if not xs or not ys:
        return False
    x_lo, x_hi = _log_range(xs, 2)
    y_lo, y_hi = _log_range(ys, 10)
    legend_rows = max(len(series) for _, series in panels)
    width = left + len(panels) * w + right
    height = top + h + bottom + 18 * legend_rows + 10

    def px(x, i):
        return left + i * w + (math.log2(x) - x_lo) / (x_hi - x_lo) * (w - 40)

    def py(y):
        return top + h - (math.log10(y) - y_lo) / (y_hi - y_lo) * h

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'font-family="sans-serif" font-size="11">',
         f'<rect width="{width}" height="{height}" fill="white"/>',
         f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="15">{escape(title)}</text>']
    ticks = sorted(set(xs))
    for i, (name, series) in enumerate(panels):
        x0, x1 = left + i * w, left + i * w + w - 40
        o.append(f'<text x="{(x0 + x1) / 2}" y="{top - 8}" text-anchor="middle" font-size="13">{escape(name)}</text>')
        o.append(f'<rect x="{x0}" y="{top}" width="{x1 - x0}" height="{h}" fill="none" stroke="#444"/>')
        for e in range(y_lo, y_hi + 1):
            y = py(10.0 ** e)
            o.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="#ddd"/>')
            if i == 0:
                o.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{10.0 ** e:g}</text>')
        for t in ticks:
            x = px(t, i)
            o.append(f'<line x1="{x:.1f}" y1="{top + h}" x2="{x:.1f}" y2="{top + h + 4}" stroke="#444"/>')
            o.append(f'<text x="{x:.1f}" y="{top + h + 16}" text-anchor="middle" font-size="9">{escape(xfmt(t))}</text>')
        o.append(f'<text x="{(x0 + x1) / 2}" y="{top + h + 34}" text-anchor="middle">{escape(xlabel)}</text>')
        for k, (label, pts) in enumerate(series):
            color = COLORS[k % len(COLORS)]
            dash = "" if label.startswith("shim") else ' stroke-dasharray="5,3"'  # natives dashed
            pts = [(x, y) for x, y in pts if y > 0]
            path_pts = " ".join(f"{px(x, i):.1f},{py(y):.1f}" for x, y in pts)
            o.append(f'<polyline points="{path_pts}" fill="none" stroke="{color}" stroke-width="1.6"{dash}/>')
            o += [f'<circle cx="{px(x, i):.1f}" cy="{py(y):.1f}" r="2.5" fill="{color}"/>' for x, y in pts]
            ly = top + h + bottom + 18 * k
            o.append(f'<line x1="{x0}" y1="{ly}" x2="{x0 + 24}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>')
            o.append(f'<text x="{x0 + 30}" y="{ly + 4}">{escape(label)}</text>')
    o.append(f'<text x="16" y="{top + h / 2}" text-anchor="middle" '
             f'transform="rotate(-90 16 {top + h / 2})">{escape(ylabel)}</text>')
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")
    return True


def write_png(path, title, panels, xlabel, ylabel, xfmt):
    """False when matplotlib is not importable."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # ImportError, or a broken installation: the SVG stands alone then
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 4.6), sharey=True, squeeze=False)
    for ax, (name, series) in zip(axes[0], panels):
        for k, (label, pts) in enumerate(series):
            pts = [(x, y) for x, y in pts if y > 0]
            if not pts:
                continue
            style = "-" if label.startswith("shim") else "--"
            ax.plot([x for x, _ in pts], [y for _, y in pts], style, marker="o", markersize=3,
                    color=COLORS[k % len(COLORS)], label=label)
        ticks = sorted({x for _, pts in series for x, _ in pts})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        if ticks:
            ax.set_xticks(ticks)
            ax.set_xticklabels([xfmt(t) for t in ticks], rotation=45, fontsize=8)
            ax.minorticks_off()
        ax.set_title(name)
        ax.set_xlabel(xlabel)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def bandwidth_panels(spill):
    """spill: all_results.parse_spill's dict. One panel: the shim's spilled allocation (solid), the
    model bound and managed memory (dashed: what the shim is measured against)."""
    rows = sorted(spill.get("rows", []), key=lambda r: r["factor"])
    series = [(label, [(r["factor"], r[key]) for r in rows if r.get(key)])
              for label, key in (("shim, spilled to host chunks", "spilled_gbps"),
                                 ("model bound 1/(f_dev/B_dev + f_host/B_host)", "bound_gbps"),
                                 ("managed, host placement", "managed_host_gbps"),
                                 ("managed, striped placement", "managed_stripe_gbps"))]
    series = [(label, pts) for label, pts in series if pts]
    return [("read bandwidth of one allocation of factor x the budget", series)] if series else []


def plot_bandwidth(spill, outdir, png=True):
    """bandwidth.svg (and .png): spilled read bandwidth against the oversubscription factor."""
    import os
    panels = bandwidth_panels(spill or {})
    written = []
    if not panels:
        return written
    args = ("spill read bandwidth against oversubscription", panels, "oversubscription factor (size / budget)",
            "GB/s", lambda f: f"{f:g}x")
    svg = os.path.join(outdir, "bandwidth.svg")
    if write_svg(svg, *args):
        written.append(svg)
    pngp = os.path.join(outdir, "bandwidth.png")
    if png and write_png(pngp, *args):
        written.append(pngp)
    return written


def plot_all(results, outdir, png=True):
    """Writes the plots into outdir; returns the paths written."""
    import os
    written = []
    charts = [("latency", "alloc+free pair latency (median)", latency_panels(results), "size",
               "us per pair", human_size),
              ("churn", "multi-threaded churn throughput", churn_panels(results), "host threads",
               "pairs/s (all threads)", str)]
    for stem, title, panels, xlabel, ylabel, xfmt in charts:
        if not panels:
            continue
        svg = os.path.join(outdir, stem + ".svg")
        if write_svg(svg, title, panels, xlabel, ylabel, xfmt):
            written.append(svg)
        pngp = os.path.join(outdir, stem + ".png")
        if png and write_png(pngp, title, panels, xlabel, ylabel, xfmt):
            written.append(pngp)
    return written
